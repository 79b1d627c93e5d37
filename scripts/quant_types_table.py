"""One row per GGUF file: bits per weight, our plain decoding vs llama.cpp's on the same file, our
forward(8)/forward(1), and whether speculation (the default drafter) equals plain decoding (greedy).

    python scripts/quant_types_table.py FILE.gguf... [--llama-cpp BIN_DIR] [--tokens 128]

Ours: `SpeculativeGenerator` without a drafter, 128 new tokens after a code prompt (its tokens/s after the
prefill, as llama-bench's tg). llama.cpp: `llama-bench -t 2 -p 0 -n 128` (tg128) and `-p 8` (pp8, a batch
of 8 tokens). Each file is measured ours then llama.cpp's, back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch

PROMPT = "Write a Python function that merges two sorted lists into one sorted list, with a docstring and tests."


def llama_bench(binary: Path, path: Path, tokens: int) -> tuple[float, float, float]:
    """llama.cpp's tg (tokens/s), pp8 and pp1 milliseconds per batch on this file, 2 threads."""
    done = subprocess.run([str(binary), "-m", str(path), "-t", "2", "-p", "1,8", "-n", str(tokens), "-o", "json",
                           "-r", "3"], capture_output=True, text=True, check=True)
    rows = json.loads(done.stdout)
    tg = next(r for r in rows if r["n_gen"] == tokens)["avg_ts"]
    pp = {r["n_prompt"]: 1e3 * r["n_prompt"] / r["avg_ts"] for r in rows if r["n_gen"] == 0}
    return tg, pp[8], pp[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--llama-cpp", default=os.environ.get("SPECDEC_LLAMA_CPP"))
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    from specdec.api.generator import SpeculativeGenerator, auto_drafter
    from specdec.models.forward_timing import forward_costs
    from specdec.drafters import make_drafter
    from specdec.models.sources.gguf_file import GgufFile
    from specdec.models.sources.loading import load_model

    print("| file | types | bits/weight | ours plain tok/s | llama.cpp tg tok/s | ours / llama.cpp | "
          "ours forward(8)/forward(1) | llama.cpp pp8/pp1 | speculation = plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.files:
        path = Path(name)
        index = GgufFile(path)
        matrices = [t for t in index.tensors if len(t.shape) == 2]
        counts: dict[str, int] = {}
        for tensor in matrices:
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items(), key=lambda item: -item[1]))
        bits = 8 * sum(t.n_bytes for t in matrices) / sum(t.shape[0] * t.shape[1] for t in matrices)
        target = load_model(str(path), weights="auto")
        plain = SpeculativeGenerator(target, None)
        plain.generate(PROMPT, 8)  # warm
        result = plain.generate(PROMPT, args.tokens)
        ours = result.stats.new_tokens / (result.stats.seconds - result.stats.prefill_seconds)
        costs = forward_costs(target.model, sizes=(1, 8), repeats=6)
        spec = auto_drafter(target, "cpu", "float32")
        speculative = SpeculativeGenerator(target, make_drafter(spec, target, "cpu", "float32"), "auto")
        same = speculative.generate(PROMPT, args.tokens).token_ids == result.token_ids
        tg = pp8 = pp1 = float("nan")
        if args.llama_cpp:
            tg, pp8, pp1 = llama_bench(Path(args.llama_cpp) / "llama-bench", path, args.tokens)
        print(f"| {path.name} | {kinds} | {bits:.2f} | {ours:.1f} | {tg:.1f} | {ours / tg:.2f}x | "
              f"{costs[1].ratio:.2f}x | {pp8 / pp1:.2f}x | {'yes' if same else 'NO'} ({spec}) |", flush=True)
        del target, plain, speculative
        time.sleep(1)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
