"""Markdown summary of a bench run: per task and overall, each method against our plain decoding."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from specdec.bench.llama_cpp import BEST_PREFIX
from specdec.bench.plots import plot_speedup_per_task, plot_tokens_per_round
from specdec.bench.roofline import Roofline
from specdec.bench.runner import PLAIN, BenchResults, PromptRun


def rate(runs: list[PromptRun]) -> float:
    """Aggregate tokens/s: all new tokens over all seconds (long answers weigh more, as for a user)."""
    seconds = sum(r.seconds for r in runs)
    return sum(r.new_tokens for r in runs) / seconds if seconds else 0.0


def summarize(results: BenchResults) -> dict[str, dict[str, dict]]:
    """method -> task (and "overall") -> figures."""
    groups: dict[tuple[str, str], list[PromptRun]] = defaultdict(list)
    for run in results.runs:
        groups[(run.method, run.task)].append(run)
        groups[(run.method, "overall")].append(run)
    summary: dict[str, dict[str, dict]] = defaultdict(dict)
    for (method, task), runs in groups.items():
        plain = rate(groups[(PLAIN, task)])
        speculative = [r for r in runs if r.tau is not None]
        matches = [r.matches_plain for r in runs if r.matches_plain is not None]
        longest = max((len(r.acceptance_per_position or []) for r in speculative), default=0)
        per_position = []
        for i in range(longest):
            values = [r.acceptance_per_position[i] for r in speculative if len(r.acceptance_per_position) > i]
            per_position.append(sum(values) / len(values))
        verify = sum(r.verify_seconds or 0 for r in runs)
        draft = sum(r.draft_seconds or 0 for r in runs)
        decode = sum(r.decode_seconds or 0 for r in runs)
        rounds = sum(r.rounds or 0 for r in runs)
        summary[method][task] = {
            "prompts": len(runs),
            "decode_tokens_per_second": sum(r.new_tokens for r in runs) / decode if decode else None,
            "tokens_per_second": rate(runs),
            "speedup": rate(runs) / plain if plain else float("nan"),
            "tau": sum(r.tau for r in speculative) / len(speculative) if speculative else None,
            "acceptance_rate": (sum(r.acceptance_rate for r in speculative) / len(speculative)) if speculative else None,
            "acceptance_per_position": per_position,
            "draft_share": draft / sum(r.seconds for r in runs) if speculative else None,
            "verify_share": verify / sum(r.seconds for r in runs) if verify else None,
            "greedy_matches": f"{sum(matches)}/{len(matches)}" if matches else "",
            # cost per round (speculative methods): rounds are target forwards after prefill
            "draft_ms_per_round": 1e3 * draft / rounds if rounds and speculative else None,
            "verify_ms_per_round": 1e3 * verify / rounds if rounds and speculative else None,
            "drafter_memory_mb": max((r.drafter_memory_bytes or 0 for r in runs), default=0) / 1e6,
        }
    add_best_peer(summary)
    return summary


BEST_PEER = "llama.cpp best"


def add_best_peer(summary: dict[str, dict[str, dict]]) -> None:
    """Where several llama.cpp modes ran: a row with the fastest per task (what a user tuning it would run),
    naming the mode in "best_of"."""
    cpp = [method for method in summary if method.startswith(BEST_PREFIX)]
    if len(cpp) < 2:
        return
    tasks = dict.fromkeys(task for method in cpp for task in summary[method])
    for task in tasks:
        best = max((m for m in cpp if task in summary[m]), key=lambda m: summary[m][task]["tokens_per_second"])
        summary.setdefault(BEST_PEER, {})[task] = {**summary[best][task], "best_of": best}


def markdown(results: BenchResults) -> str:
    summary = summarize(results)
    config = results.config
    tasks = list(dict.fromkeys(r.task for r in results.runs)) + ["overall"]
    lines = [
        f"target `{config.target}` ({config.weights} weights, {config.dtype}, {config.device}), "
        f"temperature {config.sampling.temperature}, max_new_tokens {config.max_new_tokens}, "
        f"K {config.k}, {len({(r.task, r.prompt_id) for r in results.runs})} prompts, "
        f"{results.machine['threads']} threads, torch {results.machine['torch']}",
        *([f"machine: {results.machine['cpu']}, CPU kernels {results.machine['cpu_kernels']}"]
          if "cpu" in results.machine else []),
        *([f"memory: the target's weights {results.memory['target_weights_mb']:.0f} MB as loaded, process peak "
           f"resident {results.memory['peak_rss_mb']:.0f} MB"] if results.memory else []),
        "",
        "tokens/s (speedup over our plain decoding, same run)",
        "",
        "| method | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for method, by_task in summary.items():
        cells = [f"{by_task[t]['tokens_per_second']:.2f} ({by_task[t]['speedup']:.2f}x)"
                 + (f" {by_task[t]['best_of']}" if "best_of" in by_task[t] else "") if t in by_task else "-"
                 for t in tasks]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "speculative details (overall)", "",
              "| method | tau | acceptance | acceptance per position | draft time | verify time | "
              "ms per round (draft + verify) | drafter memory | output = plain (greedy, match rule) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for method, by_task in summary.items():
        o = by_task["overall"]
        if o["tau"] is None:
            continue
        positions = " ".join(f"{a:.2f}" for a in o["acceptance_per_position"][:8])
        lines.append(f"| {method} | {o['tau']:.2f} | {o['acceptance_rate']:.2f} | {positions} | "
                     f"{o['draft_share']:.0%} | {o['verify_share']:.0%} | "
                     f"{o['draft_ms_per_round']:.1f} + {o['verify_ms_per_round']:.1f} | "
                     f"{o['drafter_memory_mb']:.1f} MB | {o['greedy_matches']} |")
    if results.roofline:
        lines += roofline_lines(results.roofline, summary)
    return "\n".join(lines) + "\n"


def roofline_lines(roofline: Roofline, summary: dict[str, dict[str, dict]]) -> list[str]:
    """Decode speed (after prefill) against the bandwidth ceiling, and against tau times it."""
    lines = ["", f"roofline: measured bandwidth {roofline.bandwidth_gb_s:.1f} GB/s, "
             f"{roofline.weight_bytes_per_token / 1e6:.0f} MB of weights per decode step, "
             f"ceiling {roofline.ceiling_tokens_per_second:.1f} tokens/s for plain decoding", "",
             "| method | decode tokens/s | of the ceiling | tau | of tau x ceiling |", "|---|---|---|---|---|"]
    for method, by_task in summary.items():
        o = by_task["overall"]
        rate = o.get("decode_tokens_per_second")
        if rate is None:
            continue  # transformers peers report whole-call time only
        tau = o["tau"] or 1.0
        lines.append(f"| {method} | {rate:.2f} | {roofline.fraction(rate):.0%} | {tau:.2f} | "
                     f"{roofline.fraction(rate, tau):.0%} |")
    return lines


def drafter_k(results: BenchResults, method: str) -> int:
    """K for a drafter's curve: the configured K, or the mean K it drafted per round (adaptive K)."""
    if results.config.k.fixed is not None:
        return results.config.k.fixed
    runs = [r for r in results.runs if r.method == method and r.rounds]
    rounds = sum(r.rounds for r in runs)
    return max(1, round(sum(r.drafted for r in runs) / rounds)) if rounds else 1


def write_report_dir(results: BenchResults, out_dir: Path) -> list[Path]:
    """report.md, results.json and the PNG charts, each written whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    measured = [(method, by_task["overall"]["acceptance_rate"], by_task["overall"]["tau"],
                 drafter_k(results, method))
                for method, by_task in summary.items() if by_task["overall"]["tau"] is not None]
    return [
        write_atomically(out_dir / "report.md", markdown(results)),
        write_atomically(out_dir / "results.json", json.dumps(results.to_dict(), indent=1)),
        plot_speedup_per_task(summary, out_dir / "speedup_per_task.png",
                              f"{results.config.target}, temperature {results.config.sampling.temperature}"),
        plot_tokens_per_round(measured, out_dir / "tokens_per_round.png"),
    ]


def write_atomically(path: Path, text: str) -> Path:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.rename(path)
    return path
