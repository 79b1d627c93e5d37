"""What a decoding step and a verification pass cost deep in a context: the target's own forward of 1 row and
of 8 rows after `depth` cached tokens, for each depth and KV cache type, interleaved in one process (medians,
ms), with each depth's step against the step at the first depth and the 8-row pass against its own depth's step.

The cached keys and values are random numbers written once per depth (a real prompt's would cost the same
bytes and arithmetic; a cache of untouched zero pages would read as one page from L1).

    python scripts/lab/context_depth.py                      # Qwen2.5-Coder-1.5B GGUF, depths 0 4096 16384
    python scripts/lab/context_depth.py --model smollm2-135m-instruct --depths 0 2048
    python scripts/lab/context_depth.py --kv-dtypes float32 bfloat16 float16 --prefill 512   # + 512 prompt rows
"""

import argparse
import platform
import time

import torch

from specdec.models.base import positions_after
from specdec.models.sources.loading import DTYPES, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--weights", default="gguf")
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4096, 16384])
    parser.add_argument("--rows", type=int, default=8, help="rows of the verification pass")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--kv-dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    parser.add_argument("--prefill", type=int, default=0, help="also time this many prompt rows at each depth")
    args = parser.parse_args()
    model = load_model(args.model, weights=args.weights).model
    generator = torch.Generator().manual_seed(0)
    caches = {}
    for kv_dtype in args.kv_dtypes:
        model.kv_dtype = DTYPES[kv_dtype]
        for depth in args.depths:
            caches[kv_dtype, depth] = cache = model.new_cache(1, depth + max(args.rows, args.prefill))
            for storage in (cache.keys, cache.values):
                storage.copy_(torch.randn(storage.shape, generator=generator))
    sizes = (1, args.rows, args.prefill) if args.prefill else (1, args.rows)
    times: dict[tuple, list[float]] = {(*key, t): [] for key in caches for t in sizes}
    for _ in range(args.reps):
        for (kv_dtype, depth), cache in caches.items():
            for rows in sizes:
                cache.length = depth
                tokens = torch.zeros(1, rows, dtype=torch.long)
                start = time.perf_counter()
                with torch.no_grad():
                    model.forward(tokens, positions_after(depth, rows, 1, tokens.device), cache)
                times[kv_dtype, depth, rows].append(time.perf_counter() - start)
    median = {key: sorted(values)[len(values) // 2] * 1e3 for key, values in times.items()}
    first = args.depths[0]
    print(f"{args.model} ({args.weights}), {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    prefill = f" prefill of {args.prefill}, tokens/s |" if args.prefill else ""
    print(f"| KV cache | depth | step ms | tokens/s | step / depth {first}'s | {args.rows}-row pass ms | pass / step |"
          + prefill)
    print("|---|---|---|---|---|---|---|" + ("---|" if prefill else ""))
    for kv_dtype, depth in caches:
        step, passed = median[kv_dtype, depth, 1], median[kv_dtype, depth, args.rows]
        row = (f"| {kv_dtype} | {depth} | {step:.1f} | {1e3 / step:.1f} | {step / median[kv_dtype, first, 1]:.2f}x | "
               f"{passed:.1f} | {passed / step:.2f}x |")
        print(row + (f" {args.prefill / median[kv_dtype, depth, args.prefill] * 1e3:.1f} |" if prefill else ""))


if __name__ == "__main__":
    main()
