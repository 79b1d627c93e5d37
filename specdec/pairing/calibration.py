"""What each candidate drafter would gain for a target on this machine, measured in a few seconds.

The target decodes a small built-in mix of code and prose once (greedy, with lookup drafting: the same tokens
as plain decoding), and one forward over 1, 2, 5 and 9 new tokens is timed: the target's decode step and the
line v(K) of verifying K drafts (core/analysis.py). Each candidate then *replays* that decoding: its real
drafter proposes after the target's own tokens, and for `ngram+draft:MODEL` the real speculation policy
(drafters/policy.py, fed by the per-source fits `--k auto` keeps) decides which source drafts each round, so
the prediction is of the drafter that runs. Its proposals are timed (catch-ups apart: a model's start is the
policy's call in each answer) and it is told what a greedy verify would accept (the longest prefix equal to
the target's tokens, then the target's next token). Greedy acceptance depends only on the target's tokens, so
the replay needs no target forward. The cost model turns each kind of source's rounds (acceptance per
position, draft cost in target steps) into the speedup of its best K, and the kinds' speedups combine by the
share of the output each covered. The mix is replayed twice and the second pass is predicted: the first gives
the drafter what the answers before a user's would (their lengths, a model's start cost and acceptance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Hashable, Sequence

from specdec.models.forward_timing import forward_costs
from jinja2 import TemplateError

from specdec.core.analysis import VerifyCost, best_k, fit_verify_slope
from specdec.core.commit import StopCriteria
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import FixedK, KSetting, SourceLengths, SpeculationLength
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
AUTO = KSetting.parse("auto")
# Draft lengths the replay asks of each kind of source: long enough to measure acceptance at each position a
# best K may reach (a lookup's copy runs long, a model's guesses do not). AdaptiveK converges to its K over more
# rounds than a calibration's 80 tokens hold, so the replay measures and the cost model takes the best K.
MEASURED_K = {"verbatim": 8, "guess": 8, "draft": 4}
# Passes over the mix: the first stands for the answers before a user's (the drafter learns their lengths, a
# model's start cost and acceptance, as a served drafter does); the last is the prediction.
REPLAY_PASSES = 2
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
    """`drafter` (one source, or lookup and a model: CombinedDrafter) decoding the reference, each round's
    source chosen as the drafter that runs chooses it."""
    sources = list(drafter.sources) if isinstance(drafter, CombinedDrafter) else [drafter]
    _warm_up(sources, reference.sequences[0][0])
    if isinstance(drafter, CombinedDrafter):
        speculation: SpeculationLength = MeasuringLengths(AUTO.max_k)
        drafter.use_source_lengths(speculation)
    else:
        speculation = FixedK(MEASURED_K["guess" if isinstance(drafter, LookupSource) else "draft"])
    for _ in range(REPLAY_PASSES):
        rounds: list[ReplayedRound] = []
        for prompt, continuation in reference.sequences:
            drafter.begin(list(prompt), GREEDY, len(prompt) + len(continuation) + AUTO.max_k + 1)
            rounds += _replay_sequence(drafter, speculation, reference, list(prompt), continuation)
    drafted = sum(r.stats.drafted for r in rounds)
    cost = sum(r.stats.draft_seconds for r in rounds) / drafted / reference.step_seconds if drafted else 0.0
    return Replay(len(rounds), drafted, sum(r.stats.accepted for r in rounds), cost,
                  predicted_speedup(rounds, reference))


class MeasuringLengths(SourceLengths):
    """The per-source K-chooser of `--k auto` (its fits decide which source drafts, through the policy), asked
    for each kind's MEASURED_K instead of its own K: acceptance is then measured at every position a best K may
    reach, and the prediction takes each source's best K from it."""

    def next_k_for(self, source: Hashable, min_k: int = 0) -> int:
        super().next_k_for(source, min_k)  # its history, as the engine's rounds keep it
        return MEASURED_K[source[1]]


@dataclass(frozen=True)
class ReplayedRound:
    source: str  # the kind of source that drafted ("verbatim", "guess", "draft"; "none": nothing proposed)
    stats: RoundStats  # draft seconds less catch-ups; committed: the target's tokens the round advanced


def predicted_speedup(rounds: Sequence[ReplayedRound], reference: Reference) -> float:
    """The cost model per source (core/analysis.py): each kind of source's acceptance per position and draft
    cost give its best K and its tokens per unit of time, as `--k auto` converges to them; the sources' speedups
    combine weighted by the share of the output each covered (rounds without a proposal: one token a step).
    Catch-ups are left out: a model's start is paid once an answer, and the policy pays it only in answers
    expected to repay it (its rule 2)."""
    total = sum(r.stats.committed for r in rounds)
    time_per_token = 0.0  # in target steps
    for source in dict.fromkeys(r.source for r in rounds):
        mine = [r.stats for r in rounds if r.source == source]
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


def _replay_sequence(drafter: Drafter, speculation: SpeculationLength, reference: Reference, context: list[int],
                     continuation: Sequence[int]) -> list[ReplayedRound]:
    """The rounds of one answer, each as the engine runs it (generation.py): the drafter proposes, the draft is
    judged, the drafter told, the round observed (verifies priced by the reference's line)."""
    done, rounds = 0, []
    while done < len(continuation):
        k = speculation.next_k()
        started = time.perf_counter()
        draft = drafter.propose(context, k, GREEDY, None)
        seconds = time.perf_counter() - started
        catch_up = drafter.catch_up_seconds if len(draft.tokens) else 0.0
        accepted = _accepted(draft.tokens, continuation[done:])
        committed = list(continuation[done:done + accepted + 1])
        context += committed
        done += len(committed)
        if len(draft.tokens):
            drafter.on_verified(context, draft, VerifyResult(len(draft.tokens), list(range(accepted)), committed))
        verify = reference.step_seconds * reference.verify(len(draft.tokens))
        speculation.observe(len(draft.tokens), accepted, seconds - catch_up, verify, draft.source)
        kind = _kind(drafter, draft)
        rounds.append(ReplayedRound(kind, RoundStats(len(draft.tokens), len(draft.tokens), accepted, len(committed),
                                                     seconds - catch_up, verify, 0.0)))
    return rounds


def _kind(drafter: Drafter, draft: Draft) -> str:
    if not len(draft.tokens):
        return "none"
    if draft.source is not None:
        return draft.source[1]  # a combined drafter's (source index, kind)
    return "guess" if isinstance(drafter, LookupSource) else "draft"


def _accepted(drafted: Sequence[int], truth: Sequence[int]) -> int:
    for index, (token, expected) in enumerate(zip(drafted, truth)):
        if token != expected:
            return index
    return min(len(drafted), len(truth))


def _warm_up(sources: list[Drafter], prompt: Sequence[int]) -> None:
    """One untimed proposal per source: first calls page weights in and build kernels' buffers."""
    for source in sources:
        source.begin(list(prompt), GREEDY, len(prompt) + AUTO.max_k + 1)
        source.propose(list(prompt), 2, GREEDY, None)
