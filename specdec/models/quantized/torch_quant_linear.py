"""Weight-only int8 / int4 linear layers on torch's own low-bit operators: the quantized self-draft
(`quant:int8`, `quant:int4[:G]`) wherever the CPU kernel (specdec/kernels) does not serve the model: on a
GPU, on CPUs without AVX2 or a C++ compiler (ARM included), for bfloat16/float16 weights.

- int8: one symmetric scale per output column, `aten._weight_int8pack_mm` (CPU; CUDA where the build has
  it, else the int8 matrix is widened at each call: the draft then saves memory, not time).
- int4: per output column and group of G inputs an asymmetric scale and zero in tinygemm's form,
  w = (q - 8) * scale + zero with q in 0..15: `aten._weight_int4pack_mm_for_cpu` on a CPU,
  `aten._weight_int4pack_mm` on CUDA (bfloat16 activations, Ampere or newer).

These are drafts only: the target keeps its own weights and the exact acceptance rule its output.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels import quantize_packed_int8
from specdec.models.quantized.packed_linear import parse_weight_format

TORCH_QUANT_FORMATS = ("int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what tinygemm's kernels take


def int4_inner_k_tiles(in_features: int) -> int:
    """tinygemm's k-tiling (2, 4 or 8 tiles of 16 inputs): the largest that divides in_features."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"int4 needs the input width ({in_features}) to be a multiple of 32")


class TorchQuantLinear(nn.Module):
    """y = x @ W^T (+ bias) with W quantized once, at construction, from a float nn.Linear."""

    def __init__(self, linear: nn.Linear, weights: str):
        super().__init__()
        kind, group = parse_weight_format(weights)
        if kind not in TORCH_QUANT_FORMATS:
            raise ValueError(f"{weights} is a format of the CPU kernel; torch's operators take int8 and int4[:GROUP]")
        self.weight_format = weights
        self.out_features, self.in_features = linear.weight.shape
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        weight = linear.weight.detach().float()  # (N, K)
        self.group_size = group
        self.on_cuda = weight.device.type == "cuda"
        self.int8_op = kind == "int8"  # cleared at the first call where this build has no int8 kernel for the device
        if kind == "int8":  # the packed int8 format's per-column quantization, on one (1, K, N) "panel"
            codes, scales = quantize_packed_int8(weight.t().unsqueeze(0))
            self.register_buffer("codes", codes[0].t().contiguous())  # (N, K) int8
            self.register_buffer("scales", scales.to(linear.weight.dtype))  # (N,)
        else:
            self._quantize_int4(weight, group, linear.weight.dtype)

    def _quantize_int4(self, weight: torch.Tensor, group: int, activation_dtype: torch.dtype) -> None:
        if group not in INT4_GROUP_SIZES or self.in_features % group:
            raise ValueError(f"int4 group size {group} must be one of {INT4_GROUP_SIZES} and divide {self.in_features}")
        rows = self.out_features
        grouped = weight.view(rows, self.in_features // group, group)
        low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)  # (N, K/G)
        scale = ((high - low) / 15.0).clamp(min=1e-8)
        q = torch.round((grouped - low[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).view(rows, -1)
        zero = low + 8.0 * scale  # w = (q - 8) * scale + zero = q * scale + low
        if self.on_cuda:
            if rows % 8:
                raise ValueError(f"int4 on CUDA needs the output width ({rows}) to be a multiple of 8")
            two_per_byte = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # (N, K/2)
            packed = torch.ops.aten._convert_weight_to_int4pack(two_per_byte, int4_inner_k_tiles(self.in_features))
            table_dtype = torch.bfloat16
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # (N, K/2) uint8, outputs in tiles
            table_dtype = torch.bfloat16 if activation_dtype == torch.bfloat16 else torch.float32
        self.register_buffer("codes", packed)
        self.register_buffer("scales", torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(table_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., K) -> (..., N) in x's dtype."""
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if self.weight_format == "int8":
            y = self._int8(rows)
        else:
            compute = self.scales.dtype  # the kernels' activation dtype (bfloat16 on CUDA)
            op = torch.ops.aten._weight_int4pack_mm if self.on_cuda else torch.ops.aten._weight_int4pack_mm_for_cpu
            y = op(rows.to(compute).contiguous(), self.codes, self.group_size, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*lead, self.out_features)

    def _int8(self, rows: torch.Tensor) -> torch.Tensor:
        scales = self.scales.to(rows.dtype)
        if self.int8_op:
            try:
                return torch.ops.aten._weight_int8pack_mm(rows.contiguous(), self.codes, scales)
            except (NotImplementedError, RuntimeError):  # no kernel for this device or dtype in this build
                self.int8_op = False
        return F.linear(rows, self.codes.to(rows.dtype)) * scales

    def first_outputs(self, count: int) -> "TorchQuantLinear":
        """The same int8 layer computing only its first `count` outputs, sharing the codes (vocab=N drafts)."""
        if not 0 < count <= self.out_features:
            raise ValueError(f"the head has {self.out_features} outputs, not {count}")
        if self.weight_format != "int8":  # an int4 draft's head is int8 (quantized_copy)
            raise ValueError("int4 weights are packed in tiles of outputs, which a prefix cannot slice")
        twin = copy.copy(self)
        twin._buffers = dict(self._buffers)
        twin.codes, twin.scales = self.codes[:count], self.scales[:count]  # (N, K) int8 and (N,): a view
        if self.bias is not None:
            twin.bias = self.bias[:count]
        twin.out_features = count
        return twin

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight_format}"
