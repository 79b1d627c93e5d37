"""A new user's first command, warm, against llama.cpp's: wall time and peak memory of the whole process,
interleaved, one run; and how fast a bad option is refused.

    SPECDEC_LLAMA_CPP=BIN_DIR python scripts/startup_bench.py [--repeats 3] [--tokens 64]

Rows: `specdec generate PROMPT --max-new-tokens N` (the default drafter), the same with `--drafter ngram`,
`llama-completion` on the target's GGUF, and `llama-speculative-simple` with the default draft's GGUF
(`--spec-type draft-simple`). Peak memory is GNU time's maximum resident set size. Prints markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Write a Python function that reverses a string."
BAD_OPTIONS = [["--max-new-tokens", "0"], ["--k", "1000"], ["--seed", str(10 ** 30)], ["--stop", ""],
               ["--device", "cuda:7"], ["--temperature", "-1"]]


def timed(command: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak resident MB, exit code) of a command run under GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", report.name, *command], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        peak_kb = int(report.read().strip().splitlines()[-1])
    return wall, peak_kb / 1024, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    from specdec.bench.llama_cpp import find_program, gguf_file
    from specdec.bench.runner import zoo_draft
    from specdec.models.sources.loading import load_model

    draft = zoo_draft(load_model(args.target, weights="auto"))
    specdec = [str(Path(sys.executable).with_name("specdec")), "generate", PROMPT, "--target", args.target,
               "--max-new-tokens", str(args.tokens)]
    common = ["-m", str(gguf_file(args.target)), "-p", PROMPT, "-n", str(args.tokens), "-t", "2", "--temp", "0",
              "-c", "4096"]
    commands = {
        "specdec generate (auto drafter)": specdec,
        "specdec generate --drafter ngram": specdec + ["--drafter", "ngram"],
        "llama-completion": [str(find_program("llama-completion")), *common, "-no-cnv"],
        f"llama-speculative-simple (draft {draft})": [str(find_program("llama-speculative-simple")), *common,
                                                      "-md", str(gguf_file(draft)), "--spec-type", "draft-simple"],
    }
    for command in commands.values():  # warm: caches written, files in the page cache
        timed(command)
    walls: dict[str, list[float]] = {name: [] for name in commands}
    peaks: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            wall, peak, code = timed(command)
            if code != 0:
                raise SystemExit(f"{name} failed ({code})")
            walls[name].append(wall)
            peaks[name].append(peak)
    print(f"| command ({args.tokens} new tokens, warm) | wall s (median of {args.repeats}) | range | peak RSS MB |")
    print("|---|---|---|---|")
    for name in commands:
        print(f"| {name} | {statistics.median(walls[name]):.2f} | {min(walls[name]):.2f}-{max(walls[name]):.2f} | "
              f"{statistics.median(peaks[name]):.0f} |")
    print()
    print("| bad option | exit code | seconds |")
    print("|---|---|---|")
    for option in BAD_OPTIONS:
        wall, _, code = timed(specdec + option)
        print(f"| `{' '.join(option) if option[1] else option[0] + ' ' + repr('')}` | {code} | {wall:.2f} |")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
