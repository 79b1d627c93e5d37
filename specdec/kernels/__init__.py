"""CPU kernels compiled on first use, with a clean fallback.

The packed small-row matmul (packed_matmul.cpp) is built with the system C++
compiler into $SPECDEC_HOME/kernels the first time it is needed (about a
second), then loaded through ctypes: no torch headers, no build step at install.
Where there is no compiler, no AVX2/FMA, or SPECDEC_NO_KERNELS=1, `packed_kernel()`
returns None and models keep stock torch linear layers.
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

SOURCE = Path(__file__).with_name("packed_matmul.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
PANEL = 16  # output columns per packed panel (two AVX2 registers)


def cpu_has_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return " avx2" in flags and " fma" in flags


@functools.cache
def packed_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library, or None where it cannot be used here."""
    if os.environ.get("SPECDEC_NO_KERNELS") or not cpu_has_avx2_fma():
        return None
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    library = specdec_home() / "kernels" / f"packed_matmul-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.partial")
        result = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            print(f"specdec: warning: could not build the CPU kernel, using torch matmul ({result.stderr.strip()[:200]})",
                  file=sys.stderr)
            return None
        partial.rename(library)
    lib = ctypes.CDLL(str(library))
    lib.packed_matmul_f32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.packed_matmul_f32.restype = None
    lib.packed_matmul_q8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.packed_matmul_q8.restype = None
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


SMALL_ROWS = 16  # up to here the kernel; above, torch's GEMM (prefill is compute-bound, MKL is faster there)


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ packed (P, K, 16) -> (T, out_features).

    Decoding and verification (T <= 16) take the kernel, whose rows round the
    same at any T; prefill takes a batched GEMM over the panels.
    """
    rows, cols = x.shape
    if rows > SMALL_ROWS:
        y = torch.matmul(x, packed)  # (P, T, 16)
        return y.transpose(0, 1).reshape(rows, -1)[:, :out_features]
    lib = packed_kernel()
    y = torch.empty(rows, out_features, dtype=torch.float32)
    lib.packed_matmul_f32(x.data_ptr(), packed.data_ptr(), y.data_ptr(), rows, cols, out_features,
                          torch.get_num_threads())
    return y


def packed_matmul_int8(x: torch.Tensor, quantized: torch.Tensor, scales: torch.Tensor,
                       out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ int8 panels (P, K, 16) with per-column scales -> (T, out_features).

    Like `packed_matmul`: up to 16 rows the kernel (batch-invariant), more rows (prefill, a draft model
    catching up) a GEMM over panels dequantized for this call (compute-bound there, the copy is cheap)."""
    rows, cols = x.shape
    if rows > SMALL_ROWS:  # float32 panels for this call, then the float32 GEMM path
        return packed_matmul(x, quantized.to(torch.float32).mul_(scales.view(-1, 1, PANEL)), out_features)
    y = torch.empty(rows, out_features, dtype=torch.float32)
    packed_kernel().packed_matmul_q8(x.data_ptr(), quantized.data_ptr(), scales.data_ptr(), y.data_ptr(), rows,
                                     cols, out_features, torch.get_num_threads())
    return y
