"""Weight layouts the CPU kernels read, and the quantization that fills them (pure torch, no kernel call):
float32 / bfloat16 / float16 / int8 panels (packed_matmul.cpp), grouped 4-bit and 7-bit codes (integer_matmul.cpp), and the
code layouts of a GGUF file's blocks (gguf_matmul.cpp)."""

from __future__ import annotations

import torch

PANEL = 16  # output columns per packed panel (two AVX2 registers)


FLOAT_PANEL_DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (ceil(N/16), K, 16) float32 panels: panel p holds output rows 16p..16p+15, k-major (bf16 /
    fp16 panels are these cast: `.to(FLOAT_PANEL_DTYPES[format])`)."""
    rows, cols = weight.shape
    padded = (rows + PANEL - 1) // PANEL * PANEL
    weight = weight.float()
    if padded != rows:  # padding copies the matrix: only when the row count needs it
        weight = torch.nn.functional.pad(weight, (0, 0, 0, padded - rows))
    return weight.view(padded // PANEL, PANEL, cols).transpose(1, 2).contiguous()


def quantize_packed_int8(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 panels (P, K, 16) -> int8 panels of the same layout and one scale per output column (P * 16,).

    Symmetric per-channel: scale = max |w| / 127 over the column's K inputs (1 for an all-zero column)."""
    scales = packed.abs().amax(dim=1) / 127.0  # (P, 16)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    quantized = torch.round(packed / scales[:, None, :]).clamp_(-127, 127).to(torch.int8)  # (P, K, 16)
    return quantized, scales.reshape(-1).contiguous()


def unpack_rows(packed: torch.Tensor, rows: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of the original (N, K) matrix as float32, e.g. embeddings tied to a packed LM head: (..., K)."""
    values = packed[rows // PANEL, :, rows % PANEL].float()
    return values if scales is None else values * scales[rows].unsqueeze(-1)


INTEGER_COLUMNS = 8  # output columns per column block of the integer kernels (one register of int32 lanes)
INTEGER_BLOCK = 32  # inputs per activation block; weight groups are multiples of it
ZERO_POINTS = {4: 8, 7: 64}  # stored unsigned: w = scale * (q - zero)


def quantize_grouped(weight: torch.Tensor, group_size: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float -> packed uint8 codes and float16 scales (ceil(N/8), K/G, 8), integer_matmul.cpp's layout.

    bits=4, as llama.cpp's Q4_0: per output column and group of G inputs, d = m / -8 where m is the group's
    value of largest magnitude, q = clamp(round(w / d), -8, 7): all 16 codes used and m hit exactly;
    packed (ceil(N/8), K/8, 32), two codes a byte.
    bits=7: d = max|w| / 63, q = round(w / d) in -63..63; packed (ceil(N/8), K/4, 32), a code a byte."""
    rows, cols = weight.shape
    if group_size <= 0 or group_size % INTEGER_BLOCK or cols % group_size:
        raise ValueError(f"int{bits} group size {group_size} must be a multiple of {INTEGER_BLOCK} dividing the "
                         f"layer's {cols} inputs")
    padded = (rows + INTEGER_COLUMNS - 1) // INTEGER_COLUMNS * INTEGER_COLUMNS
    weight = torch.nn.functional.pad(weight.float(), (0, 0, 0, padded - rows))
    groups = weight.view(padded, cols // group_size, group_size)  # (N, K/G, G)
    if bits == 4:
        extreme = groups.gather(2, groups.abs().argmax(dim=2, keepdim=True))  # (N, K/G, 1), signed
        scales, low, high = (extreme / -8.0).half(), -8, 7
    else:
        scales, low, high = (groups.abs().amax(dim=2, keepdim=True) / 63.0).half(), -63, 63
    divisor = torch.where(scales != 0, scales.float(), torch.ones_like(scales, dtype=torch.float32))
    zero = ZERO_POINTS[bits]
    q = (torch.round(groups / divisor).clamp_(low, high) + zero).to(torch.uint8).view(padded, cols)  # (N, K)
    blocks = padded // INTEGER_COLUMNS
    scales = scales.view(blocks, INTEGER_COLUMNS, cols // group_size).transpose(1, 2).contiguous()
    return pack_codes(q, bits), scales


def pack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (N, K) uint8, N a multiple of 8 -> the integer kernels' column-block layout: bits=4 (codes
    below 16, two a byte) (N/8, K/8, 32), else a code a byte (N/8, K/4, 32)."""
    rows, cols = q.shape
    blocks = rows // INTEGER_COLUMNS
    if bits == 4:  # (C, 8 cols, K/8 steps, 2 halves, 4 inputs): the halves become low and high nibbles
        q = q.view(blocks, INTEGER_COLUMNS, cols // 8, 2, 4)
        codes = (q[:, :, :, 0, :] | (q[:, :, :, 1, :] << 4)).permute(0, 2, 1, 3)  # (C, K/8, 8, 4)
    else:
        codes = q.view(blocks, INTEGER_COLUMNS, cols // 4, 4).permute(0, 2, 1, 3)  # (C, K/4, 8, 4)
    return codes.reshape(blocks, -1, 32).contiguous()


def grouped_bits(packed: torch.Tensor, in_features: int) -> int:
    """4 or 7: which quantize_grouped layout `packed` holds (two codes a byte, or one)."""
    return 4 if packed.shape[1] * 8 == in_features else 7


def unpack_codes(packed: torch.Tensor, rows: torch.Tensor, in_features: int) -> torch.Tensor:
    """`rows` of the (N_padded, K) code matrix `pack_codes` packed: (..., K) uint8."""
    bits, steps = grouped_bits(packed, in_features), packed.shape[1]
    block, column = rows // INTEGER_COLUMNS, rows % INTEGER_COLUMNS
    quads = packed[block].view(*rows.shape, steps, INTEGER_COLUMNS, 4)  # (..., steps, 8, 4)
    index = column.view(*rows.shape, 1, 1, 1).expand(*rows.shape, steps, 1, 4)
    quads = torch.take_along_dim(quads, index, dim=-2).squeeze(-2)  # (..., steps, 4)
    if bits == 4:
        quads = torch.stack([quads & 0x0F, quads >> 4], dim=-2)  # (..., K/8, 2, 4)
    return quads.reshape(*rows.shape, in_features)


def dequantize_grouped(packed: torch.Tensor, scales: torch.Tensor, in_features: int,
                       rows: torch.Tensor | None = None) -> torch.Tensor:
    """The (N_padded, K) float32 matrix the integer kernel multiplies by, or only `rows` of it: (..., K)."""
    bits, blocks, groups = grouped_bits(packed, in_features), packed.shape[0], scales.shape[1]
    if rows is None:
        rows = torch.arange(blocks * INTEGER_COLUMNS)
    block, column = rows // INTEGER_COLUMNS, rows % INTEGER_COLUMNS
    q = unpack_codes(packed, rows, in_features).float() - ZERO_POINTS[bits]  # (..., K)
    index = column.view(*rows.shape, 1, 1).expand(*rows.shape, groups, 1)
    scale = torch.take_along_dim(scales[block], index, dim=-1).squeeze(-1).float()  # (..., K/G)
    return q * scale.repeat_interleave(in_features // groups, dim=-1)


GGUF_LAYOUTS = {"nibbles": 0, "sixbits": 1, "signed": 2, "iq4": 3, "crumbs": 4, "fp4": 5}  # gguf_matmul.cpp's
