"""The one-call layer span (kernels/decoder_layers.cpp, models/layer_plan.py) computes exactly what the
kernels compute when Python calls them one at a time: same values to the bit, same cache writes."""

import pytest
import torch

from specdec.kernels import add_rms_norm, packed_kernel, rope_qkv_to_cache, silu_mul
from specdec.models.base import positions_after, tree_attention_mask
from specdec.models.quantized.gguf_blocks import decode
from specdec.models.quantized.gguf_linear import GgufLinear
from specdec.models.layer_plan import INT4, INT8
from specdec.models.attention import RowAttention
from specdec.models.rope import rope_cos_sin
from specdec.core.tree import TokenTree
from test_gguf_blocks import blocks_of
from test_native_decoder import native_from_hf
from tiny_models import VOCAB, make_hf_model

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="no AVX2/FMA/F16C CPU or no C++ compiler here")


def layer_by_calls(layer, x, cos, sin, cache, index, rows):
    """One decoder layer as Python used to run it: each kernel called on its own (the reference)."""
    attn, mlp = layer.self_attn, layer.mlp
    _, normed = add_rms_norm(x, None, layer.input_layernorm.weight, layer.input_layernorm.eps)
    qkv = attn.qkv_proj.unsplit(normed)
    keys, values = cache.keys[index, 0], cache.values[index, 0]
    q = rope_qkv_to_cache(qkv, cos, sin, keys, values, attn.num_heads, attn.num_kv_heads, cache.length)
    keys, values = cache.filled(index, cache.length + x.shape[1])
    h = attn.o_proj(rows.attend(q, keys, values))
    x, normed = add_rms_norm(x, h, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
    return x + mlp.down_proj(silu_mul(mlp.gate_up_proj.unsplit(normed)))


def gguf_model():
    """A tiny qwen2 (q/k/v bias) whose projections are GGUF blocks: Q6_K six-bit codes, Q8_0 signed codes,
    Q4_K nibbles with 16- and 32-input groups."""
    native = native_from_hf(make_hf_model("qwen2", seed=3, hidden_size=256, intermediate_size=512))
    native.pack_weights()
    formats = {"qkv_proj": "Q6_K", "o_proj": "Q8_0", "gate_up_proj": "Q4_K", "down_proj": "Q4_0"}
    for index, layer in enumerate(native.model.layers):
        for owner in (layer.self_attn, layer.mlp):
            for name, form in formats.items():
                old = getattr(owner, name, None)
                if old is None:
                    continue
                raw = blocks_of(form, old.out_features, old.in_features, seed=index)
                weights = decode(raw, form, old.out_features, old.in_features)
                setattr(owner, name, GgufLinear(weights, old.bias, old.split_sizes))
    return native


def model_in(weights: str):
    if weights == "gguf":
        return gguf_model()
    native = native_from_hf(make_hf_model("qwen2", seed=3))
    native.pack_weights(weights)
    return native


@pytest.mark.parametrize("weights", ["float32", "bf16", "int8", "int4", "int7", "gguf"])
@pytest.mark.parametrize("shape", ["one", "chain", "tree"])
def test_span_equals_the_kernels_called_one_by_one(weights, shape):
    native = model_in(weights)
    config = native.config
    gen = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, VOCAB, (1, 9), generator=gen)
    new = torch.randint(0, VOCAB, (1, {"one": 1, "chain": 5, "tree": 6}[shape]), generator=gen)
    rows_count = new.shape[1]
    if shape == "tree":
        tree = TokenTree.from_draft(new[0].tolist(), [-1, 0, 0, 1, 2, -1])
        mask = tree_attention_mask(9, tree.ancestor_mask())
        positions = torch.tensor([[8 + d for d in tree.depths]])
    else:
        mask = None if rows_count == 1 else tree_attention_mask(9, torch.ones(rows_count, rows_count).tril().bool())
        positions = positions_after(9, rows_count, 1, "cpu")

    def prefilled():
        cache = native.new_cache(1, 32)
        native(prefix, positions_after(0, 9, 1, "cpu"), cache)
        return cache

    rows = RowAttention.for_forward(mask, 9, rows_count)
    cos, sin = rope_cos_sin(native.inv_freq, positions, native.dtype)
    x = native.model.embed_tokens(new)
    plan = native.layer_plan(x, prefilled(), rows)
    assert plan is not None
    by_plan, by_calls = prefilled(), prefilled()
    ours = plan.run(x, cos, sin, by_plan, 0, config.num_layers, rows, config.num_heads,
                    config.num_kv_heads, config.head_dim)
    reference = x.contiguous()
    for index, layer in enumerate(native.model.layers):
        reference = layer_by_calls(layer, reference, cos, sin, by_calls, index, rows)
    assert torch.equal(ours, reference)
    assert torch.equal(by_plan.keys, by_calls.keys) and torch.equal(by_plan.values, by_calls.values)
    # the model's forward takes the span (split where hidden states are tapped) and agrees with it
    cache = prefilled()
    out = native(new, positions, cache, attn_mask=mask, hidden_layers=[0, config.num_layers - 1])
    assert torch.equal(out.hidden_states[config.num_layers - 1], reference)


def test_plan_follows_replaced_layers():
    """A plan points into the layers' buffers: replacing a projection (quantize_, a cached layer) must
    rebuild it, never run on freed memory or stale weights."""
    native = model_in("float32")
    x, cache, rows = torch.zeros(1, 1, native.config.hidden_size), native.new_cache(1, 8), RowAttention(0, torch.ones(1, 1, dtype=torch.uint8))
    first = native.layer_plan(x, cache, rows)
    assert native.layer_plan(x, cache, rows) is first  # unchanged layers: the same plan
    layer = native.model.layers[1]
    layer.mlp.down_proj.quantize_("int8")  # a buffer replaced in place of the same module
    second = native.layer_plan(x, cache, rows)
    assert second is not first
    entry = second.entries[1]
    assert entry.down.kind == INT8 and entry.down.codes == layer.mlp.down_proj.packed.data_ptr()
    assert entry.down.scales == layer.mlp.down_proj.scales.data_ptr()
    layer.self_attn.o_proj = layer.self_attn.o_proj.quantized_copy("int4")  # a module replaced
    third = native.layer_plan(x, cache, rows)
    assert third is not second
    assert third.entries[1].o.kind == INT4 and third.entries[1].o.codes == layer.self_attn.o_proj.packed.data_ptr()


def test_unpacked_layers_have_no_plan():
    native = native_from_hf(make_hf_model("llama", seed=1))  # stock nn.Linear layers
    assert native.layer_plan(torch.zeros(1, 1, native.config.hidden_size), native.new_cache(1, 8),
                             RowAttention.for_forward(None, 0, 1)) is None
