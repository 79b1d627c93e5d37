"""Which arithmetic a head trains in: `bfloat16` runs the matrix products of each step's forward and backward
in bf16 (torch.autocast) while the weights, the optimizer's state and the losses stay float32, as mixed
precision does on a GPU; `float32` runs everything in float32.

bf16 pays where the hardware multiplies bf16 natively (AMX-BF16 tiles or AVX512-BF16 dot products on a
CPU, a CUDA GPU with bf16 support): oneDNN's bf16 matrix products run a few times float32's there. Elsewhere
torch widens bf16 in software and it would only cost accuracy, so `auto` picks it only on such hardware.
A head trained either way drafts exactly: verification keeps the target's output whatever the head predicts.
"""

from __future__ import annotations

import contextlib

import torch

from specdec.errors import InvalidParameterError
from specdec.kernels import build

PRECISIONS = ("auto", "float32", "bfloat16")
# /proc/cpuinfo flags of native bf16 arithmetic, and the names users know them by, fastest first
FAST_BF16_CPU_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


def native_bf16(device: str) -> str | None:
    """The name of the native bf16 arithmetic `device` ('cpu' or 'cuda...') has, or None."""
    if device.startswith("cuda"):
        return "CUDA bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    flags = build.cpu_flags()  # looked up on the module: tests stand in for the CPU there
    return next((name for flag, name in FAST_BF16_CPU_FLAGS.items() if flag in flags), None)


def resolve_precision(requested: str, device: str) -> tuple[str, str]:
    """'auto', 'float32' or 'bfloat16' for training on `device` -> (the precision, a line saying why)."""
    if requested not in PRECISIONS:
        raise InvalidParameterError(f"--precision {requested!r}: expected one of {', '.join(PRECISIONS)}")
    native = native_bf16(device)
    if requested == "auto":
        requested = "bfloat16" if native else "float32"
        why = f"this {device} has {native}" if native else f"this {device} has no native bf16 arithmetic"
    else:
        why = "as asked" + ("" if requested == "float32" or native else
                            f"; this {device} has no native bf16 arithmetic, so it will be slower than float32")
    return requested, why


def training_arithmetic(precision: str, device_type: str):
    """The context a training step's forward runs in (its backward follows the same casts)."""
    if precision == "bfloat16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
