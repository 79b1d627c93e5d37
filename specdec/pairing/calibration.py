"""What each candidate drafter would gain for a target on this machine, measured in a few seconds.

The target decodes a small built-in mix of code and prose once (greedy, with lookup drafting: the same tokens
as plain decoding), and one forward over 1, 2, 5 and 9 new tokens is timed: the target's decode step and the
line v(K) of verifying K drafts (core/analysis.py). Each candidate then *replays* that decoding as `--k auto`
runs it: its real drafter, its real K-chooser and, for `ngram+draft:MODEL`, the real speculation policy
(drafters/policy.py) decide each round; the drafter proposes after the target's own tokens, its proposals are
timed (its catch-ups apart: a model's start is the policy's call in each answer), and it is told what a
greedy verify would accept (the longest prefix equal to the target's tokens, then the target's next token).
Greedy acceptance depends only on the target's tokens, so the replay needs no target forward: each verify is
priced by the measured line. The predicted speedup is plain decoding's time over the replay's (drafting plus
verifies): the prediction of the drafter that runs, not of another. The mix is replayed twice and the second
pass is predicted: the first gives the drafter what the answers before a user's would (their lengths, a
model's start cost and acceptance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from specdec.models.forward_timing import forward_costs
from jinja2 import TemplateError

from specdec.core.analysis import VerifyCost, fit_verify_slope
from specdec.core.commit import StopCriteria
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import KSetting, SourceLengths, SpeculationLength
from specdec.drafters import Drafter, make_drafter
from specdec.drafters.combined import CombinedDrafter
from specdec.engine import SpeculativeEngine, run_alone, speculation_for
from specdec.models.sources.loading import LoadedModel

# A code edit (the answer repeats its input: lookup's case) and prose (nothing to copy: a model draft's case).
PROMPTS = (
    "Rename `total` to `running_sum` in this function. Reply with the code only.\n```python\ndef mean(values):\n"
    "    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n```",
    "In one paragraph, explain to a new programmer why software teams write automated tests.",
)
REFERENCE_TOKENS = 40  # per prompt
AUTO = KSetting.parse("auto")
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
    """`drafter` (one source, or lookup and a model: CombinedDrafter) decoding the reference as `--k auto`
    runs it."""
    sources = list(drafter.sources) if isinstance(drafter, CombinedDrafter) else [drafter]
    _warm_up(sources, reference.sequences[0][0])
    speculation = speculation_for(drafter, AUTO)
    if isinstance(speculation, SourceLengths):  # a combined drafter: each source its own K, as the engine sets
        drafter.use_source_lengths(speculation)
    for _ in range(REPLAY_PASSES):
        rounds: list[ReplayedRound] = []
        for prompt, continuation in reference.sequences:
            drafter.begin(list(prompt), GREEDY, len(prompt) + len(continuation) + AUTO.max_k + 1)
            rounds += _replay_sequence(drafter, speculation, reference, list(prompt), continuation)
    drafted = sum(r.drafted for r in rounds)
    cost = sum(r.draft_seconds for r in rounds) / drafted / reference.step_seconds if drafted else 0.0
    return Replay(len(rounds), drafted, sum(r.accepted for r in rounds), cost,
                  predicted_speedup(rounds, reference.step_seconds))


@dataclass(frozen=True)
class ReplayedRound:
    drafted: int
    accepted: int
    committed: int  # the target's tokens the round advanced
    draft_seconds: float  # asking the drafter, less its catch-ups
    catch_up_seconds: float  # a model's start (its first proposal's prefill) or catch-up on what others committed
    verify_seconds: float  # priced by the reference's verify line


def predicted_speedup(rounds: Sequence[ReplayedRound], step_seconds: float) -> float:
    """Plain decoding's time for the rounds' tokens (a step each) over the rounds' own: drafting plus verifies.
    Catch-ups are left out: a model's start is paid once an answer, and the policy pays it only in answers
    expected to repay it (its rule 2), so in the answers a pairing is for (long enough to matter) it is small;
    counted here it would weigh as much as 40 tokens' drafting and drop a model that pays in longer ones."""
    seconds = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    return sum(r.committed for r in rounds) * step_seconds / seconds if seconds else 1.0


def _replay_sequence(drafter: Drafter, speculation: SpeculationLength, reference: Reference, context: list[int],
                     continuation: Sequence[int]) -> list[ReplayedRound]:
    """The rounds of one answer, each as the engine runs it (generation.py): K from `speculation`, the draft
    judged, the drafter told, the round observed."""
    done, rounds = 0, []
    while done < len(continuation):
        k = speculation.next_k()
        started = time.perf_counter()
        draft = drafter.propose(context, k, GREEDY, None) if k else Draft.empty()
        seconds = time.perf_counter() - started
        catch_up = drafter.catch_up_seconds if len(draft.tokens) else 0.0
        accepted = _accepted(draft.tokens, continuation[done:])
        committed = list(continuation[done:done + accepted + 1])
        context += committed
        done += len(committed)
        verify = reference.step_seconds * reference.verify(len(draft.tokens))
        if len(draft.tokens):
            drafter.on_verified(context, draft, VerifyResult(len(draft.tokens), list(range(accepted)), committed))
        speculation.observe(len(draft.tokens), accepted, seconds - catch_up, verify, draft.source)
        rounds.append(ReplayedRound(len(draft.tokens), accepted, len(committed), seconds - catch_up, catch_up, verify))
    return rounds


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
