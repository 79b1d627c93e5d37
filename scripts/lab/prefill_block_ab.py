"""512 prompt rows after `--depths` random cached tokens, prefill blocks through the block kernel
(llama.CausalBlock, kernels/block_attention.cpp) against torch's grouped SDPA (the path before it, switched
back in by patching CausalBlock.applies), interleaved in one process, medians: only such ratios mean anything
on a shared machine.

    python scripts/lab/prefill_block_ab.py --depths 4096 16384 --kv-dtypes float32 bfloat16
"""

import argparse
import statistics
import time

import torch

import specdec.models.llama as llama
from specdec.models.base import positions_after
from specdec.models.sources.loading import DTYPES, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--depths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--kv-dtypes", nargs="+", default=["float32"], choices=list(DTYPES))
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    model = load_model(args.model, weights="gguf").model
    paths = {"block kernel": llama.CausalBlock.applies, "torch SDPA": staticmethod(lambda x, head_dim: False)}
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 1000, (1, args.rows), generator=generator)
    for kv_dtype in args.kv_dtypes:
        model.kv_dtype = DTYPES[kv_dtype]
        for depth in args.depths:
            cache = model.new_cache(1, depth + args.rows)
            for storage in (cache.keys, cache.values):
                storage.copy_(torch.randn(storage.shape, generator=generator))
            times: dict[str, list[float]] = {name: [] for name in paths}
            for rep in range(args.reps):  # alternate which goes first
                for name in (list(paths) if rep % 2 == 0 else list(paths)[::-1]):
                    llama.CausalBlock.applies = paths[name]
                    cache.length = depth
                    start = time.perf_counter()
                    model.forward(tokens, positions_after(depth, args.rows, 1, "cpu"), cache, last_logits_only=True)
                    times[name].append(time.perf_counter() - start)
            llama.CausalBlock.applies = paths["block kernel"]
            rates = {name: args.rows / statistics.median(values) for name, values in times.items()}
            print(f"{kv_dtype} cache, {depth} deep: " + ", ".join(f"{name} {rate:.1f} tokens/s" for name, rate in rates.items())
                  + f": {rates['block kernel'] / rates['torch SDPA']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
