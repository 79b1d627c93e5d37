"""PNG charts for bench reports and `specdec analyze` (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from specdec.core.analysis import VerifyCost, expected_accepted, expected_speedup  # noqa: E402


def plot_speedup_per_task(summary: dict[str, dict[str, dict]], path: Path, title: str = "") -> Path:
    """Grouped bars: speedup over our plain decoding, per task, one bar per method."""
    methods = [m for m in summary if m != "plain"]
    tasks = list(dict.fromkeys(t for m in methods for t in summary[m] if t != "overall")) + ["overall"]
    x = np.arange(len(tasks))
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(tasks)), 4.0))
    for i, method in enumerate(methods):
        values = [summary[method].get(t, {}).get("speedup", np.nan) for t in tasks]
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, tasks, rotation=20)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(title or "speedup per task")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_tokens_per_round(measured: Sequence[tuple[str, float, float, int]], path: Path) -> Path:
    """The seed's chart: expected tokens per round against alpha for K (accepted drafts, and accepted +
    the recovered/bonus token), with each drafter's measured (alpha, tau) on top. `measured` holds
    (name, alpha, tau, K); drafters with different K (adaptive) each get their own curve and colour."""
    alphas = np.linspace(0.0, 1.0, 201)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ks = sorted({k for *_, k in measured}) or [1]
    if len(ks) == 1:
        accepted = np.array([expected_accepted(a, ks[0]) for a in alphas])
        ax.plot(alphas, accepted, color="grey", linestyle="--", label=f"accepted drafts, K={ks[0]}")
        ax.plot(alphas, accepted + 1, color="black", label=f"tokens per round (+ bonus), K={ks[0]}")
    for index, (name, alpha, tau, k) in enumerate(measured):
        color = f"C{index}"
        if len(ks) > 1:
            ax.plot(alphas, [1 + expected_accepted(a, k) for a in alphas], color=color, linewidth=1,
                    label=f"tokens per round, K={k} ({name})")
        ax.scatter([alpha], [tau], color=color, zorder=3)
        ax.annotate(name, (alpha, tau), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("acceptance rate alpha")
    ax.set_ylabel("tokens")
    ax.set_title("expected tokens per round vs acceptance (measured: dots)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_speedup_vs_k(alphas: float | Sequence[float], draft_cost: float, verify: VerifyCost, max_k: int,
                      path: Path) -> Path:
    ks = np.arange(0, max_k + 1)
    speedups = [expected_speedup(alphas, int(k), draft_cost, verify) for k in ks]
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    ax.plot(ks, speedups, marker="o")
    best = int(np.argmax(speedups))
    ax.annotate(f"best K={best}: {speedups[best]:.2f}x", (best, speedups[best]), textcoords="offset points",
                xytext=(5, -12))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("expected speedup")
    ax.set_title(f"speedup vs K (c={draft_cost:.3g})")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    partial = path.with_name(path.name + ".partial.png")
    fig.tight_layout()
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    partial.rename(path)  # nothing half-written under the final name
    return path
