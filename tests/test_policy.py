"""The speculation policy (drafters/policy.py), rule by rule on hand-made round states: each expectation is
worked out by hand from the rule docs/drafters.md states."""

from dataclasses import replace

import pytest

from specdec.drafters.policy import (MODEL_AFTER_TOKENS, RETRY_EVERY, Choice, ModelState, RoundState, choose,
                                     expected_tokens_to_come)

STARTED_FAST = ModelState(rate=40.0, start_seconds=0.120, started=True, passed=0)


def state(*models: ModelState, **fields) -> RoundState:
    base = RoundState(committed=32, expected_remaining=None, room=1000, verbatim=False, guess=False,
                      alternative_rate=25.0, models=models)
    return replace(base, **fields)


def test_a_verbatim_copy_drafts_first_whatever_the_models_rates():
    decision = choose(state(STARTED_FAST, verbatim=True, guess=True))
    assert decision.choice is Choice.VERBATIM and decision.fallback is Choice.GUESS


@pytest.mark.parametrize("expected, starts", [(8.0, True), (7.9, False), (100.0, True), (0.0, False)])
def test_a_model_starts_where_the_tokens_to_come_repay_its_start(expected, starts):
    """R0 = 25 tok/s (40 ms a token), R = 40 tok/s (25 ms), S = 120 ms: it pays from r * 15 ms >= 120 ms, r >= 8."""
    cold = replace(STARTED_FAST, started=False)
    decision = choose(state(cold, expected_remaining=expected))
    assert (decision.choice is Choice.MODEL) is starts


def test_ski_rental_past_the_recent_answers_and_never_past_the_room():
    cold = replace(STARTED_FAST, started=False)
    assert expected_tokens_to_come(state(cold, committed=7)) == 7  # outran the recent answers: as long again
    assert choose(state(cold, committed=7)).choice is Choice.PLAIN
    assert choose(state(cold, committed=8)).choice is Choice.MODEL
    assert choose(state(cold, committed=40, room=7)).choice is Choice.PLAIN  # the length limit is near


def test_before_anything_is_measured_a_model_waits_then_starts_to_be_measured():
    unmeasured = ModelState(rate=None, start_seconds=None, started=False, passed=0)
    assert choose(state(unmeasured, committed=MODEL_AFTER_TOKENS - 1, guess=True)).choice is Choice.GUESS
    assert choose(state(unmeasured, committed=MODEL_AFTER_TOKENS)).choice is Choice.MODEL


def test_a_model_predicted_not_to_pay_is_retried_only_in_an_answer_that_runs_on():
    """Its prediction may be of another kind of text: after the wait, in an answer expected to run on, it stops
    waiting and is retried as a model passed over is (every RETRY_EVERY-th round)."""
    slow = ModelState(rate=20.0, start_seconds=0.1, started=False, passed=RETRY_EVERY - 1)
    runs_on = state(slow, committed=MODEL_AFTER_TOKENS, expected_remaining=200.0)
    assert choose(runs_on).choice is Choice.MODEL
    assert choose(replace(runs_on, models=(replace(slow, passed=0),))).passed_over == (0,)
    for waiting in (replace(runs_on, expected_remaining=5.0), replace(runs_on, committed=MODEL_AFTER_TOKENS - 1)):
        decision = choose(waiting)
        assert decision.choice is Choice.PLAIN and decision.passed_over == ()  # waiting is not being passed over


def test_a_started_model_outpaced_by_the_round_without_it_is_retried_every_few_rounds():
    slow = replace(STARTED_FAST, rate=20.0)
    decisions = [choose(state(replace(slow, passed=passed), guess=True)) for passed in range(2 * RETRY_EVERY)]
    assert [d.choice for d in decisions].count(Choice.MODEL) == 2
    assert all(d.passed_over == (0,) for d in decisions)  # every one counts toward the retry
    assert choose(state(replace(slow, passed=RETRY_EVERY - 1))).choice is Choice.MODEL


def test_a_model_outpaced_by_a_later_model_gives_way_to_it():
    cheap, better = replace(STARTED_FAST, rate=30.0), replace(STARTED_FAST, rate=50.0)
    decision = choose(state(cheap, better))
    assert (decision.choice, decision.model, decision.passed_over) == (Choice.MODEL, 1, (0,))
    assert choose(state(cheap, better), after=1).choice is Choice.PLAIN  # the later one proposed nothing


def test_the_last_model_rated_before_any_round_without_it_sits_out_every_few_rounds_to_measure_them():
    decisions = [choose(state(replace(STARTED_FAST, passed=passed), alternative_rate=None))
                 for passed in range(2 * RETRY_EVERY)]
    assert [d.choice for d in decisions].count(Choice.PLAIN) == 2
