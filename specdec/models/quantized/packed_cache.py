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
import shutil
import struct
import warnings
from pathlib import Path
from typing import Iterable

import torch
from safetensors import SafetensorError, safe_open

from specdec.kernels import FLOAT_PANEL_DTYPES, INTEGER_BLOCK, INTEGER_COLUMNS, PANEL
from specdec.models.quantized.gguf_linear import GgufLinear
from specdec.models.quantized.packed_linear import PackedLinear
from specdec.models.sources.content_key import gguf_content_key
from specdec.models.sources.gguf_source import gguf_source
from specdec.paths import replace_flushed, specdec_home

# Bump when a packed layout changes (panels, code order, scale layout): old files are then ignored.
LAYOUT_VERSION = 3  # 2: untied embeddings of GGUF-sourced models cached as the file's blocks; 3: Q2_K in 2 bits
_META_KEY = "specdec_packed_layouts"


def is_cached_format(weights: str) -> bool:
    """Whether loads in `weights` go through the packed cache: the quantized formats, not float panels."""
    return weights.partition(":")[0] not in FLOAT_PANEL_DTYPES


def packed_cache_path(model_dir: Path, weights: str, adapter_key: str | None = None) -> Path:
    """Where the `weights`-format packing of the checkpoint in `model_dir` lives (merged with the LoRA adapter
    whose `adapters.adapter_fingerprint` is adapter_key, if any)."""
    # a GGUF-sourced checkpoint is its GGUF file, whether or not its float32 safetensors were written yet
    gguf = gguf_source(model_dir)
    files = ([] if gguf is not None else sorted(model_dir.glob("*.safetensors"))) + [model_dir / "config.json"]
    source = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()]
    if gguf is not None:  # its content, whatever path or name reached it
        source.insert(0, gguf_content_key(gguf))
    parts = [str(model_dir.resolve()), source, weights, LAYOUT_VERSION, PANEL, INTEGER_COLUMNS, INTEGER_BLOCK]
    key = hashlib.sha256(json.dumps(parts + ([adapter_key] if adapter_key else [])).encode()).hexdigest()[:16]
    name = model_dir.parent.name if model_dir.name == "hf" else model_dir.name  # zoo models live in NAME/hf
    merged = f"-lora-{adapter_key}" if adapter_key else ""
    return specdec_home() / "packed" / f"{name}{merged}-{weights.replace(':', '-g')}-{key}.safetensors"


def save_packed(model: torch.nn.Module, path: Path) -> None:
    """Write a packed model's packed layers (buffers and layouts; the rest stays in the checkpoint)."""
    write_packed(((name, module) for name, module in model.named_modules() if isinstance(module, PackedLinear)),
                 path)


def write_packed(layers: Iterable[tuple[str, PackedLinear]], path: Path, most_layers: int = 0) -> bool:
    """Write packed layers (name, layer) to the cache file `path` as they come (PackedCacheWriter; `most_layers`:
    how many there may be, for the header's room); False where the cache cannot be written (read-only home,
    full disk), which only costs the next load its packing time: a warning, and no file."""
    try:
        with PackedCacheWriter(path, most_layers) as writer:
            for name, layer in layers:
                writer.add(name, layer)
    except OSError as error:
        warnings.warn(f"could not cache packed weights at {path}: {error}", RuntimeWarning, stacklevel=3)
        return False
    return True


# torch dtype -> safetensors' name for it
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
                       torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
                       torch.int64: "I64", torch.bool: "BOOL"}


class PackedCacheWriter:
    """Writes packed layers into a packed-cache file one layer at a time, so a caller can pack a model layer
    by layer and free each: a first load then never holds the whole packing (safetensors' save_file needs
    every tensor at once).

    The file is safetensors (8-byte header length, JSON header, the tensors' bytes back to back), which
    safe_open maps. The header comes first but is known last, so the bytes are written after room left for
    it (HEADER_ROOM, or ROOM_PER_LAYER for each of the layers the caller says may come), and the header is padded with spaces to fill them (the format allows that); a header
    that outgrows the room is written to a new file followed by a copy of the bytes. Written under a
    temporary name and renamed, so a crash leaves no file that looks complete; on an error nothing is left."""

    HEADER_ROOM = 1 << 20  # at least; a layer's entries take under ROOM_PER_LAYER bytes
    ROOM_PER_LAYER = 1 << 10
    # Written in pieces this size: a file written in large pieces is cached in large folios, which the kernel
    # maps whole on a fault, so every later load that maps the file would show far more resident memory.
    WRITE_PIECE = 1 << 16

    def __init__(self, path: Path, most_layers: int = 0):
        self.path = Path(path)
        self.room = max(self.HEADER_ROOM, self.ROOM_PER_LAYER * most_layers)  # a mixture has thousands of layers
        self.partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")  # two processes may write at once
        self.entries: dict[str, dict] = {}
        self.layouts: dict[str, dict] = {}
        self.size = 0
        self.handle = None

    def __enter__(self) -> "PackedCacheWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.partial, "wb")
        self.handle.seek(self.room)
        return self

    def add(self, name: str, layer: PackedLinear) -> None:
        self.layouts[name] = layer.layout()
        for buffer, tensor in layer._buffers.items():
            if tensor is None:
                continue
            data = memoryview(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # its bytes, not a copy
            for start in range(0, len(data), self.WRITE_PIECE):
                self.handle.write(data[start:start + self.WRITE_PIECE])
            self.entries[f"{name}.{buffer}"] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                                                "data_offsets": [self.size, self.size + len(data)]}
            self.size += len(data)

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None:
                self._write_header()
            self.handle.close()
            if kind is None:
                replace_flushed(self.partial, self.path)
        finally:
            self.handle.close()
            self.partial.unlink(missing_ok=True)
            self.partial.with_name(self.partial.name + ".moved").unlink(missing_ok=True)

    def _write_header(self) -> None:
        header = json.dumps({**self.entries, "__metadata__": {_META_KEY: json.dumps(self.layouts)}}).encode()
        if 8 + len(header) <= self.room:
            self.handle.seek(0)
            self.handle.write(struct.pack("<Q", self.room - 8) + header.ljust(self.room - 8))
            return
        header += b" " * (-len(header) % 8)  # the format pads its header to 8 bytes
        self.handle.close()
        moved = self.partial.with_name(self.partial.name + ".moved")
        os.replace(self.partial, moved)
        with open(self.partial, "wb") as out, open(moved, "rb") as body:
            out.write(struct.pack("<Q", len(header)) + header)
            body.seek(self.room)
            shutil.copyfileobj(body, out, self.WRITE_PIECE)
        moved.unlink()


def load_packed(path: Path) -> dict[str, PackedLinear] | None:
    """Packed layer name -> PackedLinear, or None when there is no usable file (a damaged one is removed,
    and the caller quantizes again)."""
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
    return GgufLinear if "gguf" in layout else PackedLinear


def discard_packed(path: Path, error: object) -> None:
    """Warn about an unusable packing and delete it, so the next load writes a good one."""
    warnings.warn(f"ignoring damaged packed-weight cache {path}: {error}", RuntimeWarning, stacklevel=3)
    path.unlink(missing_ok=True)
