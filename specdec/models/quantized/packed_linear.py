"""Linear layers stored for the CPU small-row kernels (specdec.kernels).

`PackedLinear.fuse([q, k, v])` packs several projections that read the same
input into one matrix, so a layer makes 4 kernel calls instead of 7.

Weight formats: float32 panels; bf16 / fp16 panels (two bytes a weight, widened
to float32 in the kernel: a bfloat16 or float16 checkpoint from half the bytes,
computing what float32 panels of the same values compute); int8 (weight-only, per
output channel, float32 activations); int4 and int7 (grouped 4-bit weights as llama.cpp's Q4_0, or 7-bit,
multiplied with activations quantized to int8 per block of 32 inside the kernel:
integer dot products are what make low-bit weights pay on AVX2). `int4:G` / `int7:G`
pick the group size (default 32).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from specdec.kernels import (FLOAT_PANEL_DTYPES, INTEGER_BLOCK, INTEGER_COLUMNS, PANEL, dequantize_grouped,
                             grouped_bits, integer_matmul,
                             pack_weight, packed_matmul, packed_matmul_int8, quantize_grouped, quantize_packed_int8,
                             unpack_rows)

# int4 and int7 also as int4:G (group size G); gguf: a GGUF file's own blocks (models/quantized/gguf_linear.py)
WEIGHT_FORMATS = ("float32", "bf16", "fp16", "int8", "int4", "int7", "gguf")
GROUPED_FORMATS = {"int4": 4, "int7": 7}
GROUP_SIZE = 32


def parse_weight_format(weights: str) -> tuple[str, int | None]:
    """'float32' | 'bf16' | 'fp16' | 'int8' | 'int4[:G]' | 'int7[:G]' | 'gguf' -> (kind, group size or None);
    ValueError otherwise."""
    kind, _, group = weights.partition(":")
    if kind not in WEIGHT_FORMATS or (group and kind not in GROUPED_FORMATS):
        raise ValueError(f"unknown weight format {weights!r} "
                         "(choose from float32, bf16, fp16, int8, int4[:GROUP], int7[:GROUP], gguf)")
    if kind not in GROUPED_FORMATS:
        return kind, None
    try:
        group_size = int(group) if group else GROUP_SIZE
    except ValueError:
        raise ValueError(f"{kind} group size must be an integer, not {group!r}") from None
    if group_size <= 0 or group_size % INTEGER_BLOCK:
        raise ValueError(f"{kind} group size must be a positive multiple of {INTEGER_BLOCK}, not {group_size}")
    return kind, group_size


def head_weight_format(weights: str) -> str:
    """The LM head's format for a model in `weights`: int4 models keep a 7-bit head (as llama.cpp keeps its
    output matrix at 6 bits), so the logits a sampler sees stay close to the float model's."""
    return "int7" if weights.startswith("int4") else weights


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, split_sizes: Sequence[int]):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.split_sizes = list(split_sizes)
        # float32 (bf16, fp16): (P, K, 16) panels; int8: the same panels in int8 with `scales` (P * 16,) per column;
        # int4/int7: uint8 codes (ceil(N/8), K/8 or K/4, 32) with float16 `scales` (ceil(N/8), K/G, 8)
        self.register_buffer("packed", pack_weight(weight))
        self.register_buffer("bias", None if bias is None else bias.float().clone())
        self.register_buffer("scales", None)

    @classmethod
    def from_buffers(cls, packed: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None,
                     out_features: int, in_features: int, split_sizes: Sequence[int]) -> "PackedLinear":
        """A layer over buffers packed earlier (models/quantized/packed_cache.py saved them): no float weight needed."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features, layer.split_sizes = out_features, in_features, list(split_sizes)
        layer.register_buffer("packed", packed)
        layer.register_buffer("bias", bias)
        layer.register_buffer("scales", scales)
        return layer

    def layout(self) -> dict:
        """What from_buffers needs besides the buffers."""
        return {"out_features": self.out_features, "in_features": self.in_features, "split_sizes": self.split_sizes}

    @property
    def weight_format(self) -> str:
        for name, dtype in FLOAT_PANEL_DTYPES.items():
            if self.packed.dtype == dtype:
                return name
        if self.packed.dtype == torch.int8:
            return "int8"
        kind = f"int{grouped_bits(self.packed, self.in_features)}"
        group_size = self.in_features // self.scales.shape[1]
        return kind if group_size == GROUP_SIZE else f"{kind}:{group_size}"

    def quantize_(self, weights: str) -> "PackedLinear":
        """Switch to another weight format in place; only float panels (float32, bf16, fp16) can be converted:
        to another float type (rounded where it has fewer bits) or quantized."""
        kind, group_size = parse_weight_format(weights)
        if (kind, group_size) == parse_weight_format(self.weight_format):  # "int4" and "int4:32" alike
            return self
        if self.weight_format not in FLOAT_PANEL_DTYPES or kind == "gguf":
            raise ValueError(f"{self.weight_format} weights cannot be turned into {weights}")
        if kind in FLOAT_PANEL_DTYPES:
            self.packed = self.packed.to(FLOAT_PANEL_DTYPES[kind])
        elif kind == "int8":
            self.packed, self.scales = quantize_packed_int8(self.packed.float())
        elif kind in GROUPED_FORMATS:
            weight = unpack_rows(self.packed, torch.arange(self.out_features))  # (N, K)
            self.packed, self.scales = quantize_grouped(weight, group_size, GROUPED_FORMATS[kind])
        return self

    def to_bf16_if_lossless_(self) -> "PackedLinear":
        """Float32 panels whose every value is a bfloat16 (a head saved in bf16) become bf16 panels in place:
        the kernel widens them back exactly, so the products are the same from half the bytes. Else as is."""
        if self.packed.dtype == torch.float32 and torch.equal(self.packed, self.packed.bfloat16().float()):
            self.packed = self.packed.bfloat16()
        return self

    def quantized_copy(self, weights: str) -> "PackedLinear":
        """A copy in another weight format; this layer is left as it is (for a quantized self-draft)."""
        twin = copy.copy(self)
        twin._buffers = dict(self._buffers)  # its own buffer table: quantize_ replaces entries, not tensors
        return twin.quantize_(weights)

    def first_outputs(self, count: int) -> "PackedLinear":
        """The same layer computing only its first `count` outputs, sharing the weights (no copy): the
        leading dimension of every format is blocks of output columns."""
        block = INTEGER_COLUMNS if self.packed.dtype == torch.uint8 else PANEL
        if len(self.split_sizes) > 1 or not 0 < count <= self.out_features or count % PANEL:
            raise ValueError(f"first_outputs: {count} must be a multiple of {PANEL} in (0, {self.out_features}]")
        twin = copy.copy(self)
        twin._buffers = dict(self._buffers)
        twin.packed = self.packed[: count // block]
        if self.scales is not None:  # int8: one scale per column; grouped: (blocks, K/G, 8)
            twin.scales = self.scales[:count] if self.packed.dtype == torch.int8 else self.scales[: count // block]
        if self.bias is not None:
            twin.bias = self.bias[:count]
        twin.out_features, twin.split_sizes = count, [count]
        return twin

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
        y = self.unsplit(x)
        return y.split(self.split_sizes, dim=-1) if len(self.split_sizes) > 1 else y

    def unsplit(self, x: torch.Tensor) -> torch.Tensor:
        """(..., K) -> (..., N): the fused layers' outputs side by side."""
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).contiguous()
        if self.packed.dtype in FLOAT_PANEL_DTYPES.values():
            y = packed_matmul(rows, self.packed, self.out_features)
        elif self.packed.dtype == torch.int8:
            y = packed_matmul_int8(rows, self.packed, self.scales, self.out_features)
        else:
            y = integer_matmul(rows, self.packed, self.scales, self.out_features)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*lead, self.out_features)

    def embedding_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rows of the matrix as float32 (..., K): the embeddings of tokens when it is a tied LM head."""
        if self.packed.dtype == torch.uint8:
            return dequantize_grouped(self.packed, self.scales, self.in_features, tokens)
        return unpack_rows(self.packed, tokens, self.scales)


class PackedEmbedding(nn.Module):
    """Token embeddings read from a packed matrix: the LM head they are tied to (no second copy), or, with
    owned=True, a table of their own kept packed (a GGUF file's quantized embeddings, a bf16/fp16 model's untied
    table: `table`)."""

    def __init__(self, head: PackedLinear, owned: bool = False):
        super().__init__()
        self.head = [head]  # a list: a tied head is not registered twice as a submodule
        if owned:
            self.table = head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head[0].embedding_rows(tokens)  # (B, T, C)
