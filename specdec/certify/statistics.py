"""The two tests certify runs, with their power stated.

Goodness of fit (one sample against exact probabilities) and homogeneity (two samples against each other),
both Pearson chi-square over outcomes with enough expected mass: outcomes expected fewer than MIN_EXPECTED
times are pooled into one "other" bin, so the chi-square law holds. Each result carries the smallest total
variation distance (between the binned distributions) the test would have caught with probability POWER:
by Cauchy-Schwarz, a deviation of total variation d makes the chi-square noncentrality at least
n * (2d)^2 (one sample) or n_a n_b / (n_a + n_b) * (2d)^2 (two samples), and the noncentral chi-square
law gives the noncentrality that reaches POWER at the test's critical value.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Mapping

import numpy as np
from scipy import optimize, stats

MIN_EXPECTED = 5.0
POWER = 0.8
OTHER = "<other>"


@dataclass(frozen=True)
class ChiSquareResult:
    test: str  # "goodness of fit" or "homogeneity"
    statistic: float
    dof: int
    p_value: float
    alpha: float  # the level this test was judged at
    samples: int  # draws (homogeneity: of each sample together)
    bins: int
    detectable_tv: float  # a deviation this large (binned TV) is caught with probability POWER

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha


def goodness_of_fit(counts: Mapping[Hashable, int], probs: Mapping[Hashable, float], alpha: float) -> ChiSquareResult:
    """Draws `counts` (outcome -> count) against exact `probs` (outcome -> probability, summing to ~1).
    An outcome drawn that has probability 0 makes the p-value 0 (it cannot happen under the null)."""
    total = sum(counts.values())
    if total == 0:
        raise ValueError("no draws")
    impossible = [key for key, count in counts.items() if count and probs.get(key, 0.0) <= 0.0]
    mass = sum(probs.values())
    expected = {key: total * p / mass for key, p in probs.items() if p > 0}
    kept = [key for key, e in expected.items() if e >= MIN_EXPECTED]
    observed = [counts.get(key, 0) for key in kept]
    wanted = [expected[key] for key in kept]
    rest_expected = total - sum(wanted)
    if rest_expected > 1e-9 * total:
        observed.append(total - sum(observed))
        wanted.append(rest_expected)
    dof = len(wanted) - 1
    if impossible:
        statistic, p_value = math.inf, 0.0
    elif dof < 1:  # one bin holds all the mass: nothing to test beyond impossibility
        statistic, p_value = 0.0, 1.0
    else:
        statistic, p_value = (float(v) for v in stats.chisquare(observed, wanted))
    return ChiSquareResult("goodness of fit", statistic, dof, p_value, alpha, total, len(wanted),
                           detectable_tv(dof, total, alpha))


def homogeneity(counts_a: Mapping[Hashable, int], counts_b: Mapping[Hashable, int], alpha: float) -> ChiSquareResult:
    """Whether two samples (outcome -> count) come from one distribution: the 2 x bins contingency test,
    outcomes whose pooled expected count falls under MIN_EXPECTED in either sample merged into one bin
    (sequences: into their longest frequent prefix first, pool_by_prefix)."""
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    if n_a == 0 or n_b == 0:
        raise ValueError("an empty sample")
    smaller = min(n_a, n_b) / (n_a + n_b)
    if all(isinstance(key, tuple) for key in (*counts_a, *counts_b)):
        counts_a, counts_b = pool_by_prefix(counts_a, counts_b, MIN_EXPECTED / smaller)
    pooled = Counter(counts_a) + Counter(counts_b)
    kept = [key for key, count in pooled.items() if count * smaller >= MIN_EXPECTED]
    table = [[counts_a.get(key, 0) for key in kept], [counts_b.get(key, 0) for key in kept]]
    rest = [n_a - sum(table[0]), n_b - sum(table[1])]
    if sum(rest) > 0:
        table[0].append(rest[0])
        table[1].append(rest[1])
    dof = len(table[0]) - 1
    if dof < 1:
        statistic, p_value = 0.0, 1.0
    else:
        result = stats.chi2_contingency(np.array(table), correction=False)
        statistic, p_value = float(result.statistic), float(result.pvalue)
    effective = n_a * n_b / (n_a + n_b)
    return ChiSquareResult("homogeneity", statistic, dof, p_value, alpha, n_a + n_b, dof + 1,
                           detectable_tv(dof, effective, alpha))


def pool_by_prefix(counts_a: Mapping[tuple, int], counts_b: Mapping[tuple, int],
                   min_count: float) -> tuple[Counter, Counter]:
    """Sequences (tuples) binned by their longest prefix seen at least `min_count` times in the two samples
    together: rare continuations are merged into their common beginning instead of into one "other" bin,
    so a test of a few tokens' joint distribution keeps the power of its first tokens where the later ones
    are too spread to count. The bins partition the sequences; () holds the rest."""
    pooled: Counter = Counter()
    for counts in (counts_a, counts_b):
        for sequence, count in counts.items():
            for end in range(len(sequence) + 1):
                pooled[sequence[:end]] += count

    def bin_of(sequence: tuple) -> tuple:
        return next(sequence[:end] for end in range(len(sequence), -1, -1)
                    if end == 0 or pooled[sequence[:end]] >= min_count)

    binned_a, binned_b = Counter(), Counter()
    for counts, binned in ((counts_a, binned_a), (counts_b, binned_b)):
        for sequence, count in counts.items():
            binned[bin_of(sequence)] += count
    return binned_a, binned_b


@functools.lru_cache(maxsize=4096)
def detectable_tv(dof: int, effective_samples: float, alpha: float, power: float = POWER) -> float:
    """The smallest binned total variation a chi-square test with `dof` degrees of freedom at level alpha
    detects with probability `power` from `effective_samples` draws (module docstring); 1 where dof < 1."""
    if dof < 1 or effective_samples <= 0:
        return 1.0
    critical = stats.chi2.isf(alpha, dof)
    noncentrality = optimize.brentq(lambda lam: stats.ncx2.sf(critical, dof, lam) - power, 1e-9, 1e7)
    return min(1.0, math.sqrt(noncentrality / (4.0 * effective_samples)))
