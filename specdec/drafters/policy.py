"""The speculation policy of a combined drafter (`ngram+draft:MODEL`): which source drafts a round.

A pure function of the round's state (`RoundState`: what lookup offers this round, each model's rate and start
cost, the tokens committed and expected to come) to the round's decision (`Decision`). The combined drafter
(combined.py) gathers the state and acts on the decision each round; nothing else here keeps state, so a
newcomer can check any decision by hand with the rules below.

Rates are tokens committed per second (`R`): for `k="auto"` each source's AdaptiveK predicts its own at its
best K from its fitted acceptance per position and its measured draft and verify costs (core/analysis.py);
with a fixed K they are measured over recent rounds. The alternative to a model (`R0`) is this round without
one: lookup's weak guess if it has one, else a plain step.

1. A lookup's verbatim copy of a long run of the context drafts first: it costs nothing and is rarely wrong.
2. A model that has not started in this answer starts where what it saves repays its start (the prefill of
   its window, `S` seconds, measured at its last start): with `r` tokens expected still to come,

       r * (1/R0 - 1/R) >= S

   `r` is what recent answers that ran as long as this one added after this point (`AnswerLengths`), or, in
   an answer longer than all but one of them, as many as it has committed (ski rental: the start is paid
   once decoding without it has lost as much); never more than the room left. Before anything is measured
   (a first answer, a new model) it waits `model_after_tokens` committed tokens (lookup drafts meanwhile and
   measures `R0`), then starts: there is no other way to measure it. A model predicted not to pay is also
   tried after that wait in an answer expected to run on, since its prediction may be of another kind of text.
3. A started model drafts unless a later model, or for the last model `R0`, is rated higher; a model passed
   over is tried every `RETRY_EVERY` rounds, so one that starts paying is taken again.
4. Otherwise lookup's weak guess drafts, else the round is a plain step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

RETRY_EVERY = 8  # a model passed over is tried again after this many rounds it was passed over
# Committed tokens before a never-measured model is asked: a prefill of its window costs several target steps,
# which an answer of a dozen tokens never repays; lookup measures the rounds without a model meanwhile.
MODEL_AFTER_TOKENS = 16


class Choice(Enum):
    VERBATIM = "verbatim"  # a lookup's long verbatim copy of the context
    MODEL = "model"  # a draft model (Decision.models says which, in the order to ask them)
    GUESS = "guess"  # a lookup's weaker guess (a short match)
    PLAIN = "plain"  # no draft: one target step


@dataclass(frozen=True)
class ModelState:
    """One draft model, as the round sees it."""

    rate: float | None  # R: tokens per second it commits (None: not measured yet)
    start_seconds: float | None  # S: its last start's prefill (None: never started)
    started: bool  # it has proposed in this answer
    passed: int  # rounds it was passed over so far in this answer


@dataclass(frozen=True)
class RoundState:
    committed: int  # tokens committed in this answer
    expected_remaining: float | None  # what recent answers as long as this one added (None: it outran them)
    room: int  # tokens left before the length limit
    verbatim: bool  # a lookup copies a long run of the context this round
    guess: bool  # a lookup has a weaker guess this round
    alternative_rate: float | None  # R0: this round without a model (the guess's rate, or a plain step's)
    models: tuple[ModelState, ...]  # cheapest first
    model_after_tokens: int = MODEL_AFTER_TOKENS


@dataclass(frozen=True)
class Decision:
    choice: Choice
    model: int | None = None  # for Choice.MODEL: which model drafts
    passed_over: tuple[int, ...] = ()  # models whose `passed` count grows by one this round
    fallback: Choice = Choice.PLAIN  # where the chosen source proposes nothing: GUESS if the round has one


def choose(state: RoundState, after: int = -1) -> Decision:
    """The round's decision (the module's rules 1-4), among the models after index `after`: where the model
    chosen proposes nothing, the caller asks again after it."""
    fallback = Choice.GUESS if state.guess else Choice.PLAIN
    if state.verbatim:
        return Decision(Choice.VERBATIM, fallback=fallback)
    counted = []
    for index, model in enumerate(state.models):
        if index <= after:
            continue
        if not model.started and waits(state, model):
            continue
        counts, skipped = passes_over(state, index)
        if counts:
            counted.append(index)
        if not skipped:
            return Decision(Choice.MODEL, index, tuple(counted), fallback)
    return Decision(fallback, None, tuple(counted), fallback)


def expected_tokens_to_come(state: RoundState) -> float:
    """r: the tokens this answer is expected still to add (rule 2)."""
    remaining = state.committed if state.expected_remaining is None else state.expected_remaining
    return min(remaining, state.room)


def waits(state: RoundState, model: ModelState) -> bool:
    """Whether a model not started in this answer waits another round (rule 2)."""
    own, alternative, start = model.rate, state.alternative_rate, model.start_seconds
    if start is None or own is None or alternative is None:
        return state.committed < state.model_after_tokens  # nothing to predict by: wait, then measure it
    remaining = expected_tokens_to_come(state)
    if own <= alternative:  # predicted not to pay: tried after the wait in an answer that runs on
        return state.committed < state.model_after_tokens or remaining < state.model_after_tokens
    return remaining * (1.0 / alternative - 1.0 / own) < start


def passes_over(state: RoundState, index: int) -> tuple[bool, bool]:
    """(whether the round counts toward model `index`'s retry, whether it is passed over now) by rule 3: a model
    rated below a later model or, if it is the last, below this round without a model, is passed over but
    for every RETRY_EVERY-th such round. The last model, once rated while the rounds without it are not, is
    passed over every RETRY_EVERY-th round instead: otherwise nothing would ever measure those rounds."""
    model = state.models[index]
    retry_turn = (model.passed + 1) % RETRY_EVERY == 0
    last = index == len(state.models) - 1
    if last and model.rate is not None and state.alternative_rate is None:
        return True, retry_turn
    later = [other.rate for other in state.models[index + 1:]] + ([state.alternative_rate] if last else [])
    rated = [rate for rate in later if rate is not None]
    if model.rate is None or not rated or model.rate >= max(rated):
        return False, False
    return True, not retry_turn
