"""LoRA adapters (PEFT's format: adapter_config.json + adapter_model.safetensors) merged into a native model's
float weights at load, before any packing: the merged model then runs, quantizes and caches as any other, and a
draft distilled toward its target (`specdec train distill`) costs nothing extra a token."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from torch import nn

from specdec.errors import CorruptModelError, InvalidParameterError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_adapter_dir(path: str | Path) -> Path:
    """The adapter directory, or InvalidParameterError saying what is missing or not a LoRA adapter."""
    directory = Path(path).expanduser()
    missing = [name for name in ADAPTER_FILES if not (directory / name).is_file()]
    if missing:
        raise InvalidParameterError(f"adapter {directory}: not a LoRA adapter directory (no {', '.join(missing)})")
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
    except (OSError, ValueError) as error:
        raise CorruptModelError(f"adapter {directory}: adapter_config.json: {error}") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise InvalidParameterError(f"adapter {directory}: peft_type {config.get('peft_type') if isinstance(config, dict) else None!r}, "
                                    "only LoRA adapters merge into a model")
    return directory


def adapter_fingerprint(path: str | Path) -> str:
    """A short hash of the adapter's files: packed caches of a merged model are keyed by it."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        digest.update((Path(path) / name).read_bytes())
    return digest.hexdigest()[:16]


def merge_lora(model: nn.Module, path: str | Path) -> nn.Module:
    """`model` (native, float weights, not packed yet) with the LoRA adapter at `path` added into its linear
    layers. PEFT does the merge, so its scalings (alpha / r, rsLoRA, DoRA) apply as they were trained."""
    from peft import PeftModel

    directory = check_adapter_dir(path)
    try:
        return PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
    except (ValueError, KeyError, RuntimeError) as error:  # modules it names are absent, shapes differ
        raise InvalidParameterError(f"adapter {directory} does not fit this model: {error}") from None
