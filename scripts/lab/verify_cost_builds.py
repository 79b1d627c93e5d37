"""Forward over T new tokens against T = 1, with the AVX2 and the AVX-512 builds of the kernels interleaved in
one process, so a noisy machine's drift hits both alike (docs/notes/benchmarks-diary-2026.md section 19). Needs AVX512-VNNI.

    python scripts/lab/verify_cost_builds.py smollm2-135m-instruct 15
"""

import sys
import time

import torch

from specdec import kernels
from specdec.kernels import AVX512_FLAGS, FLAGS, build_kernel
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model

CONTEXT = 300
SIZES = (1, 8, 9, 16)


def main() -> None:
    name, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
    builds = {"avx2": build_kernel(tuple(FLAGS)), "avx512": build_kernel(tuple(FLAGS + AVX512_FLAGS))}
    model = load_model(name).model
    tokens = torch.randint(0, 1000, (1, CONTEXT + max(SIZES)), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(1, CONTEXT + 2 * max(SIZES))
    model.forward(tokens[:, :CONTEXT], positions_after(0, CONTEXT, 1, "cpu"), cache, last_logits_only=True)
    times: dict[tuple[str, int], list[float]] = {(build, size): [] for build in builds for size in SIZES}
    for _ in range(rounds):
        for build, library in builds.items():
            with kernels.using_kernel(library):
                for size in SIZES:
                    start = time.perf_counter()
                    model.forward(tokens[:, CONTEXT:CONTEXT + size], positions_after(CONTEXT, size, 1, "cpu"), cache)
                    times[(build, size)].append(time.perf_counter() - start)
                    cache.truncate(CONTEXT)
    median = {key: sorted(values)[len(values) // 2] * 1e3 for key, values in times.items()}
    for build in builds:
        print(f"{name} {build}: " + " | ".join(f"T={size} {median[(build, size)]:.0f} ms "
                                               f"({median[(build, size)] / median[(build, 1)]:.2f}x)" for size in SIZES))


if __name__ == "__main__":
    main()
