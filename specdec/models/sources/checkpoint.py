"""A converted model directory's files as tensors: its config, its safetensors (or, for a directory converted
from a GGUF file without float32 safetensors, that file's tensors dequantized in memory), and which of its
tensors are the linear layers the CPU kernel packs."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open

from specdec.errors import CorruptModelError
from specdec.models.sources.gguf_convert import dequantized_state_dict, read_gguf, write_float32_weights
from specdec.models.sources.gguf_source import gguf_only_source


def read_config(model_dir: Path) -> dict:
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CorruptModelError(f"{model_dir}/config.json: unreadable ({exc})") from None


def safetensors_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        source = json.loads((model_dir / "specdec_source.json").read_text())["gguf"] \
            if (model_dir / "specdec_source.json").exists() else None
        raise CorruptModelError(f"{model_dir}: no *.safetensors weights"
                                + (f" and the GGUF file it came from ({source}) is gone" if source else ""))
    return files


def ensure_float32_weights(model_dir: Path) -> Path:
    """`model_dir`, with float32 safetensors written from its GGUF file first if it has none yet
    (what transformers and float32 loads read; runs on the GGUF's blocks never need it)."""
    source = gguf_only_source(model_dir)
    if source is not None:
        logging.getLogger("specdec").warning(
            f"specdec: writing {source.name} as float32 safetensors (once, for float32 or transformers loads)")
        write_float32_weights(source, model_dir)
    return model_dir


def read_checkpoint(model_dir: Path, wanted: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (those whose name `wanted` accepts), as stored; for a GGUF-sourced directory
    without float32 safetensors, dequantized from the GGUF in memory."""
    source = gguf_only_source(model_dir)
    if source is not None:
        return dequantized_state_dict(read_gguf(source), wanted)
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(model_dir):
        try:
            with safe_open(str(file), framework="pt") as handle:
                state.update({name: handle.get_tensor(name) for name in handle.keys() if wanted is None or wanted(name)})
        except (SafetensorError, OSError) as exc:
            raise CorruptModelError(f"{file}: corrupt safetensors file ({exc})") from None
    return state


LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj",
                 "gate_up_proj")  # the last two: fused, as Phi-3 stores them


def is_linear_weight(name: str) -> bool:
    """Whether a checkpoint tensor belongs to a linear layer the CPU kernel packs (weight or bias): the
    projections, the LM head, a mixture's router (`mlp.gate`; gpt-oss's checkpoints: `mlp.router`) and experts."""
    parts = name.split(".")
    return (parts[0] == "lm_head" or (len(parts) >= 2 and parts[-2] in LINEAR_LAYERS) or "experts" in parts
            or parts[-3:-1] in (["mlp", "gate"], ["mlp", "router"]))


STORED_FORMATS = {"BF16": "bf16", "F16": "fp16"}  # safetensors dtype names -> our weight formats


def stored_float_format(model_dir: Path) -> str:
    """bf16 or fp16 where every linear layer's weight in the checkpoint is stored in that type, else float32
    (read from the safetensors headers: no tensor is loaded)."""
    dtypes = set()
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                dtypes.update(handle.get_slice(name).get_dtype() for name in handle.keys()
                              if is_linear_weight(name) and name.endswith(".weight"))
        except (SafetensorError, OSError):
            return "float32"  # the load proper reports what is wrong with the file
    return STORED_FORMATS.get(dtypes.pop(), "float32") if len(dtypes) == 1 else "float32"
