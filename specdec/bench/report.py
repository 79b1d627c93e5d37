"""Markdown summary of a bench run: per task and overall, each method against our plain decoding."""

from __future__ import annotations

from collections import defaultdict

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
        summary[method][task] = {
            "prompts": len(runs),
            "tokens_per_second": rate(runs),
            "speedup": rate(runs) / plain if plain else float("nan"),
            "tau": sum(r.tau for r in speculative) / len(speculative) if speculative else None,
            "acceptance_rate": (sum(r.acceptance_rate for r in speculative) / len(speculative)) if speculative else None,
            "acceptance_per_position": per_position,
            "draft_share": draft / sum(r.seconds for r in runs) if speculative else None,
            "verify_share": verify / sum(r.seconds for r in runs) if verify else None,
            "greedy_matches": f"{sum(matches)}/{len(matches)}" if matches else "",
        }
    return summary


def markdown(results: BenchResults) -> str:
    summary = summarize(results)
    config = results.config
    tasks = list(dict.fromkeys(r.task for r in results.runs)) + ["overall"]
    lines = [
        f"target `{config.target}`, temperature {config.temperature}, max_new_tokens {config.max_new_tokens}, "
        f"K {config.k}, {len({(r.task, r.prompt_id) for r in results.runs})} prompts, "
        f"{results.machine['threads']} threads, torch {results.machine['torch']}",
        "",
        "tokens/s (speedup over our plain decoding, same run)",
        "",
        "| method | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for method, by_task in summary.items():
        cells = [f"{by_task[t]['tokens_per_second']:.2f} ({by_task[t]['speedup']:.2f}x)" if t in by_task else "-"
                 for t in tasks]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "speculative details (overall)", "",
              "| method | tau | acceptance | acceptance per position | draft time | verify time | greedy = plain |",
              "|---|---|---|---|---|---|---|"]
    for method, by_task in summary.items():
        o = by_task["overall"]
        if o["tau"] is None:
            continue
        positions = " ".join(f"{a:.2f}" for a in o["acceptance_per_position"][:8])
        lines.append(f"| {method} | {o['tau']:.2f} | {o['acceptance_rate']:.2f} | {positions} | "
                     f"{o['draft_share']:.0%} | {o['verify_share']:.0%} | {o['greedy_matches']} |")
    return "\n".join(lines) + "\n"
