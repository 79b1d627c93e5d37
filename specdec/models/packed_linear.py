"""Linear layers stored for the CPU small-row kernel (specdec.kernels).

`PackedLinear.fuse([q, k, v])` packs several projections that read the same
input into one matrix, so a layer makes 4 kernel calls instead of 7.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from specdec.kernels import pack_weight, packed_matmul, packed_matmul_int8, quantize_packed_int8, unpack_rows

WEIGHT_FORMATS = ("float32", "int8")


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, split_sizes: Sequence[int]):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.split_sizes = list(split_sizes)
        self.register_buffer("packed", pack_weight(weight))  # (P, K, 16) float32, or int8 with `scales`
        self.register_buffer("bias", None if bias is None else bias.float().clone())
        self.register_buffer("scales", None)  # (P * 16,) per output column, for int8 panels

    @property
    def weight_format(self) -> str:
        return "float32" if self.scales is None else "int8"

    def quantize_(self, weights: str) -> "PackedLinear":
        """Switch to another weight format in place (weight-only: activations stay float32)."""
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {weights!r}")
        if weights == "int8" and self.scales is None:
            self.packed, self.scales = quantize_packed_int8(self.packed)
        elif weights == "float32" and self.scales is not None:
            raise ValueError("int8 weights cannot be turned back into float32")
        return self

    def quantized_copy(self, weights: str) -> "PackedLinear":
        """A copy in another weight format; this layer is left as it is (for a quantized self-draft)."""
        twin = copy.copy(self)
        twin._buffers = dict(self._buffers)  # its own buffer table: quantize_ replaces entries, not tensors
        return twin.quantize_(weights)

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
        rows = x.reshape(-1, self.in_features).contiguous()
        if self.scales is None:
            y = packed_matmul(rows, self.packed, self.out_features)
        else:
            y = packed_matmul_int8(rows, self.packed, self.scales, self.out_features)
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
        head = self.head[0]
        return unpack_rows(head.packed, tokens, head.scales)  # (B, T, C)
