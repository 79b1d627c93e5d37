"""The EAGLE-3 head (Li et al. 2025): one decoder layer on fused low, middle and high target features.

EAGLE's head sees only the target's last feature; EAGLE-3's sees several of its layers at once, fused by
one linear map (fc: layers x C -> C), and predicts tokens directly (no feature regression), so its
training can feed it its own outputs as it drafts ("training-time test"). The layer's attention reads the
pair (token embedding, feature) side by side, each normed on its own (q/k/v take 2C inputs); its residual
stream carries the feature, not the embedding.

This is the layout of speculators' `eagle3` checkpoints (and vLLM's Eagle3 drafter), so heads move
between specdec and those tools (specdec/interop/speculators.py). Layer ids follow their convention:
id L is the input of the target's decoder layer L, i.e. the output of our layer L - 1.

While drafting, the head's output before its final norm is fed back as the next step's feature (the
fc applies only to the target's fused features), and the final norm + a draft-vocabulary LM head score it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specdec.errors import InvalidParameterError
from specdec.heads.eagle import packed_head_copy
from specdec.models.base import causal_attention_mask
from specdec.models.config import ModelConfig
from specdec.models.kv_cache import KVCache
from specdec.models.decoder_layer import DecoderLayer
from specdec.models.norm import RMSNorm
from specdec.models.rope import rope_cos_sin, rope_inverse_frequencies


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """The low, middle and high layers EAGLE-3 fuses (speculators' and vLLM's default ids), fewer where a
    small target makes them coincide."""
    return tuple(sorted({2, num_layers // 2, num_layers - 3} & set(range(1, num_layers))))


@dataclasses.dataclass(frozen=True)
class Eagle3Shape:
    intermediate_size: int  # the decoder layer's MLP width
    feature_layers: tuple[int, ...]  # target layer ids (speculators' convention, see the module doc)
    norm_before_residual: bool = False  # the residual stream carries the normed feature (a speculators option)

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "feature_layers": list(self.feature_layers)}

    def check_target(self, num_layers: int) -> None:
        ids = self.feature_layers
        if len(ids) < 2 or len(set(ids)) != len(ids) or min(ids) < 1 or max(ids) >= num_layers:
            raise InvalidParameterError(f"EAGLE-3 feature layers {list(ids)}: need two or more distinct ids in "
                                        f"1..{num_layers - 1} for a target of {num_layers} layers")

    def engine_layers(self) -> tuple[int, ...]:
        """The same layers as the engine's hidden-state indices (the output of layer index)."""
        return tuple(layer - 1 for layer in self.feature_layers)


def head_config(target_config: ModelConfig, shape: Eagle3Shape) -> ModelConfig:
    """The head's own layer: Llama-style whatever the target (no biases, no query/key norms, SiLU, plain
    RMSNorm scales, dense, no sinks), which is the layer speculators' `eagle3` type defines."""
    return dataclasses.replace(
        target_config.dense(), num_layers=1, intermediate_size=shape.intermediate_size, qkv_bias=False, o_bias=False,
        mlp_bias=False, qk_norm=False, activation="silu", norm_offset=False, sandwich_norms=False,
        query_scale=None, sliding_window=None, sliding_layers=(), local_rope=None, embedding_scale=None,
        final_logit_softcap=None)


class Eagle3Layer(DecoderLayer):
    """A decoder layer whose attention reads [norm(embedding), norm(feature)] (2C inputs)."""

    def __init__(self, config: ModelConfig, norm_before_residual: bool):
        super().__init__(config)
        c, attn = config, self.self_attn
        attn.q_proj = nn.Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        attn.k_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        attn.v_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, hidden, cos, sin, cache, attn_mask):  # (B, T, C) each -> (B, T, C)
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        both = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2C)
        x = residual + self.self_attn(both, cos, sin, cache, 0, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    def __init__(self, target_config: ModelConfig, shape: Eagle3Shape):
        super().__init__()
        shape.check_target(target_config.num_layers)
        self.shape = shape
        self.config = head_config(target_config, shape)
        hidden = target_config.hidden_size
        self.fc = nn.Linear(len(shape.feature_layers) * hidden, hidden, bias=False)
        self.layer = Eagle3Layer(self.config, shape.norm_before_residual)
        self.norm = RMSNorm(hidden, target_config.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inverse_frequencies(self.config.rope, self.config.head_dim),
                             persistent=False)

    def packed_copy(self) -> "Eagle3Head":
        # packed projections; the layer itself runs step by step (no one-call plan for its 2C attention)
        return packed_head_copy(self)

    def new_cache(self, max_length: int, batch_size: int = 1) -> KVCache:
        c = self.config
        return KVCache(1, batch_size, c.num_kv_heads, max_length, c.head_dim, self.norm.weight.dtype,
                       self.norm.weight.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(..., layers x C) the target's features -> (..., C) the head's input feature."""
        return self.fc(features)

    def scoring_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., C) the head's output -> what its draft-vocabulary LM head scores."""
        return self.norm(hidden)

    def forward(
        self,
        token_embeds: torch.Tensor,  # (B, T, C) embeddings of tokens j+1
        features: torch.Tensor,  # (B, T, C) fused target features of token j (fuse()), or the head's own outputs
        positions: torch.Tensor,  # (B, T) j
        cache: KVCache,
        attn_mask: torch.Tensor | None,  # (B or 1, T, cache.length + T) bool; None = causal over the new pairs
    ) -> torch.Tensor:
        """(B, T, C) the head's outputs before its final norm (fed back while drafting); appends T entries
        to the cache."""
        num_new = token_embeds.shape[1]
        cache.check_room(num_new)
        if attn_mask is None and num_new > 1:
            attn_mask = causal_attention_mask(cache.length, num_new, token_embeds.device)
        cos, sin = rope_cos_sin(self.inv_freq, positions, token_embeds.dtype, self.config.rope.attention_factor)
        x = self.layer(token_embeds, features, cos, sin, cache, attn_mask)
        cache.advance(num_new)
        return x
