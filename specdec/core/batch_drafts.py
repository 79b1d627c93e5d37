"""How many draft tokens each generation of a batched round may verify: rows are shared, so they go where
they pay.

In a batched round every generation verifies its last token (one row) plus its draft tokens (one row each),
all in one pass whose time grows with its rows: about t(R) = t0 + r * R past a few rows on a CPU, nearly
flat on a GPU. Before that pass each generation drafts, one after another: a draft model's token costs its
own forward, d seconds (a lookup's, next to nothing), which no batching shares. A draft token pays when the
tokens it adds per second beat what the round already makes: the k-th draft token of a generation whose
drafts are accepted at rate a is accepted with probability about a^k, so it is worth its row and its drafting
while a^k * T > (r + d) * (expected tokens of the round), T the round's time so far (the pass and the
drafting). Draft tokens go one at a time to the one with the best gain per second of cost, within the row
budget and each generation's own K (its adaptive K, as when it runs alone). With one generation, or until the
pass's cost has been measured, every generation gets the same share of the budget.
"""

from __future__ import annotations

import heapq
from typing import Sequence

# A pass-time sample loses this much weight per later sample (old batch sizes fade as the load changes).
DECAY = 0.97
# Until the samples span this many rows (in weighted spread), the slope is not trusted.
MIN_ROW_SPREAD = 2.0


class PassCost:
    """An online least-squares fit of a batched pass's seconds against its rows (recent passes weigh more)."""

    def __init__(self):
        self.weight = self.rows = self.seconds = self.rows_sq = self.rows_seconds = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        for name in ("weight", "rows", "seconds", "rows_sq", "rows_seconds"):
            setattr(self, name, getattr(self, name) * DECAY)
        self.weight += 1.0
        self.rows += rows
        self.seconds += seconds
        self.rows_sq += rows * rows
        self.rows_seconds += rows * seconds

    def fit(self) -> tuple[float, float] | None:
        """(t0, r): seconds = t0 + r * rows, r >= 0; None while the passes seen are too alike to tell."""
        if self.weight < 4:
            return None
        mean_rows, mean_seconds = self.rows / self.weight, self.seconds / self.weight
        variance = self.rows_sq / self.weight - mean_rows ** 2
        if variance < MIN_ROW_SPREAD ** 2:
            return None
        slope = max(0.0, (self.rows_seconds / self.weight - mean_rows * mean_seconds) / variance)
        return max(mean_seconds - slope * mean_rows, 1e-9), slope


def even_caps(count: int, row_budget: int | None) -> list[int | None]:
    """The same cap for each of `count` generations: the budget's rows shared out (None: no cap)."""
    if row_budget is None or count < 2:
        return [None] * count
    return [max(0, row_budget // count - 1)] * count


def draft_caps(rates: Sequence[float], wanted: Sequence[int], row_budget: int | None,
               cost: tuple[float, float] | None, draft_seconds: Sequence[float] | None = None) -> list[int | None]:
    """Each generation's most draft tokens this round. rates: each one's draft acceptance rate; wanted: the
    K each would draft alone; cost: PassCost.fit() (None: share the budget evenly); draft_seconds: each one's
    measured seconds to draft a token (None: drafting free)."""
    count = len(rates)
    if cost is None or count < 2:
        return even_caps(count, row_budget)
    t0, slope = cost
    spend = list(draft_seconds) if draft_seconds is not None else [0.0] * count
    spare = (row_budget - count) if row_budget is not None else sum(wanted)
    seconds, tokens = t0 + slope * count, float(count)  # each generation's own row yields a token
    caps = [0] * count
    # gain per second of cost first: a cheap lookup token before a dear model token of the same gain
    best = [(-rate / (slope + spend[index] or 1e-12), rate, index) for index, rate in enumerate(rates)
            if wanted[index] > 0]
    heapq.heapify(best)
    while spare > 0 and best:
        _, gain, index = heapq.heappop(best)
        price = slope + spend[index]
        if gain * seconds <= price * tokens:
            break  # the best remaining draft token (for its cost) would lower the round's tokens per second
        caps[index] += 1
        seconds, tokens, spare = seconds + price, tokens + gain, spare - 1
        if caps[index] < wanted[index]:
            following = rates[index] ** (caps[index] + 1)
            heapq.heappush(best, (-following / (price or 1e-12), following, index))
    return caps


def recent_drafting(rounds, recent: int = 8, window: int = 32) -> list:
    """A generation's last `recent` rounds that drafted, looking back at most `window` rounds (this runs
    every round)."""
    found = []
    for stats in reversed(rounds[-window:]):
        if stats.drafted:
            found.append(stats)
            if len(found) == recent:
                break
    return found


def draft_seconds_per_token(rounds) -> float:
    """A generation's measured seconds to draft one token over its recent rounds that drafted; 0 before any."""
    drafting = recent_drafting(rounds)
    drafted = sum(stats.drafted for stats in drafting)
    return sum(stats.draft_seconds for stats in drafting) / drafted if drafted else 0.0


def acceptance_rate(rounds) -> float:
    """A generation's draft acceptance rate over its recent rounds that drafted, with one accepted and one
    rejected draft of prior (0.5 before any)."""
    drafting = recent_drafting(rounds)
    return (sum(stats.accepted for stats in drafting) + 1) / (sum(stats.drafted for stats in drafting) + 2)
