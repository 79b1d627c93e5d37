"""The theory of speculative decoding as a calculator (`specdec analyze`).

With per-position acceptance rates alpha_j (the chance draft token j is accepted
given the ones before it were), K draft tokens per round, a draft cost ratio
c = (draft time per token) / (one target decode step) and a verify cost
v(K) = (target forward over K+1 tokens) / (one target decode step):

    expected accepted   E(K) = sum_{i=1..K} prod_{j<=i} alpha_j
                              = alpha (1 - alpha^K) / (1 - alpha)  for constant alpha
    tokens per round    1 + E(K)  (the accepted drafts, then one recovered or bonus token)
    speedup             (1 + E(K)) / (K c + v(K))

Fitting from a bench run turns measured timings and acceptance into (alpha_j, c, v)
so the prediction can be set next to the measured speedup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specdec.core.stats import RoundStats, acceptance_per_position
from specdec.errors import InvalidParameterError


def per_position(alphas: float | Sequence[float], k: int) -> np.ndarray:
    """K per-position rates: a constant, or a list (its last value repeats past its end)."""
    if k < 0:
        raise InvalidParameterError("K must be >= 0")
    values = np.atleast_1d(np.asarray(alphas, dtype=float))
    if values.size == 0 or np.any(values < 0) or np.any(values > 1) or not np.all(np.isfinite(values)):
        raise InvalidParameterError("acceptance rates must be numbers in [0, 1]")
    if k <= values.size:
        return values[:k]
    return np.concatenate([values, np.full(k - values.size, values[-1])])


def expected_accepted(alphas: float | Sequence[float], k: int) -> float:
    """E(K): the expected number of draft tokens accepted per round."""
    return float(np.cumprod(per_position(alphas, k)).sum())


def expected_tokens_per_round(alphas: float | Sequence[float], k: int) -> float:
    return 1.0 + expected_accepted(alphas, k)


@dataclass(frozen=True)
class VerifyCost:
    """v(K) = forward over K+1 tokens relative to a forward over 1: a line 1 + slope * K,
    or measured values per K (linear interpolation, the line's slope past the last)."""

    slope: float = 0.0
    measured: tuple[float, ...] = ()  # measured[K] = v(K), measured[0] = 1

    def __call__(self, k: int) -> float:
        if self.measured:
            if k < len(self.measured):
                return float(self.measured[k])
            last = len(self.measured) - 1
            step = (self.measured[-1] - 1.0) / last if last else self.slope
            return float(self.measured[-1] + step * (k - last))
        return 1.0 + self.slope * k


def expected_speedup(alphas: float | Sequence[float], k: int, draft_cost: float, verify: VerifyCost) -> float:
    """(1 + E(K)) / (K c + v(K)); K = 0 is plain decoding (speedup 1)."""
    return expected_tokens_per_round(alphas, k) / (k * draft_cost + verify(k))


def best_k(alphas: float | Sequence[float], draft_cost: float, verify: VerifyCost, max_k: int = 16) -> tuple[int, float]:
    """The K in 0..max_k with the highest expected speedup, and that speedup."""
    speedups = [expected_speedup(alphas, k, draft_cost, verify) for k in range(max_k + 1)]
    k = int(np.argmax(speedups))
    return k, speedups[k]


def simulate_accepted(alphas: float | Sequence[float], k: int, rounds: int, seed: int = 0) -> float:
    """Monte Carlo of the acceptance process: each round accepts draft tokens in order until the
    first rejection (token j survives with probability alpha_j); the mean number accepted."""
    rng = np.random.default_rng(seed)
    survive = rng.random((rounds, k)) < per_position(alphas, k)  # (rounds, K)
    return float(np.cumprod(survive, axis=1).sum(axis=1).mean())


@dataclass
class FittedDrafter:
    """What a bench run says about one drafter, and what the theory predicts from it."""

    method: str
    mean_k: float  # draft tokens per round, measured
    alphas: list[float]  # per position, pooled over the run
    draft_cost: float  # c
    verify_cost: float  # v at the measured mean K
    measured_tokens_per_round: float  # tau
    predicted_tokens_per_round: float
    measured_speedup: float  # decode tokens/s (after prefill) over plain's, whole run
    predicted_speedup: float
    best_k: int
    best_k_speedup: float


def expected_accepted_mean_k(alphas: Sequence[float], mean_k: float) -> float:
    """E at a fractional mean K (rounds drafting different lengths): the terms up to floor(K), then
    the next one in proportion. Exact when rounds draft floor(K) or floor(K) + 1 tokens."""
    whole = int(mean_k)
    survival = np.cumprod(per_position(alphas, whole + 1))
    return float(survival[:whole].sum() + (mean_k - whole) * survival[whole])


def fit_verify_slope(points: Sequence[tuple[float, float, float]]) -> float:
    """Slope of v(K) = 1 + slope * K through (0, 1), least squares over (K, v, weight) points, >= 0."""
    num = sum(w * k * (v - 1.0) for k, v, w in points)
    den = sum(w * k * k for k, v, w in points)
    return max(num / den, 0.0) if den else 0.0


def fit_from_bench(results: dict) -> list[FittedDrafter]:
    """Fit alpha_j, c and v(K) per drafter from `specdec bench --json` results.

    Units are one plain decode step of the target (its verify time per round in the plain runs).
    Speeds compare decoding only (after prefill), where the theory applies. The verify-cost line is
    fitted over all drafters together, so a drafter that rarely drafts still gets a sensible best K."""
    runs = results["runs"]
    plain = [r for r in runs if r["method"] == "plain" and r.get("rounds")]
    if not plain:
        raise InvalidParameterError("the bench results have no plain-decoding runs with round counts "
                                    "(re-run `specdec bench --json` with this version)")
    step = sum(r["verify_seconds"] for r in plain) / sum(r["rounds"] for r in plain)  # one decode step
    plain_rate = sum(r["new_tokens"] for r in plain) / sum(r["decode_seconds"] for r in plain)
    measured = []
    for method in dict.fromkeys(r["method"] for r in runs if r.get("tau") is not None):
        mine = [r for r in runs if r["method"] == method]
        rounds = sum(r["rounds"] for r in mine)
        drafted = sum(r["drafted"] for r in mine)
        if rounds and drafted:
            measured.append((method, mine, rounds, drafted))
    slope = fit_verify_slope([(drafted / rounds, sum(r["verify_seconds"] for r in mine) / rounds / step, rounds)
                              for _, mine, rounds, drafted in measured])
    fitted = []
    for method, mine, rounds, drafted in measured:
        alphas = pooled_alphas(mine)
        mean_k = drafted / rounds
        c = sum(r["draft_seconds"] for r in mine) / drafted / step
        v = sum(r["verify_seconds"] for r in mine) / rounds / step
        predicted_round = 1 + expected_accepted_mean_k(alphas, mean_k)
        rate = sum(r["new_tokens"] for r in mine) / sum(r["decode_seconds"] for r in mine)
        top_k, top_speedup = best_k(alphas, c, VerifyCost(slope=slope), max(8, len(alphas)))
        fitted.append(FittedDrafter(
            method, mean_k, list(alphas), c, v, 1 + sum(r["accepted"] for r in mine) / rounds, predicted_round,
            rate / plain_rate, predicted_round / (mean_k * c + v), top_k, top_speedup,
        ))
    return fitted


def pooled_alphas(runs: list[dict]) -> list[float]:
    """Per-position acceptance over several runs, weighted by how many rounds reached each position."""
    longest = max((len(r["acceptance_per_position"] or []) for r in runs), default=0)
    alphas = []
    for i in range(longest):
        pairs = [(r["acceptance_per_position"][i], r["rounds"]) for r in runs
                 if len(r["acceptance_per_position"] or []) > i]
        weight = sum(w for _, w in pairs)
        alphas.append(sum(a * w for a, w in pairs) / weight if weight else 0.0)
    return alphas or [0.0]


def theory_table(alphas: float | Sequence[float], k: int, draft_cost: float, verify: VerifyCost,
                 max_k: int = 16) -> str:
    """Markdown: E(K), tokens per round and speedup for K = 1..max_k, the chosen K marked, the best K."""
    if max_k < 1 or k < 0 or draft_cost < 0 or verify(1) <= 0:
        raise InvalidParameterError("need max_k >= 1, K >= 0, c >= 0 and a positive verify cost")
    rows = ["| K | expected accepted | tokens per round | verify cost v(K) | expected speedup |",
            "|---|---|---|---|---|"]
    for n in sorted(set(range(1, max_k + 1)) | {k}):
        mark = " (chosen)" if n == k else ""
        rows.append(f"| {n}{mark} | {expected_accepted(alphas, n):.3f} | {expected_tokens_per_round(alphas, n):.3f} "
                    f"| {verify(n):.3f} | {expected_speedup(alphas, n, draft_cost, verify):.3f}x |")
    top_k, top = best_k(alphas, draft_cost, verify, max_k)
    rows += ["", f"best K = {top_k}: expected speedup {top:.3f}x (K = 0 is plain decoding)"]
    return "\n".join(rows)


def fitted_table(fitted: list[FittedDrafter]) -> str:
    rows = ["| drafter | mean K | alpha per position | c | v(K) | tau measured | tau predicted "
            "| decode speedup measured | predicted | best fixed K (predicted speedup) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for f in fitted:
        alphas = " ".join(f"{a:.2f}" for a in f.alphas[:8])
        rows.append(f"| {f.method} | {f.mean_k:.2f} | {alphas} | {f.draft_cost:.3f} | {f.verify_cost:.2f} | "
                    f"{f.measured_tokens_per_round:.2f} | {f.predicted_tokens_per_round:.2f} | "
                    f"{f.measured_speedup:.2f}x | {f.predicted_speedup:.2f}x | {f.best_k} ({f.best_k_speedup:.2f}x) |")
    if not fitted:
        rows.append("| (no drafter drafted any token) | | | | | | | | | |")
    return "\n".join(rows)


@dataclass(frozen=True)
class GenerationFit:
    """One generation's rounds read through the theory: what its acceptance and costs predict for each K."""

    alphas: tuple[float, ...]  # acceptance per draft position
    draft_cost: float  # c: drafting one token / one target decode step
    verify_slope: float  # v(K) = 1 + slope K
    mean_k: float  # draft tokens per round, as the engine chose them
    speedup_by_k: tuple[float, ...]  # expected speedup at K = 0, 1, ... (K = 0: plain decoding)
    best_k: int


def fit_generation(rounds: Sequence[RoundStats], max_k: int = 8) -> GenerationFit | None:
    """Fit alpha_j, c and v(K) from one generation's rounds (the verify time per round a line in K through
    the decode step); None when nothing was drafted."""
    drafted = [r for r in rounds if r.drafted]
    if not drafted or not rounds:
        return None
    xs = np.array([r.drafted for r in rounds], dtype=float)
    ys = np.array([r.verify_seconds for r in rounds], dtype=float)
    slope_seconds = float(np.polyfit(xs, ys, 1)[0]) if np.ptp(xs) > 0 else 0.0
    step = float(ys.mean() - slope_seconds * xs.mean())  # one decode step: the line at K = 0
    if step <= 0:  # noise on a few rounds: the cheapest round bounds it
        step, slope_seconds = float(ys.min()), 0.0
    c = sum(r.draft_seconds for r in drafted) / sum(r.drafted for r in drafted) / step
    alphas = acceptance_per_position(rounds) or [0.0]
    verify = VerifyCost(slope=max(slope_seconds / step, 0.0))
    max_k = max(max_k, len(alphas))
    speedups = tuple(expected_speedup(alphas, k, c, verify) for k in range(max_k + 1))
    return GenerationFit(tuple(alphas), c, verify.slope, float(xs.mean()), speedups, int(np.argmax(speedups)))
