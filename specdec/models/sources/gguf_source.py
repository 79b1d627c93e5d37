"""Which GGUF file a converted model directory came from: a zoo model's (NAME/NAME.gguf beside NAME/hf) or a
.gguf converted by path (its specdec_source.json). Loaders, the packed-weight cache and fingerprints ask."""

from __future__ import annotations

import json
from pathlib import Path


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a converted directory came from (a zoo model's, or a .gguf given by path), if at hand."""
    record = model_dir / "specdec_source.json"
    if record.exists():
        path = Path(json.loads(record.read_text())["gguf"])
        if path.is_file():
            return path
    manifest = model_dir.parent / "manifest.json"  # zoo models: NAME/hf next to NAME/NAME.gguf
    if manifest.exists():
        path = model_dir.parent / json.loads(manifest.read_text())["gguf"]
        if path.is_file():
            return path
    return None


def gguf_only_source(model_dir: Path) -> Path | None:
    """The GGUF file of a directory converted from one whose float32 safetensors are not written (yet)."""
    source = gguf_source(model_dir)
    return source if source is not None and not any(model_dir.glob("*.safetensors")) else None
