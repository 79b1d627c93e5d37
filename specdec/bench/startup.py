"""Where a warm start's seconds go: `python -m specdec.bench.startup [TARGET] [--drafter SPEC]`.

Runs what `specdec generate` runs before its first token, in a fresh process, under cProfile, and prints
the seconds of each phase: importing specdec (torch, transformers' tokenizer classes), the target's
config, weights and tokenizer, the kernels, the drafter (its own model, where it has one), and the first
forward. "Warm" means the models were pulled and their packed caches written by an earlier run: run it
twice and read the second.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import sys
import time

from specdec.api.generator import SpeculativeGenerator, auto_drafter
from specdec.drafters import DrafterChoice, make_drafter
from specdec.models.sources.loading import load_model
from specdec.models.sources.zoo import DEFAULT_MODEL

# phase -> the functions whose cumulative time makes it up (module path suffix, function name)
PHASES = {
    "config": [("sources/checkpoint.py", "read_config"), ("sources/loading.py", "auto_weights")],
    "weights": [("sources/native_load.py", "load_native_packed"), ("sources/native_load.py", "load_native_gguf"),
                ("sources/native_load.py", "load_native")],
    "tokenizer": [("sources/tokenizer_files.py", "load_tokenizer")],
    "kernels": [("kernels/build.py", "default_kernel")],
}


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Seconds spent in calls of a function (the outermost calls: recursion is not counted twice)."""
    return sum(entry[3] for (path, _, function), entry in stats.stats.items()
               if path.endswith(suffix) and function == name)


def phases(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile)
    return {phase: sum(cumulative(stats, *where) for where in functions) for phase, functions in PHASES.items()}


def _child_seconds(code: str) -> float:
    """Wall seconds of `python -c code` in a fresh interpreter."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default=None, help="default: the zoo's default model")
    parser.add_argument("--drafter", default="auto")
    args = parser.parse_args(argv)

    # Run as `python -m specdec.bench.startup`, this process imported the specdec package before main():
    # the import row is timed in a fresh interpreter instead (less the interpreter's own start).
    import_seconds = _child_seconds("import specdec.cli") - _child_seconds("pass")
    import specdec.cli  # noqa: F401  what the command imports before it parses its options
    imported = time.perf_counter()
    profiles = {"target": cProfile.Profile(), "drafter": cProfile.Profile()}
    with profiles["target"]:
        target = load_model(args.target or DEFAULT_MODEL, weights="auto")
    target_loaded = time.perf_counter()
    with profiles["drafter"]:
        choice = DrafterChoice.parse(args.drafter)
        spec = auto_drafter(target, "cpu", "float32") if choice.default else choice
        drafter = make_drafter(spec, target, "cpu", "float32")
    drafter_loaded = time.perf_counter()
    SpeculativeGenerator(target, drafter, "auto").generate("Hi", max_new_tokens=1)
    done = time.perf_counter()

    rows = [("import specdec (torch, transformers), fresh process", import_seconds)]
    for part, (begin, end) in {"target": (imported, target_loaded), "drafter": (target_loaded, drafter_loaded)}.items():
        seconds = phases(profiles[part])
        name = part if part == "target" else f"drafter {spec}"
        rows += [(f"{name}: {phase}", value) for phase, value in seconds.items() if value > 0.005]
        rows.append((f"{name}: other", end - begin - sum(seconds.values())))
    rows += [("first forward and token", done - drafter_loaded),
             ("total", import_seconds + done - imported)]
    width = max(len(name) for name, _ in rows)
    for name, seconds in rows:
        print(f"{name:{width}}  {seconds:7.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
