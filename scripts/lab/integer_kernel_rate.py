"""Multiply-adds a second of the int4 integer kernel on one 8960 x 1536 matrix (the 1.5B's gate/up size), for
1, 2, 4 and 8 rows: compare with the vpmaddubsw ceiling (scripts/lab/maddubs_rate.cpp; docs/notes/benchmarks-diary-2026.md 16).

    python scripts/lab/integer_kernel_rate.py [THREADS]
"""

import sys
import time

import torch

from specdec.kernels import integer_matmul, quantize_grouped


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    out_features, in_features = 8960, 1536
    packed, scales = quantize_grouped(torch.randn(out_features, in_features), 32, 4)
    for rows in (1, 2, 4, 8):
        x = torch.randn(rows, in_features)
        for _ in range(3):
            integer_matmul(x, packed, scales, out_features)
        times = []
        for _ in range(15):
            start = time.perf_counter()
            integer_matmul(x, packed, scales, out_features)
            times.append(time.perf_counter() - start)
        median = sorted(times)[len(times) // 2]
        rate = out_features * in_features * rows / median / 1e9
        print(f"rows {rows}: {median * 1e3:.2f} ms, {rate:.1f} G multiply-adds/s on {threads} thread(s)")


if __name__ == "__main__":
    main()
