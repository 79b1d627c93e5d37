"""Attention with a learned sink logit per head (gpt-oss), in torch: where the row kernel does not run
(prefill blocks, two-byte rows on other devices, GPUs).

A head's sink is one more logit in its softmax whose value is zero: the weights of the real keys sum to less
than one, so a head can attend to nothing. softmax([s_1..s_n, sink])[:n] @ V, as transformers' eager
attention computes it.
"""

from __future__ import annotations

import torch

# Scores held at once (a block of query rows x every key x every head): bounds a long prefill's memory
SCORES_AT_ONCE = 1 << 24


def sink_attention(
    q: torch.Tensor,  # (B, H, T, D)
    keys: torch.Tensor,  # (B, Hkv, S, D)
    values: torch.Tensor,  # (B, Hkv, S, D)
    mask: torch.Tensor | None,  # (B or 1, 1, T, S) bool: True where a row sees a key; None: all, or causal
    causal: bool,  # with mask None: row t sees keys up to S - T + t
    scale: float | None,  # None: 1/sqrt(D)
    sinks: torch.Tensor,  # (H,)
) -> torch.Tensor:
    """(B, H, T, D): each row's attention over the keys it sees with its head's sink in the softmax."""
    batch, heads, rows, dim = q.shape
    group = heads // keys.shape[1]
    keys = keys.to(q.dtype).repeat_interleave(group, dim=1)  # (B, H, S, D)
    values = values.to(q.dtype).repeat_interleave(group, dim=1)
    span = keys.shape[2]
    if mask is None and causal:
        mask = torch.ones(rows, span, dtype=torch.bool, device=q.device).tril(span - rows).view(1, 1, rows, span)
    scale = dim ** -0.5 if scale is None else scale
    step = max(1, SCORES_AT_ONCE // (batch * heads * span))
    outs = []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        scores = torch.matmul(q[:, :, start:stop], keys.transpose(2, 3)) * scale  # (B, H, t, S)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, :, start:stop], float("-inf"))
        sink = sinks.to(scores.dtype).view(1, heads, 1, 1).expand(batch, heads, stop - start, 1)
        combined = torch.cat([scores, sink], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        weights = torch.softmax(combined, dim=-1)[..., :-1]  # the sink's share dropped
        outs.append(torch.matmul(weights, values))
    return torch.cat(outs, dim=2)
