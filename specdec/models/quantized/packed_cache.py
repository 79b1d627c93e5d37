"""Quantized weights packed once, read back afterwards: a low-bit model loads without re-quantizing.

Quantizing every matrix of the 1.5B model to int4 takes ~35 s on the 2-core CPU, on every load of
`--weights int4` and every `quant:int4` self-draft. The first such load writes the packed buffers to
$SPECDEC_HOME/packed/ (safetensors); later loads read them, and from the checkpoint only what is not
packed (norms, untied embeddings). The file is keyed by the source weights (path, size,
modification time), the format and LAYOUT_VERSION, so a changed checkpoint or kernel layout gets a new
one. The same file serves a `--weights int4` target and an int4 self-draft of a float32 target: both
quantize the same float matrices the same way.

Float panels (float32, bf16, fp16) are not cached: they are as large as the checkpoint (6 GB for the 1.5B in
float32) and packing them is a copy, not a search.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import torch

from specdec.kernels import FLOAT_PANEL_DTYPES, INTEGER_BLOCK, INTEGER_COLUMNS, PANEL
from specdec.models.quantized.packed_linear import PackedLinear
from specdec.paths import replace_flushed, specdec_home

# Bump when a packed layout changes (panels, code order, scale layout): old files are then ignored.
LAYOUT_VERSION = 3  # 2: untied embeddings of GGUF-sourced models cached as the file's blocks; 3: Q2_K in 2 bits
_META_KEY = "specdec_packed_layouts"


def is_cached_format(weights: str) -> bool:
    """Whether loads in `weights` go through the packed cache: the quantized formats, not float panels."""
    return weights.partition(":")[0] not in FLOAT_PANEL_DTYPES


def packed_cache_path(model_dir: Path, weights: str) -> Path:
    """Where the `weights`-format packing of the checkpoint in `model_dir` lives."""
    from specdec.models.sources.gguf_source import gguf_source

    # a GGUF-sourced checkpoint is its GGUF file, whether or not its float32 safetensors were written yet
    gguf = gguf_source(model_dir)
    files = ([gguf] if gguf is not None else sorted(model_dir.glob("*.safetensors"))) + [model_dir / "config.json"]
    source = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()]
    identity = json.dumps([str(model_dir.resolve()), source, weights, LAYOUT_VERSION, PANEL, INTEGER_COLUMNS,
                           INTEGER_BLOCK])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    name = model_dir.parent.name if model_dir.name == "hf" else model_dir.name  # zoo models live in NAME/hf
    return specdec_home() / "packed" / f"{name}-{weights.replace(':', '-g')}-{key}.safetensors"


def save_packed(model: torch.nn.Module, path: Path) -> None:
    """Write a packed model's packed layers (buffers and layouts; the rest stays in the checkpoint).

    Written under a temporary name and renamed, so a crash leaves no file that looks complete. A cache
    that cannot be written (read-only home, full disk) only costs the next load its quantization time."""
    from safetensors.torch import save_file

    layers = {name: module for name, module in model.named_modules() if isinstance(module, PackedLinear)}
    layouts = {name: layer.layout() for name, layer in layers.items()}
    state = {f"{name}.{buffer}": tensor.contiguous() for name, layer in layers.items()
             for buffer, tensor in layer._buffers.items() if tensor is not None}
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # two processes may write at once
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(partial), metadata={_META_KEY: json.dumps(layouts)})
        replace_flushed(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        warnings.warn(f"could not cache packed weights at {path}: {error}", RuntimeWarning, stacklevel=2)


def load_packed(path: Path) -> dict[str, PackedLinear] | None:
    """Packed layer name -> PackedLinear, or None when there is no usable file (a damaged one is removed,
    and the caller quantizes again)."""
    from safetensors import SafetensorError, safe_open

    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as file:
            layouts = json.loads((file.metadata() or {})[_META_KEY])
            state = {name: file.get_tensor(name) for name in file.keys()}
        layers = {name: layer_class(layout).from_buffers(
                      state[f"{name}.packed"], state.get(f"{name}.scales"), state.get(f"{name}.bias"), **layout,
                      **({"super_scales": state[f"{name}.super_scales"]} if "gguf" in layout else {}))
                  for name, layout in layouts.items()}
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as error:
        discard_packed(path, error)
        return None
    return layers


def layer_class(layout: dict) -> type[PackedLinear]:
    from specdec.models.quantized.gguf_linear import GgufLinear

    return GgufLinear if "gguf" in layout else PackedLinear


def discard_packed(path: Path, error: object) -> None:
    """Warn about an unusable packing and delete it, so the next load writes a good one."""
    warnings.warn(f"ignoring damaged packed-weight cache {path}: {error}", RuntimeWarning, stacklevel=3)
    path.unlink(missing_ok=True)
