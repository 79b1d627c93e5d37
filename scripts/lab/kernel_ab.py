"""Interleaved A/B of two builds of the CPU kernels: the sources in specdec/kernels against a variant copy
of them in another directory (edit the copy, keep the file names). Both builds multiply the same matrices
the same number of times, alternating, in one process, and must agree bit for bit: on this shared machine
only such ratios mean anything (docs/notes/benchmarks-diary-2026.md sections 20-21).

    cp -r specdec/kernels /tmp/variant   # then edit /tmp/variant/*.cpp
    python scripts/lab/kernel_ab.py /tmp/variant --format int4 --rows 1
    python scripts/lab/kernel_ab.py /tmp/variant --format gguf --rows 8 --threads 2
    python scripts/lab/kernel_ab.py /tmp/variant --format attention --depth 16384 --kv-dtype bfloat16 --rows 1

int4 / int7 / float32: 18 random matrices of the 1.5B's shapes (8960 x 1536, 1536 x 8960, 2048 x 1536), 166 MB
in int4: more than the last-level cache, so the weights stream from memory. gguf: the 1.5B's own GGUF blocks
(layers, then the LM head). --cache repeats one matrix instead (compute-bound). attention: `attention_rows`
over 28 random layer caches of the 1.5B's attention (12 query heads on 2 KV heads of 128), `--depth` cached
tokens each, then --rows chained new rows.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

import specdec.kernels as kernels
from specdec.kernels import GGUF_LAYOUTS, pack_weight, quantize_grouped

SHAPES = [(8960, 1536), (1536, 8960), (2048, 1536)]


def build_both(variant: Path):
    """(committed build, variant build) with this CPU's flags."""
    flags = kernels.default_builds()[0]
    return kernels.build_kernel(flags), kernels.build_kernel(flags, variant)


def random_matrix_calls(weights: str, rows: int, threads: int, cache: bool) -> list:
    """Calls lib -> output over random float32 (packed panels) or int4/int7 matrices."""
    calls = []
    for index in range(1 if cache else 18):
        out_features, in_features = SHAPES[index % len(SHAPES)]
        weight, x = torch.randn(out_features, in_features), torch.randn(rows, in_features)
        if weights == "float32":
            panels = pack_weight(weight)

            def call(lib, panels=panels, x=x, n=out_features, k=in_features):
                y = torch.empty(rows, n)
                lib.packed_matmul_f32(x.data_ptr(), panels.data_ptr(), y.data_ptr(), rows, k, n, threads)
                return y
        else:
            packed, scales = quantize_grouped(weight, 32, int(weights[3]))

            def call(lib, packed=packed, scales=scales, x=x, n=out_features, k=in_features):
                y = torch.empty(rows, n)
                kernel = lib.int4_matmul if weights == "int4" else lib.int7_matmul
                kernel(x.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), rows, k, n,
                       k // scales.shape[1], threads)
                return y
        calls.append(call)
    return calls * (20 if cache else 1)


def gguf_calls(rows: int, threads: int, cache: bool) -> dict[str, list]:
    """Label -> calls over the 1.5B's GGUF blocks (pulls the model if needed)."""
    from specdec.models.quantized.gguf_linear import GgufLinear
    from specdec.models.sources.checkpoint import read_config
    from specdec.models.sources.native_load import load_native_gguf
    from specdec.models.sources.zoo import ensure_pulled

    name = "qwen2.5-coder-1.5b-instruct"
    path = ensure_pulled(name)  # the Hugging Face directory of the zoo model
    layers = [(n, m) for n, m in load_native_gguf(name, path, read_config(path)).named_modules()
              if isinstance(m, GgufLinear)]

    def call_for(module):
        x = torch.randn(rows, module.in_features)

        def call(lib):
            y = torch.empty(rows, module.out_features)
            form = module.block_form
            lib.gguf_matmul(x.data_ptr(), module.packed.data_ptr(), module.scales.data_ptr(),
                            module.super_scales.data_ptr(), y.data_ptr(), rows, module.in_features,
                            module.out_features, GGUF_LAYOUTS[form["layout"]], form["group"], form["super_group"],
                            threads)
            return y
        return call
    if cache:
        first = next(m for n, m in layers if "gate_up" in n)
        return {"gate_up, cached": [call_for(first)] * 20}
    return {"layers": [call_for(m) for n, m in layers if "lm_head" not in n],
            "LM head": [call_for(m) for n, m in layers if "lm_head" in n]}


def attention_calls(depth: int, rows: int, kv_dtype: str, cache: bool) -> list:
    """Calls lib -> attention output over 28 layer caches of the 1.5B's attention shape (one, with --cache)."""
    from specdec.kernels import attention_rows

    heads, kv_heads, dim = 12, 2, 128
    q = torch.randn(1, heads, rows, dim)
    visible = torch.ones(rows, rows, dtype=torch.uint8).tril()  # a chain of drafted rows
    calls = []
    for _ in range(1 if cache else 28):
        keys, values = (torch.randn(1, kv_heads, depth + rows, dim).to(getattr(torch, kv_dtype)) for _ in range(2))

        def call(lib, keys=keys, values=values):
            with kernels.using_kernel(lib):
                return attention_rows(q, keys, values, visible, depth)
        calls.append(call)
    return calls * (28 if cache else 1)


def race(label: str, calls: list, committed, variant, reps: int) -> None:
    first = [call(committed) for call in calls]
    second = [call(variant) for call in calls]
    if not all(torch.equal(a, b) for a, b in zip(first, second)):
        raise SystemExit(f"{label}: the variant's results differ from the committed build's")
    times = {"committed": [], "variant": []}
    for rep in range(reps):  # alternate which goes first
        for which in (("committed", "variant") if rep % 2 else ("variant", "committed")):
            lib = committed if which == "committed" else variant
            start = time.perf_counter()
            for call in calls:
                call(lib)
            times[which].append(time.perf_counter() - start)
    a, b = statistics.median(times["committed"]), statistics.median(times["variant"])
    print(f"{label}: committed {a * 1e3:.2f} ms, variant {b * 1e3:.2f} ms, variant speed {a / b:.3f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", type=Path, help="a directory holding edited copies of specdec/kernels' sources")
    parser.add_argument("--format", choices=["float32", "int4", "int7", "gguf", "attention"], default="int4")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--cache", action="store_true", help="one matrix over and over (from cache)")
    parser.add_argument("--depth", type=int, default=4096, help="attention: cached tokens before the rows")
    parser.add_argument("--kv-dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args()
    torch.manual_seed(0)
    committed, variant = build_both(args.variant)
    torch.set_num_threads(args.threads)  # the attention wrapper passes torch's thread count
    if args.format == "gguf":
        sets = gguf_calls(args.rows, args.threads, args.cache)
    elif args.format == "attention":
        sets = {f"attention at {args.depth}, {args.kv_dtype}": attention_calls(args.depth, args.rows, args.kv_dtype,
                                                                              args.cache)}
    else:
        sets = {args.format: random_matrix_calls(args.format, args.rows, args.threads, args.cache)}
    for label, calls in sets.items():
        race(f"{label}, {args.rows} row(s), {args.threads} thread(s)", calls, committed, variant, args.reps)


if __name__ == "__main__":
    main()
