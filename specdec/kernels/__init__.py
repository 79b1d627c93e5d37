"""CPU kernels compiled on first use, with a clean fallback.

The packed small-row matmuls (packed_matmul.cpp: float32 and int8 panels;
integer_matmul.cpp: grouped 4-bit and 7-bit weights with integer dot products; gguf_matmul.cpp: a GGUF
file's own blocks, the same way), the steps between them (attention.cpp, layer_ops.cpp) and a whole span
of decoder layers in one call (decoder_layers.cpp) are built with
the system C++ compiler into $SPECDEC_HOME/kernels the first time they are needed
(a few seconds), then loaded through ctypes: no torch headers, no build step at
install. Where there is no compiler, no AVX2/FMA/F16C, or SPECDEC_NO_KERNELS=1,
`packed_kernel()` returns None and models keep stock torch linear layers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from specdec.paths import specdec_home

SOURCES = [Path(__file__).with_name(name) for name in ("packed_matmul.cpp", "integer_matmul.cpp", "gguf_matmul.cpp",
                                                         "attention.cpp", "layer_ops.cpp",
                                                         "decoder_layers.cpp")]
# included by the sources: part of the build's key
HEADERS = [Path(__file__).with_name(name) for name in ("vector_math.h", "integer_blocks.h")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# Added where the CPU has AVX512-VNNI (Zen 4, Ice Lake and later): the integer kernels' byte dot products
# take one vpdpbusd (integer_blocks.h), and the float32 kernel streams a panel once for up to 16 rows (32
# registers; 512-bit accumulators from 8 rows, packed_matmul.cpp). 256-bit vectors stay preferred elsewhere:
# the other kernels are written for them.
AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mprefer-vector-width=256"]
AVX512_CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # /proc/cpuinfo's names for them
PANEL = 16  # output columns per packed panel (two AVX2 registers)


def cpu_flags() -> set[str]:
    """The x86 feature flags /proc/cpuinfo lists (empty elsewhere)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return set()
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


def cpu_has_avx2_fma_f16c() -> bool:
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def cpu_has_avx512_vnni() -> bool:
    """AVX-512 with VNNI and 256-bit forms (VL); SPECDEC_NO_AVX512=1 builds the AVX2 kernels anyway."""
    return not os.environ.get("SPECDEC_NO_AVX512") and AVX512_CPU_FLAGS <= cpu_flags()



@functools.cache
def packed_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library, or None where it cannot be used here."""
    if os.environ.get("SPECDEC_NO_KERNELS") or not cpu_has_avx2_fma_f16c():
        return None
    builds = ([FLAGS + AVX512_FLAGS] if cpu_has_avx512_vnni() else []) + [FLAGS]
    for flags in builds:  # a compiler too old for the AVX-512 flags leaves the AVX2 build
        try:
            return build_kernel(tuple(flags))
        except KernelBuildError as error:
            failure = error
        except FileNotFoundError:  # no compiler
            return None
    print(f"specdec: warning: could not build the CPU kernel, using torch matmul ({failure})", file=sys.stderr)
    return None


class KernelBuildError(RuntimeError):
    """The compiler refused the kernels with these flags (its first lines of complaint)."""


@functools.cache
def build_kernel(flags: tuple[str, ...]) -> ctypes.CDLL:
    """The kernel library built with these flags (once per flags and sources). Raises FileNotFoundError
    without a C++ compiler, KernelBuildError when the build fails (not cached: tried again if asked)."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++ or c++) on the PATH")
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    key = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    library = specdec_home() / "kernels" / f"packed_matmul-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.partial")
        result = subprocess.run([compiler, *flags, "-o", str(partial), *map(str, SOURCES)], capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise KernelBuildError(result.stderr.strip()[:200])
        partial.rename(library)
    lib = ctypes.CDLL(str(library))
    lib.packed_matmul_f32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.packed_matmul_f32.restype = None
    lib.packed_matmul_q8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.packed_matmul_q8.restype = None
    lib.attention_rows.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 7
                                   + [ctypes.c_float, ctypes.c_int])
    lib.attention_rows.restype = None
    lib.add_rms_norm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_float]
    lib.add_rms_norm.restype = None
    lib.rope_qkv_to_cache.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6
    lib.rope_qkv_to_cache.restype = None
    lib.silu_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
    lib.silu_mul.restype = None
    for kernel in (lib.int4_matmul, lib.int7_matmul):
        kernel.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_int]
        kernel.restype = None
    lib.gguf_matmul.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int32]
                                + [ctypes.c_int64] * 2 + [ctypes.c_int])
    lib.gguf_matmul.restype = None
    lib.decoder_layers.argtypes = ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2
                                   + [ctypes.c_void_p] + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_int])
    lib.decoder_layers.restype = None
    return lib


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (ceil(N/16), K, 16) float32 panels: panel p holds output rows 16p..16p+15, k-major."""
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
    """Rows of the original (N, K) matrix, e.g. embeddings tied to a packed LM head: (..., K)."""
    values = packed[rows // PANEL, :, rows % PANEL]
    return values if scales is None else values.float() * scales[rows].unsqueeze(-1)


# Up to here a forward's rows attend row by row (llama.ROW_BY_ROW_MAX) and its layers run in one C call
# (models/layer_plan.py): decoding and verification, trees of 24+ nodes included. Int8 panels take their kernel
# up to here too; above, they are dequantized for the call (prefill is compute-bound, widening int8 is not free).
SMALL_ROWS = 64


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ packed (P, K, 16) -> (T, out_features), any T.

    The kernel's rows round the same at any T (plain and speculative decoding agree bit for bit), and it
    serves prefill too: the panels are the layout a GEMM packs its right-hand side into, and it measured
    faster at prefill sizes than torch's batched matmul over the panels or its GEMM over an unpacked matrix.
    """
    rows, cols = x.shape
    lib = packed_kernel()
    y = torch.empty(rows, out_features, dtype=torch.float32)
    lib.packed_matmul_f32(x.data_ptr(), packed.data_ptr(), y.data_ptr(), rows, cols, out_features,
                          torch.get_num_threads())
    return y


def packed_matmul_int8(x: torch.Tensor, quantized: torch.Tensor, scales: torch.Tensor,
                       out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ int8 panels (P, K, 16) with per-column scales -> (T, out_features).

    Up to SMALL_ROWS rows the int8 kernel (batch-invariant), more rows (prefill, a draft model catching up)
    float32 panels dequantized for this call (compute-bound there, the copy is cheap)."""
    rows, cols = x.shape
    if rows > SMALL_ROWS:  # float32 panels for this call, then the float32 kernel
        return packed_matmul(x, quantized.to(torch.float32).mul_(scales.view(-1, 1, PANEL)), out_features)
    y = torch.empty(rows, out_features, dtype=torch.float32)
    packed_kernel().packed_matmul_q8(x.data_ptr(), quantized.data_ptr(), scales.data_ptr(), y.data_ptr(), rows,
                                     cols, out_features, torch.get_num_threads())
    return y


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


def integer_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ 4-bit or 7-bit grouped codes -> (T, out_features), any T
    (integer_matmul.cpp: activations quantized to int8 per block of 32, integer dot products)."""
    rows, cols = x.shape
    group_size = cols // scales.shape[1]
    y = torch.empty(rows, out_features, dtype=torch.float32)
    kernel = packed_kernel().int4_matmul if grouped_bits(packed, cols) == 4 else packed_kernel().int7_matmul
    kernel(x.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), rows, cols, out_features, group_size,
           torch.get_num_threads())
    return y


GGUF_LAYOUTS = {"nibbles": 0, "sixbits": 1, "signed": 2}  # gguf_matmul.cpp's code layouts


def gguf_matmul(x: torch.Tensor, codes: torch.Tensor, group_codes: torch.Tensor, super_scales: torch.Tensor,
                out_features: int, layout: str, group: int, super_group: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ a matrix in llama.cpp's block form (models/gguf_blocks.py) -> (T, N),
    any T (gguf_matmul.cpp: activations quantized to int8 per block of 32, integer dot products)."""
    rows, cols = x.shape
    y = torch.empty(rows, out_features, dtype=torch.float32)
    packed_kernel().gguf_matmul(x.data_ptr(), codes.data_ptr(), group_codes.data_ptr(), super_scales.data_ptr(),
                                y.data_ptr(), rows, cols, out_features, GGUF_LAYOUTS[layout], group, super_group,
                                torch.get_num_threads())
    return y


def attention_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                   prefix: int) -> torch.Tensor:
    """q (1, H, T, D), the cache's keys/values views (1, Hkv, prefix + W, D), visible (T, W) uint8: which of
    the keys after the shared `prefix` each row sees -> (1, T, H * D): each row's attention as its own
    one-token step computes it (attention.cpp)."""
    _, heads, rows, dim = q.shape
    q = q.contiguous()
    out = torch.empty(1, rows, heads * dim, dtype=torch.float32)
    packed_kernel().attention_rows(q.data_ptr(), keys.data_ptr(), values.data_ptr(), visible.data_ptr(),
                                   out.data_ptr(), rows, heads, keys.shape[1], dim, prefix, visible.shape[1],
                                   keys.stride(1), dim ** -0.5, torch.get_num_threads())
    return out


# -- the steps between a layer's matmuls (layer_ops.cpp): float32, contiguous, batch 1 -------------------
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., C) [+ residual (..., C)] -> (the sum, or x itself; RMSNorm of it times weight)."""
    rows, size = x.numel() // x.shape[-1], x.shape[-1]
    total = x if residual is None else torch.empty_like(x)
    normed = torch.empty_like(x)
    packed_kernel().add_rms_norm(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
                                 total.data_ptr(), normed.data_ptr(), rows, size, eps)
    return total, normed


def rope_qkv_to_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, heads: int, kv_heads: int, start: int) -> torch.Tensor:
    """Fused q/k/v rows (1, T, (H + 2 Hkv) D) and rope tables (1, 1, T, D) -> queries (1, H, T, D); the
    rotated keys and the values go to one layer of the cache, key_cache/value_cache (Hkv, S_max, D), at
    slots [start, start + T)."""
    rows, dim = qkv.shape[1], cos.shape[-1]
    q = torch.empty(1, heads, rows, dim, dtype=torch.float32)
    packed_kernel().rope_qkv_to_cache(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(),
                                      key_cache.data_ptr(), value_cache.data_ptr(), rows, heads, kv_heads, dim,
                                      start, key_cache.stride(0))
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Fused gate/up rows (..., 2 I) -> silu(gate) * up (..., I)."""
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=torch.float32)
    packed_kernel().silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * width), width)
    return out
