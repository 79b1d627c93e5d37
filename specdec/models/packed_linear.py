"""Linear layers stored for the CPU small-row kernel (specdec.kernels).

`PackedLinear.fuse([q, k, v])` packs several projections that read the same
input into one matrix, so a layer makes 4 kernel calls instead of 7.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from specdec.kernels import pack_weight, packed_matmul, unpack_rows


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, split_sizes: Sequence[int]):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.split_sizes = list(split_sizes)
        self.register_buffer("packed", pack_weight(weight))  # (P, K, 16)
        self.register_buffer("bias", None if bias is None else bias.float().clone())

    @classmethod
    def fuse(cls, linears: Sequence[nn.Linear]) -> "PackedLinear":
        weights = [lin.weight.detach() for lin in linears]
        weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        biases = [lin.bias for lin in linears]
        if all(b is None for b in biases):
            bias = None
        else:
            bias = torch.cat([b.detach() if b is not None else torch.zeros(lin.out_features)
                              for b, lin in zip(biases, linears)])
        return cls(weight, bias, [lin.out_features for lin in linears])

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """(..., K) -> (..., N), or a tuple split as the fused layers were."""
        lead = x.shape[:-1]
        y = packed_matmul(x.reshape(-1, self.in_features).contiguous(), self.packed, self.out_features)
        if self.bias is not None:
            y += self.bias
        y = y.reshape(*lead, self.out_features)
        return y.split(self.split_sizes, dim=-1) if len(self.split_sizes) > 1 else y


class PackedEmbedding(nn.Module):
    """Token embeddings read from a packed LM head they are tied to (no second copy)."""

    def __init__(self, head: PackedLinear):
        super().__init__()
        self.head = [head]  # a list: not registered twice as a submodule

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return unpack_rows(self.head[0].packed, tokens)  # (B, T, C)
