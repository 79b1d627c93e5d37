"""Cache rollback and compaction equal recomputing from scratch, natively and through transformers."""

import pytest
import torch

from specdec.kernels import packed_kernel
from specdec.models.base import positions_after, tree_attention_mask
from specdec.models.hf_adapter import HFCausalLM
from test_native_decoder import native_from_hf
from tiny_models import VOCAB, make_hf_model

TOLERANCE = 1e-4


@pytest.fixture(params=["native", "native-packed", "transformers"])
def model(request):
    hf = make_hf_model("qwen2", seed=2)
    if request.param == "transformers":
        return HFCausalLM(hf)
    if request.param == "native-packed" and packed_kernel() is None:
        pytest.skip("no packed kernel on this machine")
    return native_from_hf(hf, packed=request.param == "native-packed")


def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits after `tokens`, computed from an empty cache."""
    cache = model.new_cache(1, 64)
    return model.forward(torch.tensor([tokens]), positions_after(0, len(tokens), 1, "cpu"), cache).logits[0, -1]


def test_truncate_equals_recompute(model):
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, VOCAB, (12,), generator=gen).tolist()
    rejected = torch.randint(0, VOCAB, (5,), generator=gen).tolist()
    nxt = torch.randint(0, VOCAB, (2,), generator=gen).tolist()
    cache = model.new_cache(1, 64)
    model.forward(torch.tensor([prefix + rejected]), positions_after(0, 17, 1, "cpu"), cache)
    cache.truncate(12)
    assert cache.length == 12
    out = model.forward(torch.tensor([nxt]), positions_after(12, 2, 1, "cpu"), cache).logits[0, -1]
    assert (out - fresh_logits(model, prefix + nxt)).abs().max() < TOLERANCE


def test_compact_keeps_accepted_tree_path(model):
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, VOCAB, (9,), generator=gen).tolist()
    parents = [-1, 0, 0, 2, 1, 3]  # accepted path: 0 -> 2 -> 3 -> 5
    nodes = torch.randint(0, VOCAB, (len(parents),), generator=gen).tolist()
    ancestors = torch.zeros(6, 6, dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        if p >= 0:
            ancestors[i] = ancestors[p]
        ancestors[i, i] = True
        depth.append(0 if p < 0 else depth[p] + 1)
    cache = model.new_cache(1, 64)
    model.forward(torch.tensor([prefix]), positions_after(0, 9, 1, "cpu"), cache)
    model.forward(torch.tensor([nodes]), torch.tensor([[9 + d for d in depth]]), cache,
                  attn_mask=tree_attention_mask(9, ancestors))
    path = [0, 2, 3, 5]
    cache.compact(9, [9 + i for i in path])
    assert cache.length == 13
    nxt = [7]
    out = model.forward(torch.tensor([nxt]), positions_after(13, 1, 1, "cpu"), cache).logits[0, -1]
    assert (out - fresh_logits(model, prefix + [nodes[i] for i in path] + nxt)).abs().max() < TOLERANCE


def test_bad_rollback_is_refused(model):
    cache = model.new_cache(1, 8)
    model.forward(torch.tensor([[1, 2, 3]]), positions_after(0, 3, 1, "cpu"), cache)
    with pytest.raises(ValueError):
        cache.truncate(4)
    with pytest.raises(ValueError):
        cache.compact(1, [0])
    with pytest.raises(ValueError, match="full"):
        model.forward(torch.tensor([[1] * 6]), positions_after(3, 6, 1, "cpu"), cache)
