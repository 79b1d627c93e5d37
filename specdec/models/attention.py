"""The decoder's attention: the module (projections, rope, the cache, then one of the paths below), and the
two ways the CPU kernels attend so that outputs do not depend on how rows are grouped: row by row
(`RowAttention`: decoding and verification, each row as its one-token step) and in causal blocks
(`CausalBlock`: long prefills, chunk-invariant). On a GPU, torch's scaled-dot-product attention with the
backends that need no per-length plan.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdec.kernels import SMALL_ROWS, attention_block, attention_rows, packed_kernel
from specdec.models.attention_sinks import sink_attention
from specdec.models.config import ModelConfig
from specdec.models.grouped_attention import GroupedMask
from specdec.models.kv_cache import KVCache
from specdec.models.norm import RMSNorm
from specdec.models.rope import apply_rope


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.qkv_proj = None  # q, k and v fused into one packed layer by pack_weights()
        if c.qk_norm:  # Qwen3, Gemma 3: each head's queries and keys normalized before rope
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.norm_offset)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.norm_offset)
        self.qk_norm = c.qk_norm
        self.scale = c.query_scale  # None: 1/sqrt(head_dim)
        # gpt-oss: a learned logit per head in the softmax (models/attention_sinks.py)
        self.sinks = nn.Parameter(torch.zeros(c.num_heads)) if c.attention_sinks else None

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_proj is not None:
            return self.qkv_proj(x)
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, C)
        cos: torch.Tensor,  # (B, 1, T, D)
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        # (B or 1, T, S) bool, or None: causal (one token, or a first prefill); or that mask grouped (the CPU)
        attn_mask: torch.Tensor | GroupedMask | None,
        rows: RowAttention | None = None,  # attend row by row (decoding and verification)
    ) -> torch.Tensor:
        batch, num_new, _ = x.shape
        q, k, v = self.project_qkv(x)
        q = q.reshape(batch, num_new, self.num_heads, self.head_dim)  # (B, T, H, D)
        k = k.reshape(batch, num_new, self.num_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D), (B, Hkv, T, D)
        v = v.reshape(batch, num_new, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.write(layer, k, v)  # (B, Hkv, S, D), S = cached + T
        if rows is not None:
            return self.o_proj(rows.attend(q, keys, values, self.scale, self.sinks))
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # a two-byte cache's values, widened
        if isinstance(attn_mask, GroupedMask):
            out = attn_mask.attend(q, keys, values, self.scale)
            return self.o_proj(out.transpose(1, 2).reshape(batch, num_new, self.num_heads * self.head_dim))
        mask = None if attn_mask is None else attn_mask.unsqueeze(1)  # (B, 1, T, S)
        if self.sinks is not None:
            out = sink_attention(q, keys, values, mask, mask is None and num_new > 1, self.scale, self.sinks)
            return self.o_proj(out.transpose(1, 2).reshape(batch, num_new, self.num_heads * self.head_dim))
        with gpu_attention_backends(q.device, getattr(cache, "attention_backends", GPU_ATTENTION_BACKENDS)):
            causal = mask is None and num_new > 1  # then keys are the T new ones only (LlamaForCausalLM.forward)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal,
                                                 enable_gqa=True, scale=self.scale)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(batch, num_new, self.num_heads * self.head_dim))


# cuDNN's attention, torch's first choice on Hopper GPUs, builds an execution plan for every new key
# length, that is at every decode step: 1.4-1.7 ms of host time per call measured on an H200 machine,
# 60% of a 1.5B model's step. The flash, memory-efficient and math kernels need no plan.
GPU_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def gpu_attention_backends(device: torch.device, backends: Sequence[SDPBackend] = tuple(GPU_ATTENTION_BACKENDS)):
    return sdpa_kernel(list(backends)) if device.type == "cuda" else nullcontext()


# Forwards up to this many new tokens (decoding, verification) attend row by row: the matmul kernels'
# batch-invariant range, so such a forward is row-invariant end to end.
ROW_BY_ROW_MAX = SMALL_ROWS

# Prefill on the CPU kernels is chunk-invariant: prompt rows at positions below this attend row by row too,
# later rows in blocks of PREFILL_BLOCK rows aligned to it (one attention call per block over the cache).
# So the keys and values of a prompt's first n tokens come out bit-identical whether it is prefilled in one
# forward, in chunks that end at `reusable_prefix` positions, or after a cached prefix: what chunked prefill
# and prefix caching rest on. Why not row by row throughout: past about a thousand keys the row kernel costs
# several times the block kernel's attention per row (CausalBlock), while below it costs about the same.
PREFILL_ROW_LIMIT = 1024
# Why blocks this small: a block is the least a chunked prefill can do in one step, and deep in a long
# prompt a block's attention over every earlier key dominates its cost; a server interleaves other requests
# only between steps. Smaller blocks cost the prefill little (the weights' kernels are compute-bound from a
# few dozen rows on; each block re-reads the cached keys, bytes far below its arithmetic).
PREFILL_BLOCK = 128


@dataclass
class RowAttention:
    """Attention computed row by row, each row exactly as its one-token step computes it.

    Why: a batched attention call rounds differently from T one-token calls, and with int8-quantized
    activations (int4/int7 weights) such last-bit differences grow into visibly different logits. Row by
    row, a verified token's attention is bit-identical to the step plain decoding takes for it, as the
    matmul kernels' rows already are. Every row sees the first `prefix` cached keys (the committed
    prefix); `visible` says which of the keys after them it sees (a chain: the new tokens up to itself; a
    tree node: its ancestors and itself; an EAGLE head's tree also reaches into nodes cached earlier)."""

    prefix: int
    visible: torch.Tensor  # (T, S - prefix) uint8, the attention kernel's input
    # sliding-window layers: the first cache slot each row sees (None: slot 0 for every row)
    first_key: tuple[int, ...] | None = None

    @classmethod
    def for_forward(cls, attn_mask: torch.Tensor | None, past: int, num_new: int) -> "RowAttention":
        """For a forward of num_new tokens after `past` cached ones, over attn_mask (1, T, past + T) or causal."""
        if attn_mask is None:  # causal: each new token sees the prefix and the new tokens up to itself
            return cls(past, torch.ones(num_new, num_new, dtype=torch.uint8).tril())
        mask = attn_mask[0].cpu()  # (T, S)
        shared = mask[:, :past].all(dim=0)  # (past,): keys every row sees
        prefix = past if bool(shared.all()) else int(shared.to(torch.uint8).argmin())
        return cls(prefix, mask[:, prefix:].to(torch.uint8).contiguous())

    def windowed(self, first_key: Sequence[int]) -> "RowAttention":
        """The same rows on a sliding-window layer: row t sees no cache slot before first_key[t]."""
        return RowAttention(self.prefix, self.visible, tuple(first_key))

    def row_alone(self, row: int) -> tuple["RowAttention", int]:
        """Row `row` of a windowed forward as a forward of its own over the cache from slot `start` on:
        (its RowAttention, start)."""
        first = self.first_key[row]
        start = min(first, self.prefix)
        visible = self.visible[row:row + 1]
        if first > self.prefix:  # the window also starts after some of the rows' shared keys
            visible = visible.clone()
            visible[:, :first - self.prefix] = 0
        return RowAttention(self.prefix - start, visible), start

    def keys_of_row(self, row: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, Hkv, S, D) keys and values -> those `row` attends to, in cache order."""
        seen = self.visible[row].bool()
        count = int(seen.sum())
        if bool(seen[:count].all()):  # a chain row: a prefix of the cache
            return keys[:, :, :self.prefix + count], values[:, :, :self.prefix + count]
        index = torch.cat([torch.arange(self.prefix), self.prefix + seen.nonzero().squeeze(1)]).to(keys.device)
        return keys.index_select(2, index), values.index_select(2, index)

    @staticmethod
    def uses_kernel(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype == torch.float32 and packed_kernel() is not None

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               scale: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q (1, H, T, D) over the cache's (1, Hkv, S, D) -> (1, T, H * D); scale None: 1/sqrt(D); sinks (H,):
        each head's sink logit (gpt-oss), None: none."""
        _, heads, rows, dim = q.shape
        if self.first_key is not None:  # each row over its own window of the cache
            outs = []
            for t in range(rows):
                alone, start = self.row_alone(t)
                outs.append(alone.attend(q[:, :, t:t + 1], keys[:, :, start:], values[:, :, start:], scale, sinks))
            return torch.cat(outs, dim=1)
        if self.uses_kernel(q):
            return attention_rows(q, keys, values, self.visible, self.prefix, scale, sinks)
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # a two-byte cache's values, widened
        if sinks is not None:
            out = torch.cat([sink_attention(q[:, :, t:t + 1], *self.keys_of_row(t, keys, values), None, False, scale,
                                            sinks) for t in range(rows)], dim=2)
            return out.transpose(1, 2).reshape(1, rows, heads * dim)
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, t:t + 1], *self.keys_of_row(t, keys, values),
                                                        enable_gqa=True, scale=scale)
                         for t in range(rows)], dim=2)  # (1, H, T, D)
        return out.transpose(1, 2).reshape(1, rows, heads * dim)


@dataclass(frozen=True)
class CausalBlock:
    """A prefill block's rows past PREFILL_ROW_LIMIT: row t sees the `prefix` cached keys and the block's own up
    to itself, through the block kernel (kernels/block_attention.cpp: scores as a matrix product, an online
    softmax over blocks of keys). Each row's arithmetic is its own whatever rows share the call (a prompt's
    keys and values do not depend on how its prefill is split), but not its one-token step's: rows that must
    equal their decoding step (verification) take RowAttention."""

    prefix: int
    visible = None  # the layer plan's marker for the block kernel (RowAttention's visible matrix)
    first_key = None  # no sliding window: such models' prefill is not chunk-invariant

    @staticmethod
    def applies(x: torch.Tensor, head_dim: int) -> bool:
        """Whether the block kernel serves rows of x at this head size (8-lane vectors over D)."""
        return RowAttention.uses_kernel(x) and head_dim % 8 == 0

    uses_kernel = staticmethod(RowAttention.uses_kernel)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               scale: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q (1, H, T, D) over the cache's (1, Hkv, S, D) -> (1, T, H * D), as RowAttention.attend."""
        return attention_block(q, keys, values, self.prefix, scale, sinks)
