"""The static forward CUDA graphs capture (models/cuda_graphs.py), run eagerly on the CPU: same logits and
hidden states as the ordinary forward, the same greedy output through the engine, storage pooled per live
cache. Capture and replay themselves need a GPU: tests/test_device.py --device cuda runs every drafter
through them."""

import gc

import pytest
import torch

from head_fixtures import eagle_drafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.api.generator import SpeculativeGenerator
from specdec.models.base import positions_after, tree_attention_mask
from specdec.models.cuda_graphs import MAX_TOKENS, CudaGraphs
from specdec.models.kv_cache import KVCache
from specdec.models.sources.loading import load_model
from tiny_models import save_tiny_model

PROMPT_LENGTH = 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same tiny model twice: plain, and running the graphs' static forward eagerly."""
    path = str(save_tiny_model(tmp_path_factory.mktemp("graphs") / "target", "qwen2", seed=31))
    plain, static = load_model(path), load_model(path)
    static.model.graphs = CudaGraphs(static.model, capture=False)
    return plain, static


def prefilled(model, prompt: torch.Tensor, capacity: int = 64) -> KVCache:
    cache = model.new_cache(1, capacity)
    model.forward(prompt[:, :-1], positions_after(0, prompt.shape[1] - 1, 1, "cpu"), cache, last_logits_only=True)
    return cache


def both(pair, tokens, positions, mask=None, **options):
    prompt = torch.arange(3, 3 + PROMPT_LENGTH).unsqueeze(0)  # (1, P)
    outputs = []
    for loaded in pair:
        cache = prefilled(loaded.model, prompt)
        outputs.append((loaded.model.forward(tokens, positions, cache, mask, **options), cache))
    return outputs


@pytest.mark.parametrize("num_new", [1, 2, 5, MAX_TOKENS])
def test_static_chain_forward_matches(pair, num_new):
    tokens = torch.arange(40, 40 + num_new).unsqueeze(0)
    positions = positions_after(PROMPT_LENGTH - 1, num_new, 1, "cpu")
    (plain, plain_cache), (static, static_cache) = both(pair, tokens, positions, hidden_layers=(0, 2))
    assert static_cache.length == plain_cache.length == PROMPT_LENGTH - 1 + num_new
    torch.testing.assert_close(static.logits, plain.logits, rtol=1e-5, atol=1e-5)
    assert static.hidden_states.keys() == plain.hidden_states.keys() == {0, 2}
    for layer in (0, 2):
        torch.testing.assert_close(static.hidden_states[layer], plain.hidden_states[layer], rtol=1e-5, atol=1e-5)
    written = slice(0, PROMPT_LENGTH - 1 + num_new)  # the new keys sit where the ordinary forward puts them
    torch.testing.assert_close(static_cache.keys[:, :, :, written], plain_cache.keys[:, :, :, written])


def test_static_tree_forward_matches(pair):
    parents = [-1, 0, 0, 1, 1, 2]  # root, two children, grandchildren
    ancestors = torch.eye(6, dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            ancestors[node] |= ancestors[parent]
    depth = ancestors.sum(1) - 1
    tokens = torch.tensor([[50, 51, 52, 53, 54, 55]])
    positions = (PROMPT_LENGTH - 1 + depth).unsqueeze(0)
    mask = tree_attention_mask(PROMPT_LENGTH - 1, ancestors)
    (plain, _), (static, _) = both(pair, tokens, positions, mask, last_logits_only=False)
    torch.testing.assert_close(static.logits, plain.logits, rtol=1e-5, atol=1e-5)


def test_prefills_take_the_ordinary_forward_and_small_forwards_the_static_one(pair, monkeypatch):
    static = pair[1].model
    static.graphs.storages.clear()  # a fresh storage (pooled ones remember what earlier tests ran)
    prompt = torch.arange(3, 3 + MAX_TOKENS + 5).unsqueeze(0)
    cache = prefilled(static, prompt)  # more than MAX_TOKENS new tokens: the ordinary forward
    storage = static.graphs._storage_of(cache)
    assert storage is not None and storage.seen == set()  # the static path never saw it
    step = torch.tensor([[7]])
    static.forward(step, positions_after(cache.length, 1, 1, "cpu"), cache)
    assert storage.seen == {(1, (), False)}  # a decode step did (and a GPU would capture it the next time)
    monkeypatch.setattr(static.graphs, "_capture", lambda *args: pytest.fail("captured without CUDA"))
    static.forward(step, positions_after(cache.length, 1, 1, "cpu"), cache)
    assert not storage.graphs and static.graphs.replays == 0


@pytest.mark.parametrize("drafter", ["none", "ngram", "draft-self", "lookahead", "eagle"])
def test_greedy_output_matches_plain_decoding(pair, drafter):
    plain, static = pair
    made = {"none": lambda: None, "ngram": NgramDrafter, "lookahead": lambda: LookaheadDrafter(4, 3, 4),
            "draft-self": lambda: DraftModelDrafter(static, static.model.vocab_size),
            "eagle": lambda: eagle_drafter(static.model)}[drafter]
    for prompt in ["hello hello the world", "in the beginning"]:
        expected = SpeculativeGenerator(plain, None).generate(prompt, 40, chat=False).token_ids
        got = SpeculativeGenerator(static, made(), 4).generate(prompt, 40, chat=False).token_ids
        assert got == expected


def test_storage_is_pooled_per_live_cache(pair):
    graphs = pair[1].model.graphs
    graphs.storages.clear()
    first, second = graphs.new_cache(100), graphs.new_cache(100)
    assert first.keys is not second.keys  # two live caches, two storages
    assert first.max_length == 100 and first.keys.shape[3] >= 100 + MAX_TOKENS  # + scratch for warm-ups
    keys = first.keys
    del first
    gc.collect()
    third = graphs.new_cache(90)  # the same size class reuses the freed storage, empty
    assert third.keys is keys and third.length == 0 and len(graphs.storages) == 2
    big = graphs.new_cache(5000)  # another size: free storage of other sizes is dropped first
    assert big.keys.shape[3] >= 5000 + MAX_TOKENS and len(graphs.storages) == 3
    del third
    gc.collect()
    bigger = graphs.new_cache(6000)  # the same size class as `big`, which is alive: a new storage
    assert bigger.keys is not big.keys
    assert [s.keys.shape[3] for s in graphs.storages] == [1024, 8192, 8192]  # the freed 1024 went
    assert all(s.keys is not keys for s in graphs.storages)


def test_cache_over_storage_checks_room():
    keys = torch.zeros(2, 1, 2, 16, 8)
    with pytest.raises(ValueError, match="cannot hold"):
        KVCache.over(keys, keys.clone(), 17)
    assert KVCache.over(keys, keys.clone(), 16).length == 0
