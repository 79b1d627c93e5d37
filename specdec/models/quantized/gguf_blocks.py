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
| Q5_1 | 0..31 | 32 | 32 | 1 | 1 | d | m |
| Q2_K | 0..3 | 16 | 256 | 4-bit scale | 4-bit min | d | -dmin |
| Q3_K | 0..7 | 16 | 256 | 6-bit scale - 32 | the same scale | d | -4 d |
| Q4_K | 0..15 | 32 | 256 | 6-bit scale | 6-bit min | d | -dmin |
| Q5_K | 0..31 | 32 | 256 | 6-bit scale | 6-bit min | d | -dmin |
| Q6_K | 0..63 | 16 | 256 | int8 scale | the same scale | d | -32 d |
| IQ4_NL | IQ4[0..15] | 32 | 32 | 1 | 0 | d | 0 |
| IQ4_XS | IQ4[0..15] | 32 | 256 | 6-bit scale - 32 | 0 | d | 0 |
| MXFP4 | FP4[0..15] | 32 | 32 | 2^j | 0 | 2^(e - 128 - j) | 0 |

(-4 d, -8 d, -16 d, -32 d and -dmin are exact in float16.) Q2_K's codes keep their two bits (layout
"crumbs"), the others' are held in 4 bits or more. Q3_K's codes are its 2-bit values plus 4 times
its high bit, so q - 4 is the file's signed 3-bit value. The i-quants' codes index a fixed table of 16
int8 values (IQ4: `gguf.quants.IQ4_NL.kvalues`): their layout "iq4" keeps the 4-bit index, the kernel
looks the value up; promoted to "signed" the codes are the values themselves. MXFP4 (gpt-oss's experts) is
the same with another table (FP4: twice the e2m1 values, `gguf.quants.MXFP4.kvalues`) and a power-of-two
scale per block (e8m0: 2^(e - 128) with the doubling), held as d and, above float16's range, a
power-of-two sc; its layout "fp4" keeps the 4-bit index, as "iq4" does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SUPPORTED_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
                     "MXFP4")
# Tensor types whose values are stored as floats: their matrices run on float panels of their own type.
FLOAT_FORMATS = {"F32": "float32", "F16": "fp16", "BF16": "bf16"}
# Each layout's codes: crumbs 0..3, nibbles 0..15, sixbits 0..63, signed int8, iq4 an index into IQ4_VALUES,
# fp4 an index into FP4_VALUES.
LAYOUTS = ("crumbs", "nibbles", "sixbits", "signed", "iq4", "fp4")
# Unsigned layouts, each holding the codes of those before it.
WIDENING = ("crumbs", "nibbles", "sixbits")
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # llama.cpp's kvalues_iq4nl
FP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # llama.cpp's kvalues_mxfp4: 2 x e2m1


def common_layout(layouts: set[str]) -> str:
    """The most specific layout that holds every code of `layouts`: the widest of them where all are unsigned
    (sixbits holds nibbles, which hold crumbs), else "signed", which holds everything (iq4 codes as their
    values)."""
    if len(layouts) == 1:
        return next(iter(layouts))
    if layouts <= set(WIDENING):
        return max(layouts, key=WIDENING.index)
    return "signed"


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
    layout: str  # "crumbs" (codes < 4), "nibbles" (< 16), "sixbits" (< 64), "signed" (int8), "iq4"/"fp4" (table index)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 (N, K), or only `rows` of it (..., K): the values llama.cpp's dequantization gives."""
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        return dequantize_parts(code_values(pick(self.codes), self.layout), pick(self.sc), pick(self.mn), pick(self.d),
                                pick(self.dmin), self.group, self.super_group)

    def rows(self, index: torch.Tensor) -> "BlockWeights":
        """The same form for rows `index` only (e.g. undoing llama.cpp's q/k row order)."""
        return BlockWeights(self.codes[index], self.sc[index], self.mn[index], self.d[index], self.dmin[index],
                            self.group, self.super_group, self.layout)

    def promoted(self, layout: str, group: int, super_group: int) -> "BlockWeights":
        """The same values in a more general form: a wider code layout, smaller groups or super-blocks
        (scales repeated), so that matrices of different formats can be fused into one."""
        codes = self.codes
        if layout == "signed" and self.layout != "signed":
            codes = code_values(codes, self.layout).to(torch.int8)  # codes < 128 and the tables' values fit
        def repeated(tensor: torch.Tensor, times: int) -> torch.Tensor:
            return tensor if times == 1 else tensor.repeat_interleave(times, dim=1)

        sc, mn = repeated(self.sc, self.group // group), repeated(self.mn, self.group // group)
        d, dmin = repeated(self.d, self.super_group // super_group), repeated(self.dmin, self.super_group // super_group)
        return BlockWeights(codes, sc, mn, d, dmin, group, super_group, layout)


def code_values(codes: torch.Tensor, layout: str) -> torch.Tensor:
    """The integer each code stands for: itself, or for "iq4" ("fp4") its entry of IQ4_VALUES (FP4_VALUES)."""
    table = {"iq4": IQ4_VALUES, "fp4": FP4_VALUES}.get(layout)
    if table is None:
        return codes
    return torch.tensor(table, dtype=torch.int8)[codes.long()]


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
    layout = common_layout({p.layout for p in parts})
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
    if format_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"):
        return _decode_legacy(raw, format_name, rows, cols)
    if format_name == "MXFP4":
        return _decode_mxfp4(raw.reshape(rows, cols // 32, 17), rows, cols)
    blocks = raw.reshape(rows, cols // 256, -1)  # (N, K/256, bytes)
    return {"Q2_K": _decode_q2_k, "Q3_K": _decode_q3_k, "Q4_K": _decode_q4_k_q5_k, "Q5_K": _decode_q4_k_q5_k,
            "Q6_K": _decode_q6_k, "IQ4_XS": _decode_iq4_xs}[format_name](blocks, rows, cols)


def _decode_legacy(raw: np.ndarray, format_name: str, rows: int, cols: int) -> BlockWeights:
    """Blocks of 32 inputs with one float16 scale d (and Q4_1/Q5_1's m)."""
    size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "IQ4_NL": 18}[format_name]
    blocks = raw.reshape(rows, cols // 32, size)  # (N, K/32, bytes)
    d = _half(blocks[..., 0:2])  # (N, K/32)
    ones = np.ones((rows, cols // 32), np.int8)
    zeros = np.zeros_like(ones)
    if format_name == "Q8_0":
        codes = blocks[..., 2:].view(np.int8).reshape(rows, cols)
        return _weights(codes, ones, zeros, d, np.zeros_like(d), 32, 32, "signed")
    if format_name == "IQ4_NL":
        codes = _nibbles_low_then_high(blocks[..., 2:])
        return _weights(codes.reshape(rows, cols), ones, zeros, d, np.zeros_like(d), 32, 32, "iq4")
    if format_name == "Q4_0":
        codes, dmin = _nibbles_low_then_high(blocks[..., 2:]), d * np.float16(-8)
    elif format_name == "Q4_1":
        codes, dmin = _nibbles_low_then_high(blocks[..., 4:]), _half(blocks[..., 2:4])
    elif format_name == "Q5_0":  # 4 bytes of fifth bits (bit j for element j), then the low nibbles
        high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")  # (N, K/32, 32)
        codes, dmin = _nibbles_low_then_high(blocks[..., 6:]) | (high << 4), d * np.float16(-16)
    else:  # Q5_1: d, m, the fifth bits, the low nibbles
        high = np.unpackbits(blocks[..., 4:8], axis=-1, bitorder="little")
        codes, dmin = _nibbles_low_then_high(blocks[..., 8:]) | (high << 4), _half(blocks[..., 2:4])
    return _weights(codes.reshape(rows, cols), ones, ones, d, dmin, 32, 32,
                    "nibbles" if format_name in ("Q4_0", "Q4_1") else "sixbits")


def _decode_mxfp4(blocks: np.ndarray, rows: int, cols: int) -> BlockWeights:
    """A byte e (the scale 2^(e - 128), with the table's doubling), then 16 bytes of 4-bit indices (low nibbles
    then high). The scale is exact as float16 d from 2^-24 to 2^15; above, d = 2^15 and sc the rest (up to
    2^6); below, only an all-zero block (its d is 0)."""
    exponent = blocks[..., 0].astype(np.int32) - 128  # (N, K/32)
    codes = _nibbles_low_then_high(blocks[..., 1:])  # (N, K/32, 32) indices into FP4_VALUES
    shift = np.clip(exponent - 15, 0, None)
    tiny = exponent < -24
    if (shift > 6).any() or (tiny.any() and (tiny & (np.asarray(FP4_VALUES)[codes] != 0).any(axis=-1)).any()):
        raise ValueError("an MXFP4 block scale beyond 2^-24..2^21, which float16 scales cannot hold exactly")
    d = np.where(tiny, 0.0, np.exp2((exponent - shift).astype(np.float64))).astype(np.float16)
    sc = (1 << shift).astype(np.int8)
    zeros = np.zeros_like(sc)
    return _weights(codes.reshape(rows, cols), sc, zeros, d, np.zeros_like(d), 32, 32, "fp4")


def _six_bit_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes (..., 12) -> 8 six-bit scales and 8 six-bit mins (..., 8) each."""
    packed = packed.reshape(*packed.shape[:-1], 3, 4)
    first, second, third = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
    sc = np.concatenate([first & 0x3F, (third & 0x0F) | ((first >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([second & 0x3F, (third >> 4) | ((second >> 2) & 0x30)], axis=-1)
    return sc, mn


def _bit_planes(packed: np.ndarray, bits: int) -> np.ndarray:
    """(..., B) bytes holding 8 // bits codes each, the j-th code of byte i at bits j*bits -> (..., 8 // bits, B):
    the K-quants' order (a run of bytes gives its lowest codes, then the next ones)."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(-1, 1)
    return (packed[..., None, :] >> shifts) & ((1 << bits) - 1)


def _decode_q2_k(blocks: np.ndarray, rows: int, cols: int) -> BlockWeights:
    """16 bytes of 4-bit scale and min pairs, 64 bytes of 2-bit codes, d, dmin."""
    scales = blocks[..., :16]
    codes = _bit_planes(blocks[..., 16:80].reshape(rows, cols // 256, 2, 32), 2)  # (N, K/256, 2, 4, 32)
    d, dmin = _half(blocks[..., 80:82]), _half(blocks[..., 82:84])
    return _weights(codes.reshape(rows, cols), (scales & 0x0F).reshape(rows, -1).astype(np.int8),
                    (scales >> 4).reshape(rows, -1).astype(np.int8), d.reshape(rows, -1), (-dmin).reshape(rows, -1),
                    16, 256, "crumbs")


def _decode_q3_k(blocks: np.ndarray, rows: int, cols: int) -> BlockWeights:
    """32 bytes of high bits (bit j of byte i: code 32 j + i), 64 bytes of 2-bit codes, 12 bytes of 6-bit
    scales (stored + 32), d. The file's value is low - 4 * (1 - high)."""
    high = _bit_planes(blocks[..., :32], 1).reshape(rows, cols // 256, 256)  # (N, K/256, 8 x 32)
    low = _bit_planes(blocks[..., 32:96].reshape(rows, cols // 256, 2, 32), 2).reshape(rows, cols // 256, 256)
    packed = blocks[..., 96:108]
    low_scales = _bit_planes(packed[..., :8], 4).reshape(rows, cols // 256, 16)  # low nibbles of 0-7, then high
    high_scales = _bit_planes(packed[..., 8:12], 2).reshape(rows, cols // 256, 16)
    sc = ((low_scales | (high_scales << 4)).astype(np.int16) - 32).astype(np.int8).reshape(rows, -1)
    d = _half(blocks[..., 108:110])
    return _weights((low | (high << 2)).reshape(rows, cols), sc, sc, d, d * np.float16(-4), 16, 256, "nibbles")


def _decode_q4_k_q5_k(blocks: np.ndarray, rows: int, cols: int) -> BlockWeights:
    """d, dmin, 12 bytes of 6-bit scales and mins, (Q5_K: 32 bytes of fifth bits,) 128 bytes of low nibbles."""
    d, dmin = _half(blocks[..., 0:2]), _half(blocks[..., 2:4])  # (N, K/256)
    sc, mn = _six_bit_scales(blocks[..., 4:16])  # (N, K/256, 8)
    fifth = blocks.shape[-1] == 176
    nibbles = blocks[..., 48:] if fifth else blocks[..., 16:]
    codes = _nibbles_low_then_high(nibbles.reshape(rows, cols // 256, 4, 32))  # 64 codes per 32 bytes
    if fifth:  # bit j of byte i: the fifth bit of code 32 j + i
        codes = codes.reshape(rows, cols // 256, 256) | (_bit_planes(blocks[..., 16:48], 1).reshape(rows, cols // 256, 256) << 4)
    return _weights(codes.reshape(rows, cols), sc.reshape(rows, -1).astype(np.int8), mn.reshape(rows, -1).astype(np.int8),
                    d.reshape(rows, -1), (-dmin).reshape(rows, -1), 32, 256, "sixbits" if fifth else "nibbles")


def _decode_q6_k(blocks: np.ndarray, rows: int, cols: int) -> BlockWeights:
    """128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d."""
    low = blocks[..., :128].reshape(rows, cols // 256, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    low = (low & 0x0F).reshape(rows, cols // 256, 8, 32)
    high = blocks[..., 128:192].reshape(rows, cols // 256, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    high = (high & 0x03).reshape(rows, cols // 256, 8, 32)
    sc = blocks[..., 192:208].view(np.int8).reshape(rows, -1)
    d = _half(blocks[..., 208:210])
    codes = (low | (high << 4)).reshape(rows, cols)
    return _weights(codes, sc, sc, d, d * np.float16(-32), 16, 256, "sixbits")


def _decode_iq4_xs(blocks: np.ndarray, rows: int, cols: int) -> BlockWeights:
    """d, 2 bytes of scales' high bit pairs, 4 bytes of their low nibbles, 128 bytes of 4-bit indices (each
    group of 32: 16 bytes, low nibbles then high)."""
    d = _half(blocks[..., 0:2])
    high = _bit_planes(blocks[..., 2:4], 2)  # (N, K/256, 4, 2): scale 4 b + j's top bits: byte b >> 2 j
    high = high.transpose(0, 1, 3, 2).reshape(rows, cols // 256, 8)
    low = _bit_planes(blocks[..., 4:8], 4).transpose(0, 1, 3, 2).reshape(rows, cols // 256, 8)  # byte i: 2i, 2i+1
    sc = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(rows, -1)
    codes = _nibbles_low_then_high(blocks[..., 8:].reshape(rows, cols // 256, 8, 16))
    zeros = np.zeros_like(sc)
    return _weights(codes.reshape(rows, cols), sc, zeros, d.reshape(rows, -1), np.zeros_like(d).reshape(rows, -1),
                    32, 256, "iq4")


def _weights(codes, sc, mn, d, dmin, group: int, super_group: int, layout: str) -> BlockWeights:
    def tensor(array, dtype):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))

    return BlockWeights(tensor(codes, np.int8 if layout == "signed" else np.uint8), tensor(sc, np.int8),
                        tensor(mn, np.int8), tensor(d, np.float16), tensor(dmin, np.float16), group, super_group,
                        layout)
