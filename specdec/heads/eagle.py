"""The EAGLE head (Li et al. 2024): one decoder layer that predicts the target's next feature.

Input at position j is the pair (embedding of token j+1, target feature f_j): the feature that produced
token j+1, and that token. The head outputs a prediction of f_{j+1}, which the target's LM head turns
into the distribution of token j+2. Knowing which token was sampled removes the uncertainty a feature
alone carries, which is why EAGLE drafts far better than heads on the feature alone (Medusa).

While drafting, the head feeds its own predicted features back in, autoregressively, over a tree; its
KV cache holds committed pairs (from the target's true features) plus the tree being drafted.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from specdec.kernels import packed_kernel
from specdec.models.attention import ROW_BY_ROW_MAX, RowAttention
from specdec.models.base import causal_attention_mask
from specdec.models.config import ModelConfig
from specdec.models.kv_cache import KVCache
from specdec.models.layer_plan import layer_plan
from specdec.models.decoder_layer import DecoderLayer
from specdec.models.norm import RMSNorm
from specdec.models.quantized.packed_linear import PackedLinear
from specdec.models.rope import rope_cos_sin, rope_inverse_frequencies


@dataclasses.dataclass(frozen=True)
class EagleShape:
    intermediate_size: int  # the decoder layer's MLP width (the target's by default)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def packed_head_copy(head: nn.Module) -> nn.Module:
    """For drafting on the CPU kernel (float32): a copy of an EAGLE or EAGLE-3 head whose fc and layer
    projections are fused and packed as the target's are (stock torch linears cost ~4x more at a draft
    step's few rows). Else the head itself. A copy, so the trained module stays as it is (training saves
    it afterwards). A head loaded from disk holds bfloat16 values: its panels are then bf16, the same products
    from half the bytes each draft step streams."""
    if head.fc.weight.device.type != "cpu" or head.fc.weight.dtype != torch.float32 or packed_kernel() is None:
        return head
    twin = copy.deepcopy(head)
    twin.fc = PackedLinear.fuse([twin.fc]).to_bf16_if_lossless_()
    twin.layer.pack_projections(lambda name, linears: PackedLinear.fuse(linears).to_bf16_if_lossless_(), "layer")
    return twin.eval()


class EagleHead(nn.Module):
    def __init__(self, target_config: ModelConfig, shape: EagleShape):
        super().__init__()
        self.shape = shape
        # a dense layer whatever the target (a mixture's experts, gpt-oss's sinks are the target's own)
        self.config = dataclasses.replace(target_config.dense(), num_layers=1, intermediate_size=shape.intermediate_size,
                                          qkv_bias=False, o_bias=False, mlp_bias=False)
        hidden = target_config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden)
        self.layer = DecoderLayer(self.config)
        self.norm = RMSNorm(hidden, target_config.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inverse_frequencies(target_config.rope, target_config.head_dim),
                             persistent=False)

    def packed_copy(self) -> "EagleHead":
        return packed_head_copy(self)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return features  # the target's final feature is the head's input as it is (EAGLE-3 fuses several)

    def scoring_input(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # the predicted feature is what the LM head scores (it is already normed)

    def new_cache(self, max_length: int, batch_size: int = 1) -> KVCache:
        c = self.config
        dtype, device = self.norm.weight.dtype, self.norm.weight.device  # fc may be packed
        return KVCache(1, batch_size, c.num_kv_heads, max_length, c.head_dim, dtype, device)

    def forward(
        self,
        token_embeds: torch.Tensor,  # (B, T, C) embeddings of tokens j+1
        features: torch.Tensor,  # (B, T, C) target (or predicted) features f_j
        positions: torch.Tensor,  # (B, T) j
        cache: KVCache,
        attn_mask: torch.Tensor | None,  # (B or 1, T, cache.length + T) bool; None = causal over the new pairs
    ) -> torch.Tensor:
        """(B, T, C) predicted features f_{j+1}; appends T entries to the cache."""
        num_new = token_embeds.shape[1]
        cache.check_room(num_new)
        if attn_mask is None and num_new > 1:
            attn_mask = causal_attention_mask(cache.length, num_new, token_embeds.device)
        x = self.fc(torch.cat([token_embeds, features], dim=-1))  # (B, T, C)
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype, self.config.rope.attention_factor)
        plan = None
        if self.layer.self_attn.qkv_proj is not None and num_new <= ROW_BY_ROW_MAX:  # packed_copy(): drafting
            rows = RowAttention.for_forward(attn_mask, cache.length, num_new)
            plan = layer_plan(self, [self.layer], x, cache, rows)
        if plan is not None:  # the layer in one C call, as the target's (models/layer_plan.py)
            c = self.config
            x = plan.run(x, cos, sin, cache, 0, 1, rows, c.num_heads, c.num_kv_heads, c.head_dim)
        else:
            x = self.layer(x, cos, sin, cache, 0, attn_mask)
        cache.advance(num_new)
        return self.norm(x)
