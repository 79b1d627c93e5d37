"""Linear layers on a GGUF file's own quantized blocks (`--weights gguf`); a file's layers are built by
models/quantized/gguf_matrices.py.

A `GgufLinear` is a PackedLinear whose matrix is BlockWeights (models/quantized/gguf_blocks.py) packed for
kernels/gguf_matmul.cpp: codes in the integer kernels' column-block layout, int8 group codes
(C, K/G, 2, 8) in `scales`, float16 super-block scales (C, K/S, 2, 8) in `super_scales` (layouts without a
minimum, IQ4 and FP4: (C, K/G, 1, 8) and (C, K/S, 1, 8), sc and d alone). Fused
projections (q/k/v, gate/up) whose formats differ (Q4_K q and k with a Q6_K v) are promoted to a common
form first, which changes no value.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.kernels import GGUF_LAYOUTS, INTEGER_COLUMNS, gguf_matmul, pack_codes, unpack_codes
from specdec.models.quantized.gguf_blocks import BlockWeights, code_values, dequantize_parts
from specdec.models.quantized.packed_linear import PackedLinear

LOOKED_UP = ("iq4", "fp4")  # layouts whose codes index a table and have no minimum (gguf_matmul.cpp)


class GgufLinear(PackedLinear):
    def __init__(self, weights: BlockWeights, bias: torch.Tensor | None, split_sizes: Sequence[int]):
        torch.nn.Module.__init__(self)
        rows, cols = weights.shape
        self.out_features, self.in_features, self.split_sizes = rows, cols, list(split_sizes)
        self.block_form = {"layout": weights.layout, "group": weights.group, "super_group": weights.super_group}
        padded = (rows + INTEGER_COLUMNS - 1) // INTEGER_COLUMNS * INTEGER_COLUMNS
        blocks = padded // INTEGER_COLUMNS

        def pad(t: torch.Tensor) -> torch.Tensor:  # padded columns: zero codes and scales, zero outputs
            return torch.nn.functional.pad(t, (0, 0, 0, padded - rows))

        # layouts without a minimum (IQ4, FP4) keep sc and d alone: 3 bytes a block of 32 fewer to stream
        kept = 1 if weights.layout in LOOKED_UP else 2

        def by_column_block(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:  # -> (C, groups, kept, 8)
            pair = torch.stack([pad(first), pad(second)][:kept], dim=-1)  # (N, groups, kept)
            return pair.view(blocks, INTEGER_COLUMNS, -1, kept).permute(0, 2, 3, 1).contiguous()

        codes = pad(weights.codes).view(torch.uint8)  # signed codes travel as their bytes
        packers = {"sixbits": pack_sixbits, "crumbs": pack_bit_pairs}  # crumbs: gguf_matmul.cpp's two-bit layout
        self.register_buffer("packed", packers[weights.layout](codes) if weights.layout in packers
                             else pack_codes(codes, 8 if weights.layout == "signed" else 4))
        self.register_buffer("scales", by_column_block(weights.sc, weights.mn))
        self.register_buffer("super_scales", by_column_block(weights.d, weights.dmin))
        self.register_buffer("bias", None if bias is None else bias.float().clone())

    @classmethod
    def from_buffers(cls, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                     in_features: int, split_sizes: Sequence[int], gguf: dict | None = None,
                     super_scales: torch.Tensor | None = None) -> "GgufLinear":
        if gguf is None or gguf.get("layout") not in GGUF_LAYOUTS:  # a cache file from an older layout
            raise ValueError(f"unknown GGUF block layout {gguf}")
        if (gguf["layout"] in LOOKED_UP) != (scales.shape[-2] == 1):  # packed before minimums were left out
            raise ValueError(f"GGUF block layout {gguf['layout']} with {scales.shape[-2]} group codes a column")
        layer = super().from_buffers(packed, scales, bias, out_features, in_features, split_sizes)
        layer.block_form = dict(gguf)
        layer.register_buffer("super_scales", super_scales)
        return layer

    def layout(self) -> dict:
        return {**super().layout(), "gguf": self.block_form}

    @property
    def weight_format(self) -> str:
        return "gguf"

    def first_outputs(self, count: int) -> "GgufLinear":
        twin = super().first_outputs(count)  # codes and group codes: (C, ...), blocks of 8 output columns
        twin.super_scales = self.super_scales[: count // INTEGER_COLUMNS]
        return twin

    def unsplit(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).contiguous()
        form = self.block_form
        y = gguf_matmul(rows, self.packed, self.scales, self.super_scales, self.out_features, form["layout"],
                        form["group"], form["super_group"])
        if self.bias is not None:
            y += self.bias
        return y.reshape(*lead, self.out_features)

    def embedding_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rows of the matrix as float32 (..., K): embeddings tied to this head, or an embedding table."""
        layout = self.block_form["layout"]
        if layout == "sixbits":
            codes = unpack_sixbits(self.packed, tokens, self.in_features)
        elif layout == "crumbs":
            codes = unpack_bit_pairs(self.packed, tokens, self.in_features)
        else:
            codes = unpack_codes(self.packed, tokens, self.in_features)
        if layout == "signed":
            codes = codes.view(torch.int8)
        codes = code_values(codes, layout)
        block, column = tokens // INTEGER_COLUMNS, tokens % INTEGER_COLUMNS

        def of_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (C, groups, 2, 8) -> 2 x (..., groups)
            picked = table[block]  # (..., groups, 2, 8)
            index = column.view(*tokens.shape, 1, 1, 1).expand(*picked.shape[:-1], 1)
            picked = torch.take_along_dim(picked, index, dim=-1).squeeze(-1)  # (..., groups, 2 or 1)
            return picked[..., 0], (picked[..., 1] if picked.shape[-1] == 2 else torch.zeros_like(picked[..., 0]))

        (sc, mn), (d, dmin) = of_rows(self.scales), of_rows(self.super_scales)
        return dequantize_parts(codes, sc, mn, d, dmin, self.block_form["group"], self.block_form["super_group"])


def pack_bit_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Codes below 4 (N, K) uint8, N a multiple of 8 -> (N/8, K/8, 16): per step of 8 inputs x 8 columns,
    byte m holds the codes of the 4-bit layout's first[m], first[m + 16], second[m], second[m + 16] (the two
    vectors of a step its loader makes) in bits 0-1, 2-3, 4-5, 6-7."""
    rows, cols = codes.shape
    pairs = codes.view(rows // INTEGER_COLUMNS, INTEGER_COLUMNS, cols // 8, 2, 4)  # (C, 8 cols, steps, half, 4)
    pairs = pairs.permute(0, 2, 3, 1, 4).reshape(rows // INTEGER_COLUMNS, cols // 8, 2, 32)  # [.., 0, m]: first[m]
    first, second = pairs[:, :, 0], pairs[:, :, 1]
    return (first[..., :16] | (first[..., 16:] << 2) | (second[..., :16] << 4) | (second[..., 16:] << 6)).contiguous()


def unpack_bit_pairs(packed: torch.Tensor, rows: torch.Tensor, in_features: int) -> torch.Tensor:
    """`rows` of the code matrix pack_bit_pairs packed (its 16 bytes a step: `packed` (C, K/8, 16)): (..., K)."""
    block, column = rows // INTEGER_COLUMNS, rows % INTEGER_COLUMNS
    pairs = packed[block]  # (..., steps, 16)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
    codes = (pairs.unsqueeze(-2) >> shifts.view(4, 1)) & 3  # (..., steps, 4: first lo/hi, second lo/hi, 16)
    codes = codes.view(*pairs.shape[:-1], 2, INTEGER_COLUMNS, 4)  # (..., steps, half, m = 4 column + input)
    index = column.view(*rows.shape, 1, 1, 1, 1).expand(*codes.shape[:-2], 1, 4)
    return torch.take_along_dim(codes, index, dim=-2).squeeze(-2).reshape(*rows.shape, in_features)


def pack_sixbits(codes: torch.Tensor) -> torch.Tensor:
    """Codes below 64 (N, K) uint8, N a multiple of 8 -> gguf_matmul.cpp's six-bit layout (N/8, K/8, 48):
    per step of 8 inputs, the 4-bit layout's 32 bytes of low nibbles, then 16 bytes of top bit pairs."""
    return torch.cat([pack_codes(codes & 0x0F, 4), pack_bit_pairs(codes >> 4)], dim=-1).contiguous()


def unpack_sixbits(packed: torch.Tensor, rows: torch.Tensor, in_features: int) -> torch.Tensor:
    """`rows` of the code matrix pack_sixbits packed: (..., K) uint8."""
    low = unpack_codes(packed[:, :, :32], rows, in_features)  # (..., K)
    return low | (unpack_bit_pairs(packed[:, :, 32:], rows, in_features) << 4)
