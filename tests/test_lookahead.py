"""Lookahead decoding: the Jacobi branch's mask against separate forwards, greedy equality through the
engine for several (W, N, G), and the n-gram pool finding accepted tokens."""

import pytest
import torch

from specdec.drafters import make_drafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.engine import with_side_inputs
from specdec.api.generator import SpeculativeGenerator
from specdec.models.base import positions_after, tree_attention_mask
from specdec.models.sources.loading import load_model
from specdec.core.sampling import SamplingParams
from specdec.core.tree import TokenTree
from tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_model(str(save_tiny_model(tmp_path_factory.mktemp("lookahead") / "t", "llama", seed=41)))


def chain_of(mask_row: torch.Tensor, positions: list[int]) -> list[int]:
    """Side tokens a side token sees, in position order (the mask must make it a chain)."""
    seen = torch.nonzero(mask_row).flatten().tolist()
    return sorted(seen, key=lambda j: positions[j])


@pytest.mark.parametrize("window,ngram", [(1, 2), (3, 3), (4, 4), (2, 5)])
def test_combined_forward_equals_separate_forwards(target, window, ngram):
    model = target.model
    prompt = SpeculativeGenerator(target, None).encode("hello the world", chat=False)
    drafter = LookaheadDrafter(window, ngram, pool=2, seed=3)
    drafter.begin(prompt, SamplingParams(), 256)
    drafter.pool[prompt[-1]] = [tuple(prompt[1:ngram]), tuple(prompt[2:ngram + 1])]  # a 2-path tree as well
    draft = drafter.propose(prompt, 8, SamplingParams(), None)
    assert len(draft) > 0 and len(draft.side) == window * (ngram - 1)
    cache = model.new_cache(1, 256)
    head = torch.tensor([prompt[:-1]])
    model.forward(head, positions_after(0, head.shape[1], 1, "cpu"), cache)
    tree = TokenTree.from_draft(draft.tokens, draft.parents)
    tokens, positions, mask = with_side_inputs(draft.side, *tree.verify_inputs(prompt[-1], cache.length))
    combined = model.forward(tokens, positions, cache, tree_attention_mask(cache.length, mask)).logits[0]
    nodes = len(draft) + 1
    # every side token: the target's logits after prefix + root + the chain its mask lets it see
    for i, token in enumerate(draft.side.tokens):
        seen = chain_of(draft.side.mask[i], draft.side.positions)
        assert seen[-1] == i and [draft.side.positions[j] for j in seen] == list(range(1, len(seen) + 1))
        ids = torch.tensor([prompt + [draft.side.tokens[j] for j in seen]])
        alone = model.forward(ids, positions_after(0, ids.shape[1], 1, "cpu"), model.new_cache(1, 256)).logits[0, -1]
        torch.testing.assert_close(combined[nodes + i], alone, atol=2e-4, rtol=1e-4)
    # and the draft nodes are unaffected by the side tokens
    plain_tree = model.new_cache(1, 256)
    model.forward(head, positions_after(0, head.shape[1], 1, "cpu"), plain_tree)
    t_tokens, t_positions, t_mask = tree.verify_inputs(prompt[-1], plain_tree.length)
    alone = model.forward(t_tokens, t_positions, plain_tree, tree_attention_mask(plain_tree.length, t_mask)).logits[0]
    torch.testing.assert_close(combined[:nodes], alone, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("spec", ["lookahead", "lookahead:1,2,1", "lookahead:5,4,6", "lookahead:3,5,2"])
def test_greedy_output_equals_plain_decoding(target, spec):
    plain = SpeculativeGenerator(target, None)
    for prompt in ["hello hello the world", "in the beginning", "x"]:
        drafter = make_drafter(spec, target, "cpu", "float32")
        spec_result = SpeculativeGenerator(target, drafter).generate(prompt, 60, chat=False)
        assert spec_result.token_ids == plain.generate(prompt, 60, chat=False).token_ids


def test_pool_finds_accepted_tokens_on_repetitive_output(target):
    drafter = make_drafter("lookahead:4,3,4", target, "cpu", "float32")
    result = SpeculativeGenerator(target, drafter).generate("hello hello hello hello", 120, chat=False)
    assert result.stats.accepted > 0  # random tiny models loop: their own n-grams come back


@pytest.mark.parametrize("spec", ["lookahead:0,3,4", "lookahead:4,1,4", "lookahead:a"])
def test_bad_lookahead_specs(target, spec):
    from specdec.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError):
        make_drafter(spec, target, "cpu", "float32")
