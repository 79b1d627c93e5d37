"""Whole-loop exactness: speculative sampling through the engine, caches and rollback included,
produces the target's distribution over 3-token continuations (vocab 4: 64 outcomes).

N = 5*10^4 to 2*10^5 generations per configuration, chi-square at alpha = 1e-6. Marked `statistical`
(a minute or two each on 2 cores); `-m "not statistical"` skips them.
"""

import itertools

import numpy as np
import pytest
import torch

from mock_models import MockLM, MockTokenizer, mock_loaded
from specdec.core import verify
from specdec.core.commit import StopCriteria
from specdec.drafters.combined import CombinedDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.recycle import RecycleDrafter, RecycleOptions
from specdec.engine import SpeculativeEngine
from specdec.core.speculation_length import KSetting
from specdec.core.sampling import SamplingParams, processed_probs
from stats_checks import assert_distribution

PROMPT = [1, 2, 1]
NEW_TOKENS = 3
VOCAB = 4
OUTCOMES = list(itertools.product(range(VOCAB), repeat=NEW_TOKENS))


def exact_law(target: MockLM, params: SamplingParams) -> np.ndarray:
    """P(continuation) = product of the target's processed conditionals."""
    law = []
    for outcome in OUTCOMES:
        prob, prefix = 1.0, tuple(PROMPT)
        for token in outcome:
            probs = processed_probs(target.logits_after(prefix).unsqueeze(0), params, torch.tensor(prefix))[0]
            prob *= float(probs[token])
            prefix += (token,)
        law.append(prob)
    return np.array(law)


def count_outcomes(engine: SpeculativeEngine, params: SamplingParams, seeds: range) -> np.ndarray:
    criteria = StopCriteria(NEW_TOKENS)
    tokenizer = MockTokenizer()
    counts = np.zeros(len(OUTCOMES))
    for seed in seeds:
        ids = engine.generate(PROMPT, params, criteria, tokenizer, seed=seed).token_ids
        counts[ids[0] * 16 + ids[1] * 4 + ids[2]] += 1
    return counts


def _count_in_worker(args) -> np.ndarray:
    kind, k, params, acceptance, seeds = args
    torch.set_num_threads(1)
    return count_outcomes(engine_for(kind, k, acceptance)[0], params, seeds)


def sample_outcomes(kind: str, k, params: SamplingParams, acceptance: str, n: int) -> np.ndarray:
    """n generations with seeds 0..n-1, split over two forked worker processes (CI has 2 cores)."""
    import multiprocessing

    halves = [(kind, k, params, acceptance, range(0, n // 2)), (kind, k, params, acceptance, range(n // 2, n))]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return sum(pool.map(_count_in_worker, halves))


def engine_for(drafter_kind: str, k, acceptance: str = "rejection") -> tuple[SpeculativeEngine, MockLM]:
    target = MockLM(salt=1)
    if drafter_kind == "ngram+draft":  # lookup where the prompt repeats, the sampling draft model elsewhere
        drafter = CombinedDrafter([NgramDrafter(max_ngram=2),
                                   DraftModelDrafter(mock_loaded(MockLM(salt=2, sharpness=1.0), "mock-draft"), VOCAB)])
    elif drafter_kind.startswith("draft"):
        min_confidence = 0.45 if drafter_kind == "draft-early-exit" else 0.0
        drafter = DraftModelDrafter(mock_loaded(MockLM(salt=2, sharpness=1.0), "mock-draft"), VOCAB, min_confidence)
    elif drafter_kind == "ngram":
        drafter = NgramDrafter(max_ngram=2)
    elif drafter_kind.startswith("recycle"):  # deterministic drafts from the target's own earlier rows
        shape = "tree" if drafter_kind == "recycle-tree" else "chain"
        drafter = RecycleDrafter(RecycleOptions(successors=3, shape=shape, width=2, levels=1, shared=0))
    else:
        return SpeculativeEngine(target, None, acceptance=acceptance), target
    return SpeculativeEngine(target, drafter, KSetting.parse(k).new_length(), acceptance), target


# The rejection rule is where a verifier can be subtly wrong (the residual, the draft's reported law), so it
# gets the long runs; under the match rule the text is plain sampling's (tests/test_seeded_sampling.py), and
# these runs check that plain sampling by position-keyed uniforms has the target's law.
# K auto's run, whose K moves between 1 and its maximum, is the longest; fixed K 1 and 2 run half as many.
CONFIGS = [
    ("draft", 1, SamplingParams(temperature=1.0), "rejection", 100_000),
    ("draft", 2, SamplingParams(temperature=1.0), "rejection", 100_000),
    ("draft", "auto", SamplingParams(temperature=1.0), "rejection", 200_000),
    ("ngram", 2, SamplingParams(temperature=1.0), "rejection", 50_000),
    ("ngram+draft", 2, SamplingParams(temperature=1.0), "rejection", 50_000),
    ("recycle", 2, SamplingParams(temperature=1.0), "rejection", 50_000),
    ("recycle-tree", 3, SamplingParams(temperature=1.0), "rejection", 50_000),  # one-hot siblings
    ("draft-early-exit", 3, SamplingParams(temperature=1.0), "rejection", 50_000),
    ("draft", 2, SamplingParams(temperature=0.7, top_k=3, repetition_penalty=1.3), "rejection", 50_000),
    ("plain", 0, SamplingParams(temperature=1.0), "match", 50_000),
    ("draft", 3, SamplingParams(temperature=0.7, top_k=3, repetition_penalty=1.3), "match", 50_000),
]


@pytest.mark.statistical
@pytest.mark.parametrize("kind,k,params,acceptance,n", CONFIGS,
                         ids=[f"{c[0]}-K{c[1]}-{c[2].temperature}-{c[3]}" for c in CONFIGS])
def test_loop_follows_target_distribution(kind, k, params, acceptance, n):
    target = engine_for(kind, k)[1]
    assert_distribution(sample_outcomes(kind, k, params, acceptance, n), exact_law(target, params), tv_bound=0.01,
                        what=f"{kind} K={k} {acceptance}")


def _count_batched_in_worker(args) -> np.ndarray:
    """Generations run 16 at a time in batched rounds (engine.run_round_together) with a tight row budget
    and a pass-cost model, so each generation's K changes from round to round with what runs beside it."""
    from specdec.core.batch_drafts import PassCost
    from specdec.engine import run_round_together

    kind, k, params, acceptance, seeds = args
    torch.set_num_threads(1)
    template, _ = engine_for(kind, k, acceptance)
    criteria, tokenizer = StopCriteria(NEW_TOKENS), MockTokenizer()
    counts, pass_cost, seeds = np.zeros(len(OUTCOMES)), PassCost(), list(seeds)
    for start in range(0, len(seeds), 16):
        batch = []
        for seed in seeds[start:start + 16]:
            engine = SpeculativeEngine(template.target, template.drafter.fresh(), template.speculation, acceptance)
            generation = engine.start(PROMPT, params, criteria, tokenizer, seed=seed)
            generation.begin()
            batch.append(generation)
        while any(not g.finished for g in batch):
            run_round_together([g for g in batch if not g.finished], 24, pass_cost)
        for generation in batch:
            ids = generation.committer.token_ids
            counts[ids[0] * 16 + ids[1] * 4 + ids[2]] += 1
    return counts


@pytest.mark.statistical
def test_sampling_inside_batched_rounds_follows_target_distribution():
    import multiprocessing

    params, n = SamplingParams(temperature=1.0), 16_000
    halves = [("draft", "auto", params, "rejection", range(0, n // 2)),
              ("draft", "auto", params, "rejection", range(n // 2, n))]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        counts = sum(pool.map(_count_batched_in_worker, halves))
    assert_distribution(counts, exact_law(engine_for("draft", "auto")[1], params), what="draft in batched rounds")


@pytest.mark.statistical
def test_a_uniform_reused_across_positions_fails_through_the_loop(monkeypatch):
    """The match rule with one uniform for every position (a counter that ignores the position) couples
    the tokens of a generation: the joint law is wrong although each token's own law is right."""
    from specdec.core.randomness import PositionalNoise

    real = PositionalNoise.uniform
    monkeypatch.setattr(PositionalNoise, "uniform", lambda self, position, purpose, index=0: real(self, 0, purpose))
    engine, target = engine_for("draft", 2, "match")
    params = SamplingParams(temperature=1.0)
    with pytest.raises(AssertionError):
        assert_distribution(count_outcomes(engine, params, range(20_000)), exact_law(target, params))


@pytest.mark.statistical
def test_broken_residual_fails_through_the_loop(monkeypatch):
    monkeypatch.setattr(verify, "residual_distribution", lambda target, draft: target)
    engine, target = engine_for("draft", 2)
    params = SamplingParams(temperature=1.0)
    with pytest.raises(AssertionError):
        assert_distribution(count_outcomes(engine, params, range(20_000)), exact_law(target, params))


@pytest.mark.statistical
def test_unprocessed_draft_probs_fail_through_the_loop(monkeypatch):
    """A drafter that samples from processed probabilities but reports raw ones is caught."""
    import specdec.drafters.draft_model as draft_model

    real = draft_model.processed_probs
    params = SamplingParams(temperature=0.5)

    class LyingDrafter(DraftModelDrafter):
        def propose(self, context, max_tokens, params, noise):
            draft = super().propose(context, max_tokens, params, noise)
            raw = [real(self.model.logits_after(tuple(context) + tuple(draft.tokens[:i])).unsqueeze(0),
                        SamplingParams(temperature=1.0))[0] for i in range(len(draft))]
            draft.draft_probs = torch.stack(raw)
            return draft

    target = MockLM(salt=1)
    liar = LyingDrafter(mock_loaded(MockLM(salt=2), "liar"), VOCAB)
    engine = SpeculativeEngine(target, liar, KSetting.parse(2).new_length(), "rejection")
    with pytest.raises(AssertionError):
        assert_distribution(count_outcomes(engine, params, range(20_000)), exact_law(target, params))
