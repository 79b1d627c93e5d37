"""The target's whole forward at T new rows (300-slot context) on two builds of the CPU kernels, interleaved
in one process (over `--context` cached slots of random keys and values): the committed sources against a variant copy of them (`--variant DIR`, as
scripts/lab/kernel_ab.py), or the committed build with and without one compiler flag (`--flag`). Both builds
must compute the same bits; only such interleaved ratios mean anything on a shared machine.

    cp -r specdec/kernels /tmp/variant   # then edit /tmp/variant/*.cpp
    python scripts/lab/forward_ab.py --variant /tmp/variant [--model NAME] [--rows 1 4 8]
    python scripts/lab/forward_ab.py --flag -DSPECDEC_PREFETCH_TO_L2   # L1 prefetches against L2 (AMD's default)
    python scripts/lab/forward_ab.py --variant /tmp/variant --context 4096   # deep in a long context
"""

import argparse
import time
from pathlib import Path

import torch

from specdec import kernels
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model


def builds_to_compare(variant: Path | None, flag: str | None) -> dict:
    """{"A": library, "B": library}: A committed (without `flag`), B the variant (or with `flag`)."""
    flags = list(kernels.default_builds()[0])
    if flag is not None:
        without = tuple(f for f in flags if f != flag)
        return {"A": kernels.build_kernel(without), "B": kernels.build_kernel(without + (flag,))}
    return {"A": kernels.build_kernel(tuple(flags)), "B": kernels.build_kernel(tuple(flags), variant)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--variant", type=Path, help="a directory holding edited copies of specdec/kernels' sources")
    source.add_argument("--flag", help="a compiler flag: the committed build without it (A) and with it (B)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--weights", default="gguf")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--context", type=int, default=300, help="cached slots the rows attend to")
    args = parser.parse_args()
    builds = builds_to_compare(args.variant, args.flag)
    model = load_model(args.model, weights=args.weights).model
    context = args.context
    # Random keys and values, written once: a cache of untouched zero pages reads as one page from L1
    cache = model.new_cache(1, context + max(args.rows) + 1)
    generator = torch.Generator().manual_seed(0)
    for storage in (cache.keys, cache.values):
        storage.copy_(torch.randn(storage.shape, generator=generator))
    for rows in args.rows:
        times: dict[str, list[float]] = {label: [] for label in builds}
        outputs: dict[str, torch.Tensor] = {}
        for _ in range(args.reps):
            for label, library in builds.items():
                with kernels.using_kernel(library):
                    cache.length = context
                    tokens = torch.zeros(1, rows, dtype=torch.long)  # (1, T)
                    start = time.perf_counter()
                    positions = positions_after(context, rows, 1, tokens.device)
                    with torch.no_grad():
                        outputs[label] = model.forward(tokens, positions, cache).logits
                    times[label].append(time.perf_counter() - start)
        if not torch.equal(outputs["A"], outputs["B"]):
            raise SystemExit(f"T={rows}: the two builds' outputs differ")
        median = {label: sorted(values)[len(values) // 2] * 1e3 for label, values in times.items()}
        print(f"T={rows}: A {median['A']:.1f} ms, B {median['B']:.1f} ms, B speed {median['A'] / median['B']:.3f}x",
              flush=True)


if __name__ == "__main__":
    main()
