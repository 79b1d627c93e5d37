"""How many tokens to draft each round: fixed K, or chosen from measurements (`--k auto`).

AdaptiveK picks the K that maximizes expected tokens per second,

    (1 + sum_{i=1..K} prod_{j<=i} alpha_j) / (K * c_draft + c_verify(K + 1)),

from measured per-position acceptance alpha_j, the measured draft time per token
c_draft and measured verify times c_verify(n) for n input tokens (a line fitted
to them for sizes not measured yet). Estimates decay geometrically so K follows
the text as it changes (code vs prose). K = 0 (a plain decoding step) is a
candidate too. The first round's times are not used: a cold first forward of a
size (here up to 2x) would otherwise stand for that size until it is tried again.

A position's alpha is its own count shrunk toward the acceptance pooled over all
positions, so positions never drafted yet borrow what the drafter has shown. With a
fixed prior instead (0.6), a self-draft accepted 97-100% at every position it tried
stayed at K = 3 where K = 5-7 pays: the untried positions never left the prior.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol

import numpy as np

from specdec.errors import InvalidParameterError

# K's grammar, read by the CLI (--k), the server (`speculative.k`) and the API alike: an integer in
# 1..MAX_K, "auto" (AdaptiveK up to MAX_AUTO_K) or "auto:N" (AdaptiveK up to N).
MAX_K = 64
# The longest draft `--k auto` considers. A self-draft accepted nearly every token on code gains from long
# drafts, and a verification of up to 16 rows streams the weights once on AVX-512 builds; elsewhere the
# measured costs keep K short.
MAX_AUTO_K = 16
K_HELP = f"draft tokens per round; 'auto' (default) chooses K <= {MAX_AUTO_K} from measurements, 'auto:N' K <= N"


@dataclass(frozen=True)
class KSetting:
    """K as a user sets it, parsed once at the edge (`parse`): a fixed K every round, or AdaptiveK choosing
    K <= `most` from measurements ('auto', 'auto:N'). Below the edge only this value travels."""

    fixed: int | None = None  # K every round; None: chosen from measurements
    most: int = MAX_AUTO_K  # with fixed None: the longest draft AdaptiveK considers

    @classmethod
    def parse(cls, value: "int | str | KSetting", numbers_as_text: bool = True) -> "KSetting":
        """The one reader of K's grammar: an integer in 1..MAX_K, 'auto' or 'auto:N' with N in 1..MAX_K, or a
        KSetting (returned as it is); InvalidParameterError otherwise. numbers_as_text: '4' reads as 4 (a
        command line); False where a number comes typed (JSON)."""
        if isinstance(value, KSetting):
            return value
        if isinstance(value, str) and (value == "auto" or value.startswith("auto:")):
            most = value.partition(":")[2]
            if most and not (most.isdigit() and 1 <= int(most) <= MAX_K):
                raise InvalidParameterError(f"k: 'auto:N' needs N between 1 and {MAX_K}, not {most!r}")
            return cls(None, int(most) if most else MAX_AUTO_K)
        if isinstance(value, str) and numbers_as_text:
            try:
                value = int(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidParameterError(f"k must be an integer, 'auto' or 'auto:N', not {value!r}")
        if not 1 <= value <= MAX_K:
            raise InvalidParameterError(f"k must be between 1 and {MAX_K}, not {value}")
        return cls(value)

    @property
    def is_auto(self) -> bool:
        return self.fixed is None

    @property
    def max_k(self) -> int:
        return self.most if self.fixed is None else self.fixed

    def new_length(self) -> "SpeculationLength":
        """A fresh speculation length for this setting (AdaptiveK's measurements start empty)."""
        return AdaptiveK(max_k=self.most) if self.fixed is None else FixedK(self.fixed)

    def __str__(self) -> str:
        if self.fixed is not None:
            return str(self.fixed)
        return "auto" if self.most == MAX_AUTO_K else f"auto:{self.most}"


class SpeculationLength(Protocol):
    max_k: int

    def next_k(self) -> int: ...

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float,
                source: Hashable | None = None) -> None:
        """One round: its draft's length, the tokens accepted, the seconds drafting and verifying took, and
        which source of a combined drafter proposed (`Draft.source`; None: the drafter's only source, or a
        round without a draft)."""


class FixedK:
    def __init__(self, k: int):
        self.max_k = k

    def next_k(self) -> int:
        return self.max_k

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float,
                source: Hashable | None = None) -> None:
        pass


PRIOR_ROUNDS = 2.0  # how many rounds' worth of evidence a prior (pooled, or prior_alpha for the pool) weighs


class AdaptiveK:
    def __init__(self, max_k: int = 8, initial_k: int = 4, decay: float = 0.95, prior_alpha: float = 0.6,
                 min_k: int = 0):
        self.max_k = max_k
        self.min_k = min_k  # 1: never a plain step, where something else decides whether this drafts at all
        self.decay = decay
        self.k = initial_k
        # Counts per draft position, decayed every round; the pool starts at prior_alpha.
        self.prior_alpha = prior_alpha
        self.reached = np.zeros(max_k)
        self.accepted = np.zeros(max_k)
        self.draft_per_token: float | None = None
        self.verify_seconds: dict[int, float] = {}  # input tokens -> EMA of forward seconds
        self.history: list[int] = []

    def alphas(self) -> np.ndarray:
        weight = PRIOR_ROUNDS
        pooled = (self.accepted.sum() + weight * self.prior_alpha) / (self.reached.sum() + weight)
        return (self.accepted + weight * pooled) / (self.reached + weight)

    def keep_at_most(self, rounds: float) -> None:
        """Scale the acceptance counts down so that they weigh at most `rounds` rounds of evidence (for text of
        a new kind, where the rounds from now on should soon outweigh the old ones); their ratios, and so the
        alphas they fit, stay as they were but for the prior's share."""
        if self.reached[0] > rounds:
            scale = rounds / self.reached[0]
            self.reached *= scale
            self.accepted *= scale

    def verify_cost_line(self) -> tuple[float, float]:
        """(intercept, slope) of forward seconds against input tokens, fitted to the measurements."""
        sizes = np.array(sorted(self.verify_seconds), dtype=float)
        costs = np.array([self.verify_seconds[int(n)] for n in sizes])
        if len(sizes) == 1:
            # One size seen: assume each extra token adds 5% (small-batch forwards are memory-bound).
            slope = 0.05 * costs[0]
            return float(costs[0] - slope * sizes[0]), float(slope)
        mean_size, mean_cost = sizes.mean(), costs.mean()
        slope = ((sizes - mean_size) * (costs - mean_cost)).sum() / ((sizes - mean_size) ** 2).sum()
        return float(mean_cost - slope * mean_size), float(slope)

    def predicted_rates(self) -> np.ndarray:
        """Expected tokens per second for K = 0..max_k."""
        intercept, slope = self.verify_cost_line()
        ks = np.arange(self.max_k + 1)
        tokens = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(self.alphas()))])  # 1 + E[accepted | K]
        verify = np.array([self.verify_seconds.get(int(k) + 1, intercept + slope * (k + 1)) for k in ks])
        seconds = (self.draft_per_token or 0.0) * ks + np.maximum(verify, 1e-9)
        return tokens / seconds

    def next_k(self) -> int:
        if self.draft_per_token is not None and self.verify_seconds:
            self.k = self.min_k + int(np.argmax(self.predicted_rates()[self.min_k:]))
            # Keep measuring one longer K now and then, or a low start could never grow; but not for a
            # drafter whose draft token costs a whole plain step: no K pays then, even with every draft
            # accepted, and each probe also pays the draft's catch-up on the tokens it skipped (torch's int4
            # operators drafting for a float32 CPU target ran at half of plain decoding with probes).
            if self.k < self.max_k and len(self.history) % 16 == 15 and not self.drafting_cannot_pay():
                self.k += 1
        self.history.append(self.k)
        return self.k

    def drafting_cannot_pay(self) -> bool:
        """A draft token costs at least a plain decoding step (measured): then K = 0 is best for any acceptance."""
        plain_step = self.verify_seconds.get(1)
        return self.draft_per_token is not None and plain_step is not None and self.draft_per_token >= plain_step

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float,
                source: Hashable | None = None) -> None:
        self.reached *= self.decay
        self.accepted *= self.decay
        reached = min(drafted, accepted + 1)  # positions whose token was judged
        self.reached[:reached] += 1
        self.accepted[:accepted] += 1
        # After plain steps (K = 0) a draft model first catches up on the tokens it skipped, in one
        # forward: a one-time cost of those steps, not of drafting. Counted per drafted token it made a
        # 15 ms draft look like 75 ms and kept K at 0 for good (a 0.5B draft for the int4 1.5B).
        if len(self.history) <= 1:
            return  # the first round: cold forwards (see the module's docstring)
        after_plain_steps = self.history[-2] == 0
        if drafted and not after_plain_steps:
            per_token = draft_seconds / drafted
            self.draft_per_token = per_token if self.draft_per_token is None else 0.8 * self.draft_per_token + 0.2 * per_token
        self.observe_verify(drafted + 1, verify_seconds)

    def observe_verify(self, rows: int, seconds: float) -> None:
        """A verify forward over `rows` new tokens took `seconds`."""
        old = self.verify_seconds.get(rows)
        self.verify_seconds[rows] = seconds if old is None else 0.8 * old + 0.2 * seconds


class SourceLengths:
    """K measured per source, for a drafter that combines several (`ngram+draft:MODEL`).

    A lookup copying the context verbatim, a lookup's one-token guess and a draft model are accepted at
    rates far apart; one AdaptiveK fitted to their pooled acceptance asks a verbatim copy for a token or two
    and the model for fewer than its own acceptance pays. Here each source has its own AdaptiveK: the engine
    takes `next_k` (the most any source may draft) as the round's cap, the drafter asks `next_k_for` the
    source it drafts from and marks its draft with it (`Draft.source`), and `observe` files the round under
    that source. A round without a draft (a plain step) measures the one-row forward every source compares
    drafting against."""

    def __init__(self, max_k: int):
        self.max_k = max_k
        self.lengths: dict[Hashable, AdaptiveK] = {}
        self.plain_step_seconds: float | None = None  # a round without a draft: a one-row forward

    def predicted_rate(self, source: Hashable, min_k: int = 0) -> float | None:
        """The tokens per second `source` is predicted to commit at its best K >= min_k (its fitted
        acceptance and measured costs); None until its rounds have measured both."""
        length = self.lengths.get(source)
        if length is None or length.draft_per_token is None or not length.verify_seconds:
            return None
        return float(length.predicted_rates()[min_k:].max())

    def plain_rate(self) -> float | None:
        """Tokens per second of a round without a draft, once one is measured."""
        return None if self.plain_step_seconds is None else 1.0 / max(self.plain_step_seconds, 1e-9)

    def length(self, source: Hashable, min_k: int = 0) -> AdaptiveK:
        if source not in self.lengths:
            self.lengths[source] = AdaptiveK(max_k=self.max_k, min_k=min_k)
        return self.lengths[source]

    def next_k(self) -> int:
        return self.max_k

    def keep_at_most(self, source: Hashable, rounds: float) -> None:
        """Source's acceptance evidence weighs at most `rounds` rounds (AdaptiveK.keep_at_most), if it has any."""
        if source in self.lengths:
            self.lengths[source].keep_at_most(rounds)

    def next_k_for(self, source: Hashable, min_k: int = 0) -> int:
        """Source's K this round; min_k (given at its first call) bounds it below."""
        return self.length(source, min_k).next_k()

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float,
                source: Hashable | None = None) -> None:
        if source is not None:
            self.length(source).observe(drafted, accepted, draft_seconds, verify_seconds)
        elif drafted == 0:
            old = self.plain_step_seconds
            self.plain_step_seconds = verify_seconds if old is None else 0.8 * old + 0.2 * verify_seconds
            for length in self.lengths.values():
                length.observe_verify(1, verify_seconds)
