"""Per-layer cost of a mixture-of-experts model's step and 4-row pass, ours against llama.cpp, alternated.

    python scripts/lab/moe_layer_costs.py 2l.gguf 4l.gguf --llama-bench PATH/llama-bench [--rounds 3]

The two files are one shape at 2 and 4 layers (scripts/moe_shape_file.py); per layer = (4 layers - 2 layers)
/ 2, which removes the embeddings, head and fixed costs. Each round times ours (interleaved_forward_costs of
both files on their own blocks, context 64, 15 repeats), then llama.cpp (`llama-bench -t 2 -p 4 -n 32 -r 5`:
tg32 for its step, pp4 for 4 rows), so the machine's drift falls on both alike; every round is printed, then
the medians.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess


def ours(small: str, large: str) -> tuple[float, float]:
    from specdec.models.forward_timing import interleaved_forward_costs
    from specdec.models.sources.loading import load_model

    models = {path: load_model(path, weights="gguf").model for path in (small, large)}
    costs = interleaved_forward_costs(models, context=64, sizes=(1, 4), repeats=15)
    step, four = ((b.seconds - a.seconds) / 2 * 1e3 for a, b in zip(costs[small], costs[large]))
    return step, four


def llama_cpp(bench: str, small: str, large: str) -> tuple[float, float]:
    def run(path: str) -> dict[str, float]:  # test name -> mean ns
        out = subprocess.run([bench, "-m", path, "-t", "2", "-p", "4", "-n", "32", "-r", "5", "-o", "csv"],
                             capture_output=True, text=True, check=True).stdout
        rows = list(csv.DictReader(io.StringIO(out)))
        return {("tg" if int(r["n_gen"]) else "pp"): float(r["avg_ns"]) for r in rows}

    a, b = run(small), run(large)
    return (b["tg"] - a["tg"]) / 32 / 2e6, (b["pp"] - a["pp"]) / 2e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("small")
    parser.add_argument("large")
    parser.add_argument("--llama-bench", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = {"ours": [], "llama.cpp": []}
    for round_ in range(args.rounds):
        results["ours"].append(ours(args.small, args.large))
        results["llama.cpp"].append(llama_cpp(args.llama_bench, args.small, args.large))
        print(f"round {round_ + 1}: " + ", ".join(f"{name} step {r[-1][0]:.2f} ms, 4 rows {r[-1][1]:.2f} ms"
                                                  for name, r in results.items()), flush=True)
    for name, rows in results.items():
        print(f"{name}: median step {statistics.median(r[0] for r in rows):.2f} ms a layer, "
              f"4 rows {statistics.median(r[1] for r in rows):.2f} ms")


if __name__ == "__main__":
    main()
