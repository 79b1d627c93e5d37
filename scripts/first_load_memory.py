"""Peak memory and time of loading GGUF files: the first load (config and tokenizer converted, blocks packed
into the packed-weight cache), a first load of a file already converted (packing only), and a warm load.

    python scripts/first_load_memory.py [FILE.gguf ...] [--source-tree DIR]

Each load is a fresh process (`load_model(FILE, weights="auto")`) under GNU time, in a temporary
SPECDEC_HOME that shares the real home's compiled kernels (compiling them is not loading). Peak is the whole
process's maximum resident set size, so it includes the interpreter with torch and transformers imported
(the "baseline" row: a process that imports them and loads nothing). `--source-tree DIR` runs the loads on
another checkout (e.g. a `git worktree` of an older commit) for a before/after pair. Prints markdown.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script's timer
from startup_bench import timed  # noqa: E402

IMPORTS = "import torch, transformers, specdec.models.sources.loading"


def load_command(tree: Path, gguf: Path | None) -> list[str]:
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); {IMPORTS}"
    if gguf is not None:
        code += f"; specdec.models.sources.loading.load_model({str(gguf)!r}, weights='auto')"
    return [sys.executable, "-c", code]


def measure(tree: Path, gguf: Path, home: Path) -> dict[str, tuple[float, float]]:
    """Stage -> (wall s, peak MB) for one file, starting from an empty home (but for its kernels)."""
    for name in ("converted", "packed"):
        shutil.rmtree(home / name, ignore_errors=True)
    stages = {}
    for stage in ("first load", "first load, converted", "warm load"):
        if stage == "first load, converted":
            shutil.rmtree(home / "packed", ignore_errors=True)
        wall, peak, code = timed(load_command(tree, gguf))
        if code != 0:
            raise SystemExit(f"loading {gguf} failed ({code})")
        stages[stage] = (wall, peak)
    return stages


def main() -> None:
    from specdec.models.sources import zoo
    from specdec.paths import specdec_home

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="GGUF files (default: the zoo's files at hand)")
    parser.add_argument("--source-tree", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    files = args.files or sorted(p for name in zoo.REGISTRY for p in zoo.model_dir(name).glob("*.gguf"))
    with tempfile.TemporaryDirectory() as home:
        home = Path(home)
        (home / "kernels").symlink_to(specdec_home() / "kernels")
        os.environ["SPECDEC_HOME"] = str(home)
        _, baseline, _ = timed(load_command(args.source_tree, None))
        print(f"Source tree {args.source_tree}; baseline (imports only): {baseline:.0f} MB\n")
        print("| file | file MB | load | wall s | peak RSS MB | peak / file | (peak - baseline) / file |")
        print("|---|---|---|---|---|---|---|")
        for gguf in files:
            size = gguf.stat().st_size / 2**20
            for stage, (wall, peak) in measure(args.source_tree, gguf, home).items():
                print(f"| {gguf.name} | {size:.0f} | {stage} | {wall:.1f} | {peak:.0f} | {peak / size:.2f}x | "
                      f"{(peak - baseline) / size:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
