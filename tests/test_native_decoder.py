"""The native decoder equals transformers' forward on the same weights."""

import pytest
import torch

from specdec.kernels import packed_kernel
from specdec.models.base import positions_after, tree_attention_mask
from specdec.models.config import ModelConfig
from specdec.models.fused_checkpoints import split_fused_projections
from specdec.models.attention import ROW_BY_ROW_MAX
from specdec.models.llama import LlamaForCausalLM
from specdec.core.tree import TokenTree
from tiny_models import VOCAB, make_hf_model

TOLERANCE = 1e-4
VARIANTS = [
    ("llama", {}),
    ("llama3", {}),  # Llama-3 rope scaling
    ("qwen2", {}),  # qkv bias, tied embeddings
    ("mistral", {}),
    ("mistral", {"sliding_window": 8}),  # every layer sliding
    ("llama", {"num_key_value_heads": 4}),  # MHA
    ("llama", {"num_key_value_heads": 1}),  # MQA
    ("llama", {"attention_bias": True}),
    ("qwen3", {}),  # per-head query/key norms
    ("qwen3", {"head_dim": 32}),  # heads wider than hidden / heads, as Qwen3's own configs have
    ("llama3", {"tie_word_embeddings": True}),  # Llama 3.2: llama3 rope scaling, tied embeddings
    ("gemma3", {}),  # Gemma 3: sliding window (8, crossed by the contexts below), norms around attention and MLP
    ("gemma3", {"query_pre_attn_scalar": 24, "final_logit_softcapping": 30.0}),
    ("qwen3_moe", {}),  # a router picking 2 of 4 experts a token, renormalized; one dense layer
    ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": []}),
    ("phi3", {}),  # Phi-4-mini's shape: fused projections, partial rotary, longrope's factors and scale
    # Phi-3-mini-4k's: every dimension rotated, no rope scaling, a window (8, crossed below), untied
    ("phi3", {"partial_rotary_factor": 1.0, "rope_scaling": None, "sliding_window": 8, "tie_word_embeddings": False}),
    # gpt-oss: attention sinks, a window (8) on every other layer, YaRN, a biased router softmaxed over its
    # picks, biased experts with the clamped SwiGLU
    ("gpt_oss", {}),
]


def native_from_hf(hf_model, packed: bool = False) -> LlamaForCausalLM:
    native = LlamaForCausalLM(ModelConfig.from_hf_dict(hf_model.config.to_dict()))
    native.load_state_dict(split_fused_projections(hf_model.state_dict(), native.config), strict=False)
    if native.config.tie_word_embeddings:
        native.lm_head.weight = native.model.embed_tokens.weight
    if packed:
        native.pack_weights()
    return native.eval()


LAYOUTS = ["stock"] + (["packed"] if packed_kernel() is not None else [])


@pytest.fixture(params=[(v, layout) for v in VARIANTS for layout in LAYOUTS],
                ids=lambda p: f"{p[1]}-{p[0][0]}-{'-'.join(f'{k}={x}' for k, x in p[0][1].items())}")
def pair(request):
    (kind, overrides), layout = request.param
    hf = make_hf_model(kind, seed=1, **overrides)
    with torch.no_grad():  # norms away from their initial ones, so a norm that does not load is caught
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    return hf, native_from_hf(hf, packed=layout == "packed")


def test_prefill_and_decode_match_transformers(pair):
    hf, native = pair
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(tokens).logits  # (2, 24, V)
    cache = native.new_cache(2, 64)
    prefill = native(tokens[:, :20], positions_after(0, 20, 2, "cpu"), cache).logits
    steps = [native(tokens[:, i:i + 1], positions_after(i, 1, 2, "cpu"), cache).logits for i in range(20, 24)]
    assert (prefill - reference[:, :20]).abs().max() < TOLERANCE
    assert (torch.cat(steps, 1) - reference[:, 20:]).abs().max() < TOLERANCE


def test_long_first_prefill_takes_the_causal_kernel_and_matches(pair):
    """A first prefill longer than the row-by-row range runs torch's causal attention (no mask tensor); a
    prefill after cached tokens builds the mask. Both match transformers."""
    hf, native = pair
    tokens = torch.randint(0, VOCAB, (1, ROW_BY_ROW_MAX + 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = hf(tokens).logits
    cache = native.new_cache(1, 128)
    first = native(tokens[:, :ROW_BY_ROW_MAX + 10], positions_after(0, ROW_BY_ROW_MAX + 10, 1, "cpu"), cache).logits
    rest = native(tokens[:, ROW_BY_ROW_MAX + 10:], positions_after(ROW_BY_ROW_MAX + 10, 20, 1, "cpu"), cache).logits
    assert (torch.cat([first, rest], 1) - reference).abs().max() < TOLERANCE


def test_tree_masked_forward_matches_each_path(pair):
    """One tree forward gives each node the logits of a plain forward along its own path."""
    hf, native = pair
    prefix = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    # tree: 0 -> (1 -> 3, 2 -> 4 -> 5)
    parents = [-1, 0, 0, 1, 2, 4]
    nodes = torch.randint(0, VOCAB, (1, len(parents)), generator=torch.Generator().manual_seed(2))
    ancestors = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        ancestors[i] = ancestors[p] if p >= 0 else False
        ancestors[i, i] = True
        depth.append(0 if p < 0 else depth[p] + 1)
    cache = native.new_cache(1, 64)
    native(prefix, positions_after(0, 10, 1, "cpu"), cache)
    positions = torch.tensor([[10 + d for d in depth]])
    tree_logits = native(nodes, positions, cache, attn_mask=tree_attention_mask(10, ancestors)).logits[0]
    for i in range(len(parents)):
        path = [j for j in range(len(parents)) if ancestors[i, j]]
        with torch.no_grad():
            reference = hf(torch.cat([prefix, nodes[:, path]], 1)).logits[0, -1]
        assert (tree_logits[i] - reference).abs().max() < TOLERANCE


def test_hidden_state_taps(pair):
    hf, native = pair
    tokens = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = hf(tokens, output_hidden_states=True).hidden_states
    layers = native.config.num_layers
    out = native(tokens, positions_after(0, 8, 1, "cpu"), native.new_cache(1, 16), hidden_layers=(0, layers))
    assert (out.hidden_states[0] - reference[1]).abs().max() < TOLERANCE
    assert (out.hidden_states[layers] - reference[-1]).abs().max() < TOLERANCE


def test_last_logits_only(pair):
    _, native = pair
    tokens = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(4))
    full = native(tokens, positions_after(0, 8, 1, "cpu"), native.new_cache(1, 16)).logits
    last = native(tokens, positions_after(0, 8, 1, "cpu"), native.new_cache(1, 16), last_logits_only=True).logits
    assert last.shape[1] == 1
    assert (last[:, 0] - full[:, -1]).abs().max() < TOLERANCE  # 1-row and 8-row matmuls round differently


def test_unsupported_architecture_is_refused():
    from specdec.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="gpt2"):
        ModelConfig.from_hf_dict({"model_type": "gpt2"})
    with pytest.raises(UnsupportedModelError, match="dynamic"):
        ModelConfig.from_hf_dict({**make_hf_model("llama").config.to_dict(),
                                  "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}})


@pytest.mark.skipif(packed_kernel() is None, reason="bit-identical rows need the CPU kernels")
@pytest.mark.parametrize("kind,weights,kv_dtype", [
    ("qwen2", "float32", None), ("qwen2", "int8", None), ("qwen2", "int4", None), ("qwen2", "int7", None),
    ("gemma3", "int8", None),  # gemma3: rows past its window
    ("qwen3_moe", "int8", None), ("phi3", "float32", None),  # rows routed to experts; partial rotary, longrope
    ("gpt_oss", "int8", None),  # sinks in the row kernel, windowed rows, gpt-oss's experts
    ("qwen2", "int4", torch.bfloat16), ("qwen2", "float32", torch.float16)])  # two-byte KV caches
def test_verification_rows_are_bit_identical_to_one_token_steps(kind, weights, kv_dtype):
    """A verified token's logits must be exactly what plain decoding computes for it one step at a time
    (chains and tree nodes alike), or greedy speculative output can leave the target's at near-ties; with
    int8-quantized activations a last-bit difference would grow to visibly different logits. (Stock torch
    matmuls are not batch-invariant; there the guarantee is equality up to near-ties.)"""
    native = native_from_hf(make_hf_model(kind))
    native.pack_weights(weights)
    native.kv_dtype = kv_dtype
    assert native.new_cache(1, 4).keys.dtype == (kv_dtype or torch.float32)
    gen = torch.Generator().manual_seed(11)
    prefix, nodes = torch.randint(0, VOCAB, (1, 10), generator=gen), torch.randint(0, VOCAB, (1, 7), generator=gen)

    def stepwise(path: list[int]) -> torch.Tensor:  # logits of the path's last node, one token per forward
        cache = native.new_cache(1, 64)
        native(prefix, positions_after(0, 10, 1, "cpu"), cache)
        for depth, node in enumerate(path):
            logits = native(nodes[:, node:node + 1], torch.tensor([[10 + depth]]), cache).logits[0, -1]
        return logits

    cache = native.new_cache(1, 64)
    native(prefix, positions_after(0, 10, 1, "cpu"), cache)
    chain = native(nodes, positions_after(10, 7, 1, "cpu"), cache).logits[0]  # (7, V)
    for i in range(7):
        assert torch.equal(chain[i], stepwise(list(range(i + 1)))), f"chain row {i}"

    tree = TokenTree.from_draft(nodes[0].tolist(), [-1, 0, 0, 1, -1, 4, 2])
    cache = native.new_cache(1, 64)
    native(prefix, positions_after(0, 10, 1, "cpu"), cache)
    logits = native(nodes, torch.tensor([[9 + d for d in tree.depths]]), cache,  # depths start at 1
                    attn_mask=tree_attention_mask(10, tree.ancestor_mask())).logits[0]
    for i in range(7):
        assert torch.equal(logits[i], stepwise(tree.ancestors(i))), f"tree node {i}"


def test_sliding_window_survives_rollback_across_its_edge(pair):
    """Speculation on a sliding-window model: a verified block that crosses the window's edge, a rollback
    to inside that block, then more tokens: every row's logits are transformers' on the committed text."""
    hf, native = pair
    if native.config.sliding_window is None:
        pytest.skip("no sliding window")
    window = native.config.sliding_window
    text = torch.randint(0, VOCAB, (1, window + 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = hf(text).logits[0]  # (S, V)
    cache = native.new_cache(1, 64)
    native(text[:, :window - 3], positions_after(0, window - 3, 1, "cpu"), cache)
    rejected = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(6))
    block = torch.cat([text[:, window - 3:window], rejected], 1)  # 3 accepted, then 6 to roll back
    native(block, positions_after(window - 3, 9, 1, "cpu"), cache)
    cache.truncate(window)
    rest = native(text[:, window:], positions_after(window, 12, 1, "cpu"), cache).logits[0]
    assert (rest - reference[window:]).abs().max() < TOLERANCE
