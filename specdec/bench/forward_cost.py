"""Cost of one target forward over T new tokens at a given context, relative to T = 1.

This ratio decides how much speculation can pay: verifying K drafts costs
forward(K + 1) where plain decoding pays forward(1) per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.bench.timing import median_seconds
from specdec.models.base import CausalLM, positions_after


@dataclass
class ForwardCost:
    num_tokens: int
    seconds: float  # median
    ratio: float  # seconds / seconds at 1 token


def forward_costs(model: CausalLM, context: int = 300, sizes=(1, 2, 4, 8, 16), repeats: int = 10) -> list[ForwardCost]:
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.vocab_size, (1, context), generator=gen).to(model.device)
    cache = model.new_cache(1, context + max(sizes))
    model.forward(prefix, positions_after(0, context, 1, model.device), cache, last_logits_only=True)
    rows = []
    for size in sizes:
        tokens = torch.randint(0, model.vocab_size, (1, size), generator=gen).to(model.device)
        positions = positions_after(context, size, 1, model.device)

        def step():
            model.forward(tokens, positions, cache)
            cache.truncate(context)

        rows.append((size, median_seconds(step, repeats, model.device)))
    base = rows[0][1]
    return [ForwardCost(size, seconds, seconds / base) for size, seconds in rows]


RUNTIMES = {
    "packed": ("native, packed kernel, float32", {}),
    "bf16": ("native, packed kernel, bf16 weights", {"weights": "bf16"}),
    "int8": ("native, packed kernel, int8 weights", {"weights": "int8"}),
    "int4": ("native, int4 weights (7-bit head), integer kernel", {"weights": "int4"}),
    "int7": ("native, int7 weights, integer kernel", {"weights": "int7"}),
    "gguf": ("native, the GGUF file's own blocks, integer kernel", {"weights": "gguf"}),
    "torch": ("native, torch matmul", {"kernels": False}),
    "eager": ("native, eager (no CUDA graphs)", {"kernels": False, "cuda_graphs": False}),
    "transformers": ("transformers", {"backend": "transformers"}),
}


def main(argv: list[str] | None = None) -> None:
    """python -m specdec.bench.forward_cost MODEL...: markdown table, packed kernel vs stock torch vs transformers."""
    import argparse

    from specdec.models.sources.loading import load_model

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--runtimes", default="packed,int8,int4,int7,torch,transformers",
                        help="comma-separated: " + ", ".join(RUNTIMES))
    parser.add_argument("--sizes", default="1,2,4,8,16", help="comma-separated numbers of new tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (the float runtimes)")
    args = parser.parse_args(argv)
    sizes = tuple(int(n) for n in args.sizes.split(","))
    print(f"forward over T new tokens at a {args.context}-token context, {args.device}, {args.dtype}: "
          "median ms (ratio to T=1)\n")
    print("| model | runtime | " + " | ".join(f"T={n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for name in args.models:
        for runtime in args.runtimes.split(","):
            label, options = RUNTIMES[runtime]
            loaded = load_model(name, device=args.device, dtype=args.dtype, **options)
            costs = forward_costs(loaded.model, args.context, sizes, args.repeats)
            cells = " | ".join(f"{c.seconds * 1e3:.{0 if c.seconds >= 0.01 else 2}f} ({c.ratio:.2f}x)" for c in costs)
            print(f"| {name} | {label} | {cells} |", flush=True)
            del loaded


if __name__ == "__main__":
    main()
