"""One decoder layer (attention, then a feed-forward, with Llama's or Gemma's norms around them) and the
stack of them a checkpoint's `model.` holds: the modules models/llama.py runs and the EAGLE heads reuse."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from specdec.models.attention import Attention
from specdec.models.config import ModelConfig
from specdec.models.feed_forward import MLP, MixtureOfExperts
from specdec.models.norm import RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int = 0):
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_offset)
        self.self_attn = Attention(c)
        # Llama: the norm before the feed-forward. Gemma: the norm of the attention's output, with two more
        # around the feed-forward's.
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_offset)
        if c.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_offset)
            self.post_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_offset)
        self.sandwich_norms = c.sandwich_norms
        self.mlp = MixtureOfExperts(c) if index in c.moe_layers else MLP(c)

    def pack_projections(self, packed: Callable[[str, list[nn.Linear]], nn.Module], prefix: str) -> None:
        """Replace q/k/v, o, gate/up and down by what `packed(name, linears)` makes of them (fused
        PackedLinear layers for the CPU kernel), named `prefix.self_attn.qkv_proj` and so on."""
        attn, mlp = self.self_attn, self.mlp
        attn.qkv_proj = packed(f"{prefix}.self_attn.qkv_proj", [attn.q_proj, attn.k_proj, attn.v_proj])
        attn.o_proj = packed(f"{prefix}.self_attn.o_proj", [attn.o_proj])
        del attn.q_proj, attn.k_proj, attn.v_proj
        mlp.pack_projections(packed, f"{prefix}.mlp")

    def forward(self, x, cos, sin, cache, layer, attn_mask, rows=None):
        attended = self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, attn_mask, rows)
        if self.sandwich_norms:
            x = x + self.post_attention_layernorm(attended)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """The `model.` part of a checkpoint: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        # The values come from a checkpoint: no random initialization (on the meta device, where loaders
        # build the model, normal_ alone imported torch's compiler: seconds of every start-up)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
