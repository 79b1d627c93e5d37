"""`specdec analyze`: the seed's formulas, checked against its worked numbers and a simulation."""

import json

import pytest

from specdec.core import analysis
from specdec.core.analysis import VerifyCost
from specdec.cli import main


def test_worked_numbers_from_the_design_brief():
    assert analysis.expected_accepted(0.9, 5) == pytest.approx(3.69, abs=0.005)
    assert analysis.expected_tokens_per_round(0.9, 5) == pytest.approx(4.69, abs=0.005)
    assert analysis.expected_accepted(0.5, 5) == pytest.approx(0.97, abs=0.005)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 0.99, 1.0])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_closed_form_for_constant_alpha(alpha, k):
    closed = k if alpha == 1 else alpha * (1 - alpha**k) / (1 - alpha)
    assert analysis.expected_accepted(alpha, k) == pytest.approx(closed)


@pytest.mark.parametrize("alphas", [[0.9], [0.95, 0.8, 0.6, 0.4], [0.5, 0.9, 0.1]])
def test_expected_accepted_matches_a_brute_force_simulation(alphas):
    k = 6
    rounds = 200_000
    simulated = analysis.simulate_accepted(alphas, k, rounds, seed=1)
    expected = analysis.expected_accepted(alphas, k)
    # the count per round is at most K, so its standard error is below K / sqrt(rounds); 5 sigma
    assert abs(simulated - expected) < 5 * k / rounds**0.5


def test_speedup_and_best_k():
    verify = VerifyCost(slope=0.1)
    assert analysis.expected_speedup(0.8, 0, 0.05, verify) == 1.0  # K = 0 is plain decoding
    speedup = analysis.expected_speedup(0.8, 4, 0.05, verify)
    assert speedup == pytest.approx((1 + 0.8 + 0.64 + 0.512 + 0.4096) / (4 * 0.05 + 1.4))
    k, best = analysis.best_k(0.8, 0.05, verify, 16)
    assert best == max(analysis.expected_speedup(0.8, n, 0.05, verify) for n in range(17))
    assert analysis.best_k(0.1, 0.5, VerifyCost(slope=1.0))[0] == 0  # a poor drafter: do not speculate
    measured = VerifyCost(measured=(1.0, 1.2, 1.5))
    assert measured(2) == 1.5 and measured(4) == pytest.approx(2.0)


def test_fit_from_bench_predicts_a_synthetic_run():
    # A drafter with alpha 0.8 at every position, K = 4, c = 0.1, v(4) = 1.4 (all in units of one step).
    step = 0.02
    accepted_per_round = analysis.expected_accepted(0.8, 4)
    rounds = 100
    runs = [
        {"method": "plain", "rounds": 400, "verify_seconds": 400 * step, "new_tokens": 400,
         "decode_seconds": 400 * step, "tau": None, "acceptance_per_position": None},
        {"method": "ngram", "rounds": rounds, "drafted": 4 * rounds, "accepted": accepted_per_round * rounds,
         "draft_seconds": 4 * rounds * 0.1 * step, "verify_seconds": rounds * 1.4 * step,
         "new_tokens": (1 + accepted_per_round) * rounds, "decode_seconds": rounds * 1.8 * step,
         "tau": 1 + accepted_per_round, "acceptance_per_position": [0.8] * 4},
    ]
    [fit] = analysis.fit_from_bench({"runs": runs})
    assert fit.draft_cost == pytest.approx(0.1) and fit.verify_cost == pytest.approx(1.4)
    assert fit.predicted_tokens_per_round == pytest.approx(fit.measured_tokens_per_round)
    assert fit.predicted_speedup == pytest.approx(fit.measured_speedup)


def test_analyze_cli(tmp_path, capsys):
    assert main(["analyze", "--k", "5", "--alpha", "0.9", "--plot", str(tmp_path / "k.png")]) == 0
    out = capsys.readouterr().out
    assert "| 5 (chosen) | 3.686 | 4.686 |" in out and "best K" in out
    assert (tmp_path / "k.png").read_bytes().startswith(b"\x89PNG")
    assert main(["analyze", "--alpha", "1.5"]) == 2
    assert "acceptance rates must be numbers in [0, 1]" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["analyze", "--from-bench", str(tmp_path / "bad.json")]) == 2
    (tmp_path / "old.json").write_text(json.dumps({"runs": []}))
    assert main(["analyze", "--from-bench", str(tmp_path / "old.json")]) == 2


def test_fractional_mean_k_interpolates_between_whole_ks():
    alphas = [0.9, 0.7, 0.5]
    assert analysis.expected_accepted_mean_k(alphas, 2.0) == pytest.approx(analysis.expected_accepted(alphas, 2))
    half = analysis.expected_accepted_mean_k(alphas, 2.5)
    assert half == pytest.approx((analysis.expected_accepted(alphas, 2) + analysis.expected_accepted(alphas, 3)) / 2)
    assert analysis.fit_verify_slope([(2.0, 1.4, 1.0), (4.0, 1.8, 1.0)]) == pytest.approx(0.2)
    assert analysis.fit_verify_slope([(0.2, 0.9, 1.0)]) == 0.0  # never a negative cost per token


def test_fit_generation_recovers_the_costs_and_acceptance_of_its_rounds():
    from specdec.core.analysis import fit_generation
    from specdec.core.stats import RoundStats

    rounds = [RoundStats(k, k, accepted, accepted + 1, 0.001 * k, 0.01 + 0.002 * k, 0.0)
              for k in (1, 2, 3, 4) for accepted in range(k + 1)]
    fit = fit_generation(rounds)
    assert abs(fit.draft_cost - 0.1) < 1e-9 and abs(fit.verify_slope - 0.2) < 1e-9
    assert fit.speedup_by_k[0] == 1.0 and fit.mean_k == sum(r.drafted for r in rounds) / len(rounds)
    assert fit.alphas[0] == sum(r.accepted >= 1 for r in rounds) / len(rounds)
    assert fit.best_k == max(range(len(fit.speedup_by_k)), key=fit.speedup_by_k.__getitem__)
    assert fit_generation([RoundStats(0, 0, 0, 1, 0.0, 0.01, 0.0)]) is None
