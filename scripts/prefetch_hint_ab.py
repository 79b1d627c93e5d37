"""The target's forward at T new rows (300-slot context) with the integer kernels' prefetches filling L1
against filling L2 (SPECDEC_PREFETCH_TO_L2, integer_blocks.h), interleaved in one process; the two builds
differ only in that hint, so their outputs are bit-identical.

    python scripts/prefetch_hint_ab.py [MODEL]   # default qwen2.5-coder-1.5b-instruct, on its GGUF blocks
"""

import sys
import time

import torch

from specdec import kernels
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
    base = [flag for flag in kernels.default_builds()[0] if flag != "-DSPECDEC_PREFETCH_TO_L2"]
    builds = {"L1": kernels.build_kernel(tuple(base)),
              "L2": kernels.build_kernel(tuple(base + ["-DSPECDEC_PREFETCH_TO_L2"]))}
    model = load_model(name, weights="gguf").model
    context = 300
    for rows in (1, 4, 8):
        times: dict[str, list[float]] = {hint: [] for hint in builds}
        for _ in range(8):
            for hint, library in builds.items():
                with kernels.using_kernel(library):
                    cache = model.new_cache(1, context + rows + 1)
                    cache.length = context  # attend to 300 zero-filled slots
                    tokens = torch.zeros(1, rows, dtype=torch.long)  # (1, T)
                    start = time.perf_counter()
                    with torch.no_grad():
                        model.forward(tokens, positions_after(context, rows, 1, tokens.device), cache)
                    times[hint].append(time.perf_counter() - start)
        median = {hint: sorted(values)[len(values) // 2] * 1e3 for hint, values in times.items()}
        print(f"T={rows}: L1 {median['L1']:.1f} ms, L2 {median['L2']:.1f} ms, "
              f"L2 speed {median['L1'] / median['L2']:.3f}x", flush=True)


if __name__ == "__main__":
    main()
