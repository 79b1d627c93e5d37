"""Cost of one target forward over T new tokens at a given context, relative to T = 1.

This ratio decides how much speculation can pay: verifying K drafts costs
forward(K + 1) where plain decoding pays forward(1) per token.
"""

from __future__ import annotations

import argparse

import torch

from specdec.cli_options import threads_argument, use_threads
from specdec.models.forward_timing import interleaved_forward_costs
from specdec.models.sources.loading import load_model

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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--runtimes", default="packed,int8,int4,int7,torch,transformers",
                        help="comma-separated: " + ", ".join(RUNTIMES))
    parser.add_argument("--sizes", default="1,2,4,8,16", help="comma-separated numbers of new tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (the float runtimes)")
    parser.add_argument("--interleave", action="store_true",
                        help="load a model's runtimes together and time them in turns (ratios between runtimes "
                        "then hold on a machine whose speed drifts; needs the memory of all of them at once)")
    parser.add_argument("--threads", type=threads_argument, default=None,
                        help="CPU threads (default: torch's, the cores)")
    args = parser.parse_args(argv)
    use_threads(args.threads)
    sizes = tuple(int(n) for n in args.sizes.split(","))
    print(f"forward over T new tokens at a {args.context}-token context, {args.device}, {args.dtype}, "
          f"{torch.get_num_threads()} threads: median ms (ratio to T=1)\n")
    print("| model | runtime | " + " | ".join(f"T={n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    runtimes = args.runtimes.split(",")
    groups = [runtimes] if args.interleave else [[runtime] for runtime in runtimes]
    for name in args.models:
        for group in groups:
            models = {RUNTIMES[runtime][0]: load_model(name, device=args.device, dtype=args.dtype,
                                                       **RUNTIMES[runtime][1]).model for runtime in group}
            for label, costs in interleaved_forward_costs(models, args.context, sizes, args.repeats).items():
                cells = " | ".join(f"{c.seconds * 1e3:.{0 if c.seconds >= 0.01 else 2}f} ({c.ratio:.2f}x)" for c in costs)
                print(f"| {name} | {label} | {cells} |", flush=True)
            del models


if __name__ == "__main__":
    main()
