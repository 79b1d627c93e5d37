"""Statistical checks with a calibrated false-alarm rate, shared by the exactness tests.

chi-square goodness of fit at alpha = 1e-6 (a correct sampler fails one run in a
million) plus a total-variation bound, so a real bias fails loudly while noise
does not. Expected counts below 5 are pooled so the chi-square law holds.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

FALSE_ALARM = 1e-6


def assert_distribution(counts, expected_probs, tv_bound: float = 0.01, what: str = "distribution") -> None:
    counts = np.asarray(counts, dtype=np.float64)
    expected_probs = np.asarray(expected_probs, dtype=np.float64)
    expected_probs = expected_probs / expected_probs.sum()
    total = counts.sum()
    if (counts[expected_probs == 0] > 0).any():
        raise AssertionError(f"{what}: outcomes with probability 0 occurred: {np.nonzero((expected_probs == 0) & (counts > 0))[0]}")
    expected = expected_probs * total
    keep = expected >= 5
    observed_kept, expected_kept = counts[keep], expected[keep]
    if (~keep).any() and expected[~keep].sum() > 0:
        observed_kept = np.append(observed_kept, counts[~keep].sum())
        expected_kept = np.append(expected_kept, expected[~keep].sum())
    if len(expected_kept) > 1:
        statistic, p_value = stats.chisquare(observed_kept, expected_kept)
        if p_value < FALSE_ALARM:
            raise AssertionError(f"{what}: chi-square p = {p_value:.2e} < {FALSE_ALARM} (statistic {statistic:.1f})")
    # TV of a correct sampler is about 0.5 * sum sqrt(2 p (1 - p) / (pi N)); allow three times
    # that, so the bound only fails deviations larger than sampling noise explains.
    noise_tv = 0.5 * np.sqrt(2 * expected_probs * (1 - expected_probs) / (np.pi * total)).sum()
    limit = max(tv_bound, 3 * noise_tv)
    tv = 0.5 * np.abs(counts / total - expected_probs).sum()
    if tv > limit:
        raise AssertionError(f"{what}: total variation {tv:.4f} > {limit:.4f}")
