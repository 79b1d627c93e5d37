"""The layer kernels between the matmuls (kernels/layer_ops.cpp) against torch's operators, and a fused
decoder layer against the operator-by-operator one."""

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels import add_rms_norm, packed_kernel, rope_qkv_to_cache, silu_mul
from specdec.models.kv_cache import KVCache
from specdec.models.sources.loading import load_model
from specdec.models.rope import apply_rope
from tiny_models import save_tiny_model

pytestmark = pytest.mark.skipif(packed_kernel() is None, reason="no AVX2/FMA CPU or no C++ compiler here")


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return (weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).float()


@pytest.mark.parametrize("size", [7, 64, 576, 1536])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_add_rms_norm(size, rows):
    gen = torch.Generator().manual_seed(size + rows)
    x, h, w = torch.randn(1, rows, size, generator=gen), torch.randn(1, rows, size, generator=gen), torch.rand(size)
    same, normed = add_rms_norm(x, None, w, 1e-5)
    assert same is x and torch.allclose(normed, reference_rms_norm(x, w, 1e-5), atol=1e-5)
    total, normed = add_rms_norm(x, h, w, 1e-6)
    assert torch.equal(total, x + h)
    assert torch.allclose(normed, reference_rms_norm(x + h, w, 1e-6), atol=1e-5)
    for row in range(rows):  # each row as it would be alone
        assert torch.equal(add_rms_norm(x[:, row:row + 1].contiguous(), None, w, 1e-5)[1][0, 0], add_rms_norm(x, None, w, 1e-5)[1][0, row])


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 16), (9, 3, 64), (12, 2, 128)])
@pytest.mark.parametrize("rows", [1, 5])
def test_rope_qkv_to_cache(heads, kv_heads, dim, rows):
    gen = torch.Generator().manual_seed(heads * dim + rows)
    qkv = torch.randn(1, rows, (heads + 2 * kv_heads) * dim, generator=gen)
    angles = torch.rand(1, 1, rows, dim // 2, generator=gen) * 6
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    cache = KVCache(2, 1, kv_heads, 32, dim, torch.float32, "cpu")
    start, layer = 7, 1
    q = rope_qkv_to_cache(qkv, cos, sin, cache.keys[layer, 0], cache.values[layer, 0], heads, kv_heads, start)
    q_ref, k_ref, v_ref = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    q_ref = apply_rope(q_ref.view(1, rows, heads, dim).transpose(1, 2), cos, sin)
    k_ref = apply_rope(k_ref.view(1, rows, kv_heads, dim).transpose(1, 2), cos, sin)
    assert torch.allclose(q, q_ref, atol=1e-6)
    assert torch.allclose(cache.keys[layer, :, :, start:start + rows], k_ref, atol=1e-6)
    assert torch.equal(cache.values[layer, :, :, start:start + rows], v_ref.view(1, rows, kv_heads, dim).transpose(1, 2))
    untouched = torch.ones(cache.keys.shape[3], dtype=torch.bool)
    untouched[start:start + rows] = False
    assert not cache.keys[layer, :, :, untouched].any() and not cache.keys[0].any()


@pytest.mark.parametrize("width", [5, 64, 8960])
def test_silu_mul(width):
    gen = torch.Generator().manual_seed(width)
    gate_up = torch.randn(3, 2 * width, generator=gen) * 8  # the exp polynomial over a wide range
    gate_up[0, :3] = torch.tensor([-100.0, 100.0, 0.0])[:min(3, width)]
    gate, up = gate_up.double().split(width, -1)
    assert torch.allclose(silu_mul(gate_up).double(), F.silu(gate) * up, rtol=1e-6, atol=1e-6)


def test_fused_layers_match_operator_by_operator(tmp_path, monkeypatch):
    """The same packed model, kernels between the matmuls or torch operators: same logits to float32 noise."""
    from specdec.models import llama

    model = load_model(str(save_tiny_model(tmp_path / "m", "qwen2", seed=5))).model  # q/k/v biases too
    tokens = torch.randint(0, model.vocab_size, (1, 80), generator=torch.Generator().manual_seed(0))

    def logits():
        cache = model.new_cache(1, 96)
        prefill = model.forward(tokens[:, :72], torch.arange(72).unsqueeze(0), cache).logits  # > 64 rows: batched
        return prefill, model.forward(tokens[:, 72:], torch.arange(72, 80).unsqueeze(0), cache).logits

    fused = logits()
    monkeypatch.setattr(llama.LlamaForCausalLM, "layers_are_packed", lambda self: False)
    unfused = logits()
    # the prefill (> 64 rows) runs layer by layer either way; packed, its attention goes row by row (the
    # chunk-invariant prefill), else torch's: float32 noise apart
    assert torch.allclose(fused[0], unfused[0], atol=1e-4)
    assert torch.allclose(fused[1], unfused[1], atol=1e-4) and not torch.equal(fused[1], unfused[1])
