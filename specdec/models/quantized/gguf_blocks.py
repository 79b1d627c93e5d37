"""llama.cpp's quantized blocks, read as they are: the weight values a GGUF file holds, without a float copy.

`--weights gguf` runs a GGUF model on its own quantized weights (the very values llama.cpp multiplies by)
instead of dequantizing them to float32 and re-quantizing. Every block format read here is one case of

    W[n, k] = d[n, k // S] * sc[n, k // G] * q[n, k] + dmin[n, k // S] * mn[n, k // G]

with integer codes q, int8 group codes sc and mn per group of G inputs, and float16 d and dmin per
super-block of S inputs. The table below maps each format onto it; `BlockWeights.dequantize()` equals
`gguf.quants.dequantize` bit for bit (tests/test_gguf_blocks.py), and the kernel (kernels/gguf_matmul.cpp)
multiplies by exactly these values.

| format | codes q | G | S | sc | mn | d | dmin |
|---|---|---|---|---|---|---|---|
| Q4_0 | 0..15 | 32 | 32 | 1 | 1 | d | -8 d |
| Q4_1 | 0..15 | 32 | 32 | 1 | 1 | d | m |
| Q5_0 | 0..31 | 32 | 32 | 1 | 1 | d | -16 d |
| Q8_0 | -128..127 | 32 | 32 | 1 | 0 | d | 0 |
| Q4_K | 0..15 | 32 | 256 | 6-bit scale | 6-bit min | d | -dmin |
| Q6_K | 0..63 | 16 | 256 | int8 scale | the same scale | d | -32 d |

(-8 d, -16 d, -32 d and -dmin are exact in float16.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SUPPORTED_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
LAYOUT_ORDER = ("nibbles", "sixbits", "signed")  # each holds every code of the ones before it (0..15, 0..63, int8)


@dataclass
class BlockWeights:
    """An (N, K) matrix in block form (module docstring)."""

    codes: torch.Tensor  # (N, K) uint8 (layout nibbles/sixbits) or int8 (signed)
    sc: torch.Tensor  # (N, K / group) int8
    mn: torch.Tensor  # (N, K / group) int8
    d: torch.Tensor  # (N, K / super_group) float16
    dmin: torch.Tensor  # (N, K / super_group) float16
    group: int
    super_group: int
    layout: str  # "nibbles" (codes < 16), "sixbits" (codes < 64) or "signed" (int8 codes)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 (N, K), or only `rows` of it (..., K): the values llama.cpp's dequantization gives."""
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        return dequantize_parts(pick(self.codes), pick(self.sc), pick(self.mn), pick(self.d), pick(self.dmin),
                                self.group, self.super_group)

    def rows(self, index: torch.Tensor) -> "BlockWeights":
        """The same form for rows `index` only (e.g. undoing llama.cpp's q/k row order)."""
        return BlockWeights(self.codes[index], self.sc[index], self.mn[index], self.d[index], self.dmin[index],
                            self.group, self.super_group, self.layout)

    def promoted(self, layout: str, group: int, super_group: int) -> "BlockWeights":
        """The same values in a more general form: a wider code layout, smaller groups or super-blocks
        (scales repeated), so that matrices of different formats can be fused into one."""
        codes = self.codes
        if layout == "signed" and self.layout != "signed":
            codes = codes.to(torch.int8)  # codes < 128 fit
        sc = self.sc.repeat_interleave(self.group // group, dim=1)
        mn = self.mn.repeat_interleave(self.group // group, dim=1)
        d = self.d.repeat_interleave(self.super_group // super_group, dim=1)
        dmin = self.dmin.repeat_interleave(self.super_group // super_group, dim=1)
        return BlockWeights(codes, sc, mn, d, dmin, group, super_group, layout)


def dequantize_parts(codes, sc, mn, d, dmin, group: int, super_group: int) -> torch.Tensor:
    """W = d sc q + dmin mn in float32 with llama.cpp's rounding: d sc and dmin mn are exact, then one
    product and one sum per weight."""
    k = codes.shape[-1]
    per_super = super_group // group
    scale = (d.float().repeat_interleave(per_super, dim=-1) * sc.float()).repeat_interleave(group, dim=-1)
    minimum = (dmin.float().repeat_interleave(per_super, dim=-1) * mn.float()).repeat_interleave(group, dim=-1)
    return (scale * codes.float() + minimum)[..., :k]


def concatenate(parts: list[BlockWeights]) -> BlockWeights:
    """Matrices stacked along N (fused q/k/v, gate/up), promoted to their most general common form."""
    layout = max((p.layout for p in parts), key=LAYOUT_ORDER.index)
    group, super_group = min(p.group for p in parts), min(p.super_group for p in parts)
    parts = [p.promoted(layout, group, super_group) for p in parts]
    return BlockWeights(*(torch.cat([getattr(p, name) for p in parts]) for name in ("codes", "sc", "mn", "d", "dmin")),
                        group, super_group, layout)


def _half(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields, raw (..., 2) uint8 -> (...) float16."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0]


def _nibbles_low_then_high(qs: np.ndarray) -> np.ndarray:
    """(..., 16 j) bytes -> (..., 32 j) codes: a run of bytes gives its low nibbles, then its high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def decode(raw: np.ndarray, format_name: str, rows: int, cols: int) -> BlockWeights:
    """A GGUF tensor's bytes (rows, bytes per row) in `format_name` -> BlockWeights (rows, cols)."""
    if format_name not in SUPPORTED_FORMATS:
        raise ValueError(f"GGUF block format {format_name} is not supported (supported: {', '.join(SUPPORTED_FORMATS)})")
    raw = np.asarray(raw, dtype=np.uint8).reshape(rows, -1)
    if format_name in ("Q4_0", "Q4_1", "Q5_0", "Q8_0"):
        size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q8_0": 34}[format_name]
        blocks = raw.reshape(rows, cols // 32, size)  # (N, K/32, bytes)
        d = _half(blocks[..., 0:2])  # (N, K/32)
        ones = np.ones((rows, cols // 32), np.int8)
        if format_name == "Q8_0":
            codes = blocks[..., 2:].view(np.int8).reshape(rows, cols)
            return _weights(codes, ones, np.zeros_like(ones), d, np.zeros_like(d), 32, 32, "signed")
        if format_name == "Q4_0":
            codes, dmin = _nibbles_low_then_high(blocks[..., 2:]), d * np.float16(-8)
        elif format_name == "Q4_1":
            codes, dmin = _nibbles_low_then_high(blocks[..., 4:]), _half(blocks[..., 2:4])
        else:  # Q5_0: 4 bytes of fifth bits (bit j for element j), then the low nibbles
            high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")  # (N, K/32, 32)
            codes, dmin = _nibbles_low_then_high(blocks[..., 6:]) | (high << 4), d * np.float16(-16)
        return _weights(codes.reshape(rows, cols), ones, ones, d, dmin, 32, 32,
                        "nibbles" if format_name != "Q5_0" else "sixbits")
    if format_name == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of codes
        blocks = raw.reshape(rows, cols // 256, 144)
        d, dmin = _half(blocks[..., 0:2]), _half(blocks[..., 2:4])  # (N, K/256)
        packed = blocks[..., 4:16].reshape(rows, cols // 256, 3, 4)
        first, second, third = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
        sc = np.concatenate([first & 0x3F, (third & 0x0F) | ((first >> 2) & 0x30)], axis=-1)  # (N, K/256, 8)
        mn = np.concatenate([second & 0x3F, (third >> 4) | ((second >> 2) & 0x30)], axis=-1)
        codes = _nibbles_low_then_high(blocks[..., 16:].reshape(rows, cols // 256, 4, 32))  # 64 codes per 32 bytes
        return _weights(codes.reshape(rows, cols), sc.reshape(rows, -1).astype(np.int8),
                        mn.reshape(rows, -1).astype(np.int8), d.reshape(rows, -1), (-dmin).reshape(rows, -1),
                        32, 256, "nibbles")
    # Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d
    blocks = raw.reshape(rows, cols // 256, 210)
    low = blocks[..., :128].reshape(rows, cols // 256, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    low = (low & 0x0F).reshape(rows, cols // 256, 8, 32)
    high = blocks[..., 128:192].reshape(rows, cols // 256, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    high = (high & 0x03).reshape(rows, cols // 256, 8, 32)
    sc = blocks[..., 192:208].view(np.int8).reshape(rows, -1)
    d = _half(blocks[..., 208:210])
    codes = (low | (high << 4)).reshape(rows, cols)
    return _weights(codes, sc, sc, d, d * np.float16(-32), 16, 256, "sixbits")


def _weights(codes, sc, mn, d, dmin, group: int, super_group: int, layout: str) -> BlockWeights:
    def tensor(array, dtype):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))

    return BlockWeights(tensor(codes, np.int8 if layout == "signed" else np.uint8), tensor(sc, np.int8),
                        tensor(mn, np.int8), tensor(d, np.float16), tensor(dmin, np.float16), group, super_group,
                        layout)
