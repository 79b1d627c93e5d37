"""What each candidate drafter would gain for a target on this machine, measured in a few seconds.

The target decodes a small built-in mix of code and prose once (greedy, with lookup drafting: the same tokens
as plain decoding), and one forward over 1, 2, 5 and 9 new tokens is timed: the target's decode step and the
line v(K) of verifying K drafts (core/analysis.py). Each candidate then *replays* that decoding: its real
drafter proposes after the target's own tokens, is told what a greedy verify would accept (the longest prefix
equal to the target's tokens, then the target's next token), and its proposals are timed. Greedy acceptance
depends only on the target's tokens, so the replay needs no target forward: a candidate costs its drafting
only. The cost model turns the rounds into a predicted speedup: the target's tokens at one step each, over
the rounds' draft seconds plus a verify of each round's length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from specdec.models.forward_timing import forward_costs
from jinja2 import TemplateError

from specdec.core.analysis import VerifyCost, best_k, fit_verify_slope
from specdec.core.commit import StopCriteria
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import KSetting
from specdec.core.stats import RoundStats, acceptance_per_position
from specdec.drafters import Drafter, make_drafter
from specdec.drafters.combined import CombinedDrafter, LookupSource
from specdec.engine import SpeculativeEngine, run_alone
from specdec.models.sources.loading import LoadedModel

# A code edit (the answer repeats its input: lookup's case) and prose (nothing to copy: a model draft's case).
PROMPTS = (
    "Rename `total` to `running_sum` in this function. Reply with the code only.\n```python\ndef mean(values):\n"
    "    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n```",
    "In one paragraph, explain to a new programmer why software teams write automated tests.",
)
REFERENCE_TOKENS = 40  # per prompt
LOOKUP_K, MODEL_K = 8, 4  # draft lengths in the replay: a verbatim copy runs long, a model's guesses do not
FORWARD_SIZES = (1, 2, 5, 9)
FORWARD_CONTEXT = 32
GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class Reference:
    """The target's own greedy decoding of the prompts, and what its forwards cost here."""

    sequences: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (prompt ids, the target's continuation)
    step_seconds: float  # one decode step
    verify: VerifyCost  # a forward over K + 1 new tokens, in steps


@dataclass(frozen=True)
class Replay:
    """One candidate's replay: its rounds, and what the cost model predicts from them."""

    rounds: int
    drafted: int
    accepted: int
    draft_cost: float  # seconds drafting one token / one target step
    predicted_speedup: float

    @property
    def agreement(self) -> float:
        """The share of drafted tokens the target's decoding accepts."""
        return self.accepted / self.drafted if self.drafted else 0.0


def measure_reference(target: LoadedModel, device: str, dtype: str) -> Reference:
    engine = SpeculativeEngine(target.model, make_drafter("ngram", target, device, dtype), KSetting.parse("auto").new_length())
    stop = StopCriteria(REFERENCE_TOKENS, frozenset(target.eos_token_ids))
    sequences = []
    for prompt in PROMPTS:
        ids = _encode(target, prompt)
        generation = engine.start(ids, GREEDY, stop, target.tokenizer)
        sequences.append((tuple(ids), tuple(token for chunk in run_alone(generation) for token in chunk.token_ids)))
    # timed after a short context: prefilling a long one would cost more than the timing, and the ratio of a
    # verify to a step moves little over the first hundreds of tokens
    costs = forward_costs(target.model, context=FORWARD_CONTEXT, sizes=FORWARD_SIZES, repeats=3)
    slope = fit_verify_slope([(cost.num_tokens - 1, cost.ratio, 1.0) for cost in costs[1:]])
    return Reference(tuple(sequences), costs[0].seconds, VerifyCost(slope=slope))


def _encode(target: LoadedModel, prompt: str) -> list[int]:
    """The prompt as a user's chat turn where the model has a template that renders it, else as text."""
    if target.has_chat_template:
        try:
            ids = target.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                       add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        except TemplateError:
            pass
    return list(target.tokenizer.encode(prompt, add_special_tokens=True))


def replay(drafter: Drafter, reference: Reference) -> Replay:
    """`drafter` (one source, or lookup before a model: CombinedDrafter) proposing along the reference."""
    sources = list(drafter.sources) if isinstance(drafter, CombinedDrafter) else [drafter]
    _warm_up(sources, reference.sequences[0][0])
    rounds: list[_Round] = []
    for prompt, continuation in reference.sequences:
        for source in sources:
            source.begin(list(prompt), GREEDY, len(prompt) + len(continuation) + LOOKUP_K + 1)
        rounds += _replay_sequence(sources, list(prompt), continuation)
    drafted = sum(r.stats.drafted for r in rounds)
    cost = sum(r.stats.draft_seconds for r in rounds) / drafted / reference.step_seconds if drafted else 0.0
    return Replay(len(rounds), drafted, sum(r.stats.accepted for r in rounds), cost,
                  predicted_speedup(rounds, reference))


@dataclass(frozen=True)
class _Round:
    source: str  # "lookup", "model" or "none" (nothing proposed)
    stats: RoundStats  # draft seconds without catch-ups; committed: the target's tokens the round advanced


def predicted_speedup(rounds: Sequence[_Round], reference: Reference) -> float:
    """The cost model per source (core/analysis.py): each source's acceptance per position and draft cost give
    its best K and its tokens per unit of time, as `--k auto` would pick them; the sources' speedups combine
    weighted by the share of the output each covered (rounds without a proposal: one token a step)."""
    total = sum(r.stats.committed for r in rounds)
    time_per_token = 0.0  # in target steps
    for source in ("lookup", "model", "none"):
        mine = [r.stats for r in rounds if r.source == source]
        if not mine:
            continue
        share = sum(r.committed for r in mine) / total
        drafted = sum(r.drafted for r in mine)
        if source == "none" or not drafted:
            time_per_token += share
            continue
        cost = sum(r.draft_seconds for r in mine) / drafted / reference.step_seconds
        alphas = acceptance_per_position(mine) or [0.0]
        _, speedup = best_k(alphas, cost, reference.verify, max(r.k for r in mine))
        time_per_token += share / speedup
    return 1.0 / time_per_token


def _replay_sequence(sources: list[Drafter], context: list[int], continuation: Sequence[int]) -> list[_Round]:
    done, rounds = 0, []
    while done < len(continuation):
        source, draft, seconds, catch_up = _propose(sources, context)
        accepted = _accepted(draft.tokens, continuation[done:])
        committed = list(continuation[done:done + accepted + 1])
        context += committed
        done += len(committed)
        if source is not None:
            source.on_verified(context, draft, VerifyResult(len(draft.tokens), list(range(accepted)), committed))
        k = 0 if source is None else (LOOKUP_K if isinstance(source, LookupSource) else MODEL_K)
        kind = "none" if source is None else ("lookup" if isinstance(source, LookupSource) else "model")
        rounds.append(_Round(kind, RoundStats(k, len(draft.tokens), accepted, len(committed), seconds - catch_up,
                                              0.0, 0.0)))
    return rounds


def _propose(sources: list[Drafter], context: list[int]) -> tuple[Drafter | None, Draft, float, float]:
    """(the source that drafted, its draft, seconds spent asking, of which catching up): a lookup's
    verbatim copy first, else the model after it (a lookup alone drafts whatever it finds)."""
    seconds = 0.0
    for source in sources:
        lookup = isinstance(source, LookupSource)
        started = time.perf_counter()
        draft = source.propose(context, LOOKUP_K if lookup else MODEL_K, GREEDY, None)
        seconds += time.perf_counter() - started
        usable = len(draft.tokens) and (not lookup or len(sources) == 1 or source.proposal_is_verbatim())
        if usable:
            return source, draft, seconds, source.catch_up_seconds
    return None, Draft.empty(), seconds, 0.0


def _accepted(drafted: Sequence[int], truth: Sequence[int]) -> int:
    for index, (token, expected) in enumerate(zip(drafted, truth)):
        if token != expected:
            return index
    return min(len(drafted), len(truth))


def _warm_up(sources: list[Drafter], prompt: Sequence[int]) -> None:
    """One untimed proposal per source: first calls page weights in and build kernels' buffers."""
    for source in sources:
        source.begin(list(prompt), GREEDY, len(prompt) + LOOKUP_K + 1)
        source.propose(list(prompt), 2, GREEDY, None)
