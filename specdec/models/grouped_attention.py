"""Masked attention on the CPU with the query heads of a KV group as rows of one head: masked forwards of many
rows that the kernels' row and block attention do not take (batched masks; prefill blocks of a head size
that is not a multiple of 8, which attention.CausalBlock leaves to torch).

torch's CPU attention (its flash kernel) multiplies each head's block of query rows by every key block,
and with grouped-query heads (12 query heads on 2 KV heads) a block of 128 prompt rows makes small
matrix products that each stream the group's keys again. Stacked as one head of G x 128 rows, the same
keys meet six times the rows per product, and the kernel picks larger row blocks. Each row's arithmetic is
unchanged (its scores, softmax and weighted values do not depend on which other rows share a product), so
the output is bit-identical to `enable_gqa` over the same mask; except bfloat16 on a CPU with AMX, where
torch's kernel multiplies on tiles blocked by the row count and a rare element moves by one bfloat16 step
(torch's own attention differs as much between row counts there).

The mask becomes the additive float mask torch would make of it anyway, built once per forward for every
layer: torch would build it again inside each layer's call, a pass over G x T x S floats each time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# A forward's grouped mask at most (G * T * S floats); larger masked forwards keep torch's own GQA path
MASK_BYTES = 96 << 20


@dataclass(frozen=True)
class GroupedMask:
    """A forward's bool mask laid out for grouped rows: (B or 1, 1, G * T, S) of 0 where a row sees a key and
    -inf elsewhere; row g * T + t is query head g's row t (of the heads one KV head serves)."""

    additive: torch.Tensor
    group: int  # query heads per KV head

    @classmethod
    def of(cls, mask: torch.Tensor, group: int, dtype: torch.dtype) -> "GroupedMask | None":
        """mask (B or 1, T, S) bool -> its grouped form; None where grouping does not apply (one query head
        per KV head) or the mask would outgrow MASK_BYTES."""
        batch, rows, keys = mask.shape
        if group < 2 or batch * group * rows * keys * torch.finfo(dtype).bits // 8 > MASK_BYTES:
            return None
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        return cls(additive.repeat(1, group, 1).unsqueeze(1), group)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None) -> torch.Tensor:
        """q (B, H, T, D) over keys and values (B, Hkv, S, D) of q's dtype -> (B, H, T, D)."""
        batch, heads, rows, dim = q.shape
        grouped = q.reshape(batch, heads // self.group, self.group * rows, dim)  # (B, Hkv, G * T, D)
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=self.additive, scale=scale)
        return out.reshape(batch, heads, rows, dim)
