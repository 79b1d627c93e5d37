"""Advice after a generation whose speculation did not pay: said in plain words, once per kind."""

from specdec.api.comparison import PlainComparison
from specdec.hints import comparison_hint, speculation_hint, take_unshown
from specdec.core.stats import GenerationStats, RoundStats


def stats(drafter: str, rounds: list[RoundStats]) -> GenerationStats:
    return GenerationStats.from_rounds(drafter, 10, rounds, 1.0, 0.1, 0)


def test_hints_name_what_to_do_and_stay_quiet_when_drafting_pays():
    missed = [RoundStats(4, 4, 0, 1, 0.001, 0.01, 0.001) for _ in range(40)]  # 40 tokens, nothing accepted
    key, advice = speculation_hint(stats("ngram", missed))
    assert key == "ngram-low" and "--drafter" in advice
    assert speculation_hint(stats("draft:m", missed))[0] == "low-acceptance"
    plain_steps = [RoundStats(0, 0, 0, 1, 0.0, 0.01, 0.001) for _ in range(40)]
    assert speculation_hint(stats("ngram", plain_steps))[0] == "switched-off"
    paying = [RoundStats(4, 4, 3, 4, 0.001, 0.01, 0.001) for _ in range(10)]
    assert speculation_hint(stats("ngram", paying)) is None
    assert speculation_hint(stats("ngram", missed[:5])) is None  # too short to judge


def test_a_hint_is_shown_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    assert take_unshown("ngram-low") and not take_unshown("ngram-low")
    assert take_unshown("switched-off")


def test_compare_names_what_pays_when_speculation_gained_nothing():
    rounds = [RoundStats(4, 4, 1, 2, 0.001, 0.01, 0.001) for _ in range(20)]  # 40 tokens
    small = PlainComparison(105.0, 103.0, 0.98, True)
    key, advice = comparison_hint(small, stats("ngram", rounds))
    assert key == "compare-small-target" and "--target" in advice and "0.98x" in advice
    large = PlainComparison(15.0, 15.3, 1.02, True)
    assert comparison_hint(large, stats("ngram", rounds))[0] == "compare-no-gain"
    assert comparison_hint(PlainComparison(105.0, 147.0, 1.4, True), stats("ngram", rounds)) is None
    assert comparison_hint(small, stats("ngram", rounds[:5])) is None  # too short to judge
