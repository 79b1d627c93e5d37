"""The AVX2 build of the CPU kernels against the AVX-512 build, interleaved in one process (docs/notes/benchmarks-diary-2026.md
section 19). Needs a CPU with AVX512-VNNI.

    python scripts/lab/kernel_builds_ab.py integer   # int4/int7 and GGUF blocks, 8960 x 1536, one thread
    python scripts/lab/kernel_builds_ab.py float32   # float32 panels, 17920 x 1536 (streamed from memory), two threads
"""

import sys
import time

import torch

sys.path.insert(0, "tests")

from specdec import kernels  # noqa: E402
from specdec.kernels import (AVX512_FLAGS, FLAGS, build_kernel, integer_matmul, pack_weight,  # noqa: E402
                             packed_matmul, quantize_grouped)

BUILDS = {"avx2": build_kernel(tuple(FLAGS)), "avx512": build_kernel(tuple(FLAGS + AVX512_FLAGS))}


def median_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def compare(name: str, make_call, rows_list, macs_per_row: int) -> None:
    for rows in rows_list:
        call = make_call(rows)
        best = {}
        for _ in range(3):  # interleaved rounds; the best median of each build
            for build, library in BUILDS.items():
                with kernels.using_kernel(library):
                    best[build] = min(best.get(build, 1e9), median_seconds(call, 9))
        print(f"{name:8s} rows {rows:3d}: avx2 {best['avx2'] * 1e3:6.2f} ms, avx512 {best['avx512'] * 1e3:6.2f} ms "
              f"({best['avx2'] / best['avx512']:.2f}x), {macs_per_row * rows / best['avx512'] / 1e9:.0f} G multiply-adds/s",
              flush=True)


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "integer"
    torch.manual_seed(0)
    if which == "integer":
        from specdec.models.quantized.gguf_blocks import decode
        from specdec.models.quantized.gguf_linear import GgufLinear
        from test_gguf_blocks import blocks_of

        torch.set_num_threads(1)
        out_features, in_features = 8960, 1536
        for bits in (4, 7):
            packed, scales = quantize_grouped(torch.randn(out_features, in_features), 32, bits)
            compare(f"int{bits}", lambda rows, p=packed, s=scales: (
                lambda x=torch.randn(rows, in_features): integer_matmul(x, p, s, out_features)),
                (1, 2, 8), out_features * in_features)
        for block_format in ("Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0"):
            layer = GgufLinear(decode(blocks_of(block_format, out_features, in_features, 1), block_format, out_features,
                                      in_features), None, [out_features])
            compare(block_format, lambda rows, layer=layer: (lambda x=torch.randn(rows, in_features): layer(x)),
                    (1, 2, 8), out_features * in_features)
    else:
        torch.set_num_threads(2)
        out_features, in_features = 17920, 1536
        panels = [pack_weight(torch.randn(out_features, in_features)) for _ in range(3)]  # 3 x 110 MB: no cache hits
        turn = [0]

        def make_call(rows):
            x = torch.randn(rows, in_features)

            def call():
                turn[0] += 1
                packed_matmul(x, panels[turn[0] % 3], out_features)
            return call

        compare("float32", make_call, (1, 2, 4, 5, 8, 9, 12, 16, 64, 300), out_features * in_features)


if __name__ == "__main__":
    main()
