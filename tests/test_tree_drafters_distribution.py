"""Whole-loop exactness of the tree drafters under sampling: EAGLE and Medusa (random heads, so many
rejections at every depth) retrieval (a random datastore) and lookahead
(its Jacobi branch riding along in the verify forward) through the engine reproduce the target's law over 3-token continuations.
A native 4-token-vocabulary model makes the 64 outcomes enumerable; chi-square at alpha = 1e-6 as in
test_loop_distribution. A broken residual rule must fail the same check."""

import itertools

import numpy as np
import pytest
import torch

from head_fixtures import eagle_drafter, medusa_drafter
from mock_models import MockTokenizer
from specdec.core import verify
from specdec.core.commit import StopCriteria
from specdec.drafters.eagle import TreeShape
from specdec.engine import SpeculativeEngine
from specdec.models.base import positions_after
from specdec.models.config import ModelConfig
from specdec.models.llama import LlamaForCausalLM
from specdec.core.sampling import SamplingParams, processed_probs
from specdec.core.speculation_length import FixedK
from stats_checks import assert_distribution

PROMPT = [1, 2, 1, 3]
NEW_TOKENS = 3
VOCAB = 4
OUTCOMES = list(itertools.product(range(VOCAB), repeat=NEW_TOKENS))


def vocab4_target() -> LlamaForCausalLM:
    config = ModelConfig("llama", VOCAB, 32, 64, 2, 4, 2, 8, 1e-6, 64, False, False, False, False)
    torch.manual_seed(5)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.6) if param.dim() > 1 else param.fill_(1.0)
    return model.eval()


def exact_law(model, params: SamplingParams) -> np.ndarray:
    law = []
    for outcome in OUTCOMES:
        prob, prefix = 1.0, list(PROMPT)
        for token in outcome:
            ids = torch.tensor([prefix])
            logits = model.forward(ids, positions_after(0, len(prefix), 1, "cpu"), model.new_cache(1, 16)).logits[0, -1]
            prob *= float(processed_probs(logits.unsqueeze(0), params, torch.tensor(prefix))[0, token])
            prefix.append(token)
        law.append(prob)
    return np.array(law)


def engine_for(kind: str) -> SpeculativeEngine:
    model = vocab4_target()
    if kind == "eagle":
        drafter = eagle_drafter(model, TreeShape(depth=3, top_k=2, budget=5), seed=1)
    elif kind == "medusa":
        drafter = medusa_drafter(model, budget=4, seed=1)
    elif kind == "lookahead":
        from specdec.drafters.lookahead import LookaheadDrafter

        drafter = LookaheadDrafter(window=3, ngram=3, pool=3)
    else:
        from pydivsufsort import divsufsort

        from specdec.heads.datastore import Datastore
        from specdec.drafters.retrieval import RetrievalDrafter

        rng = np.random.default_rng(3)
        tokens = rng.integers(0, VOCAB, 400).astype(np.int32)
        store = Datastore(tokens, divsufsort(tokens.astype(np.uint32)).astype(np.int64), {"separator": VOCAB})
        drafter = RetrievalDrafter(store, "retrieval:random", budget=5, depth=3)
    # the rejection rule, whose residuals a drafter's tree can trip; under the match rule the text is plain
    # sampling's whatever the tree (test_seeded_sampling checks that token for token)
    return SpeculativeEngine(model, drafter, FixedK(drafter.tree_node_budget), "rejection")


def count(kind: str, params: SamplingParams, seeds: range) -> np.ndarray:
    torch.set_num_threads(1)
    engine = engine_for(kind)
    counts = np.zeros(len(OUTCOMES))
    for seed in seeds:
        ids = engine.generate(PROMPT, params, StopCriteria(NEW_TOKENS), MockTokenizer(), seed=seed).token_ids
        counts[ids[0] * 16 + ids[1] * 4 + ids[2]] += 1
    return counts


def _worker(args):
    return count(*args)


def sample(kind: str, params: SamplingParams, n: int) -> np.ndarray:
    import multiprocessing

    halves = [(kind, params, range(0, n // 2)), (kind, params, range(n // 2, n))]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return sum(pool.map(_worker, halves))


CONFIGS = [("eagle", SamplingParams(temperature=1.0), 20_000),
           ("eagle", SamplingParams(temperature=0.7, top_k=3), 10_000),
           ("medusa", SamplingParams(temperature=1.0), 10_000),
           ("retrieval", SamplingParams(temperature=1.0), 10_000),
           ("lookahead", SamplingParams(temperature=1.0), 10_000)]


@pytest.mark.statistical
@pytest.mark.parametrize("kind,params,n", CONFIGS, ids=[f"{c[0]}-{c[1].temperature}" for c in CONFIGS])
def test_tree_drafters_follow_the_target_distribution(kind, params, n):
    assert_distribution(sample(kind, params, n), exact_law(vocab4_target(), params), what=kind)


@pytest.mark.statistical
def test_broken_residual_fails_with_eagle(monkeypatch):
    monkeypatch.setattr(verify, "residual_distribution", lambda target, draft: target)
    params = SamplingParams(temperature=1.0)
    with pytest.raises(AssertionError):
        assert_distribution(count("eagle", params, range(10_000)), exact_law(vocab4_target(), params))
