"""The native runtime's model built from a converted directory: in full precision from its checkpoint, in a
low-bit format from the packed-weight cache, or on the quantized blocks of the GGUF file it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from specdec.errors import CorruptModelError, InvalidParameterError, UnsupportedModelError
from specdec.models.config import ModelConfig
from specdec.models.fused_checkpoints import split_fused_projections
from specdec.models.llama import EMBEDDING_TABLE, LlamaForCausalLM
from specdec.models.quantized.gguf_matrices import GgufMatrices
from specdec.models.quantized.packed_cache import (
    discard_packed,
    is_cached_format,
    load_packed,
    packed_cache_path,
    write_packed,
)
from specdec.models.quantized.packed_linear import PackedLinear
from specdec.models.sources.checkpoint import ensure_float32_weights, is_linear_weight, read_checkpoint
from specdec.models.sources.gguf_source import gguf_source


def load_native(model_dir: Path, hf_config: dict, device: str, dtype: torch.dtype, keep_float32: bool = True):
    """The full-precision model; `keep_float32` writes a GGUF-sourced directory's float32 safetensors for
    the next load (else its tensors are dequantized in memory, for a caller that packs and caches them)."""
    config = ModelConfig.from_hf_dict(hf_config)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = split_fused_projections(read_checkpoint(ensure_float32_weights(model_dir) if keep_float32 else model_dir),
                                    config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    result = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in result.missing_keys if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise CorruptModelError(
            f"{model_dir}: weights do not match a {config.model_type} model "
            f"(missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})"
        )
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.init_rope(device)
    return model.eval()


def load_native_packed(model_dir: Path, hf_config: dict, weights: str, adapter_key: str | None = None):
    """A CPU model in a low-bit format from its cached packing plus the checkpoint's other tensors (norms,
    untied embeddings), or None where there is no cache (or it does not fit the checkpoint: then it is
    discarded). adapter_key: the packing of the weights merged with that LoRA adapter."""
    path = packed_cache_path(model_dir, weights, adapter_key)
    layers = load_packed(path)
    if layers is None:
        return None
    try:
        return native_from_packed_layers(model_dir, hf_config, weights, layers)
    except ValueError as error:
        discard_packed(path, error)
        return None


def native_from_packed_layers(model_dir: Path, hf_config: dict, weights: str, layers: dict):
    """A CPU model with `layers` (packed layer name -> PackedLinear) as its matrices and the checkpoint's
    other tensors (norms, untied embeddings unless `layers` has them); ValueError if they do not fit."""
    config = ModelConfig.from_hf_dict(hf_config)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    try:
        model.pack_weights(weights, cached=layers)
    except KeyError as error:
        raise ValueError(f"no layer {error}") from None
    # tied embeddings are read from the packed LM head, a GGUF file's from their own packed table
    packed_embeddings = config.tie_word_embeddings or EMBEDDING_TABLE in layers
    skipped = {"model.embed_tokens.weight"} if packed_embeddings else set()
    state = {k: v.float() for k, v in read_checkpoint(
        model_dir, lambda name: not is_linear_weight(name) and name not in skipped).items()}
    result = model.load_state_dict(state, strict=False, assign=True)  # norms, untied embeddings
    packed_buffers = {f"{name}.{buffer}" for name in layers for buffer in ("packed", "scales", "bias", "super_scales")}
    missing = [key for key in result.missing_keys if key not in packed_buffers]
    used = {name for name, module in model.named_modules() if isinstance(module, PackedLinear)}
    if missing or result.unexpected_keys or set(layers) - used:
        raise ValueError(f"missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}, "
                         f"layers the model has no place for: {sorted(set(layers) - used)[:3]}")
    model.init_rope("cpu")
    return model.eval()


def load_native_gguf(name: str, model_dir: Path, hf_config: dict):
    """A CPU model on the quantized blocks of the GGUF file `model_dir` was converted from
    (models/quantized/gguf_matrices.py). The layers are packed one at a time straight into the packed-weight
    cache and the model is then read from it as every later load reads it: a first load holds one layer's
    packing beside the file's mapped pages, never a whole second copy of the model. Where the cache cannot
    be written, the layers are kept in memory instead."""
    source = gguf_source(model_dir)
    if source is None:
        raise InvalidParameterError(f"gguf weights: {name} was not loaded from a GGUF file "
                                    "(use a zoo model or a .gguf path, or int4)")
    path = packed_cache_path(model_dir, "gguf")
    try:
        matrices = GgufMatrices(source, ModelConfig.from_hf_dict(hf_config))
        layers = packed_through_cache(matrices.layers(), path, matrices.most_layers()) or dict(matrices.layers())
        try:
            return native_from_packed_layers(model_dir, hf_config, "gguf", layers)
        except ValueError:
            path.unlink(missing_ok=True)  # a packing that does not make this model is no cache
            raise
    except ValueError as error:
        raise UnsupportedModelError(f"gguf weights: {source.name}: {error}; use int4 or float32 weights "
                                    "for this file") from None


def packed_through_cache(layers: Iterator[tuple[str, PackedLinear]], path: Path, most_layers: int) -> dict | None:
    """Write `layers` (name, layer; at most `most_layers` of them), as they come, to the packed cache at `path`
    and read them back from it (mapped from the file, as a warm load reads them); None where the cache cannot
    be written."""
    return load_packed(path) if write_packed(layers, path, most_layers) else None


def gguf_embedding_table(model_dir: Path, hf_config: dict, weights: str):
    """For a model packed into a cached (quantized) format from a GGUF file: its untied token embeddings as
    the file's own blocks, the very values the float32 table holds, at a fraction of the bytes (cached with
    the packed layers). None where the embeddings are tied (read from the LM head) or there is no GGUF."""
    source = gguf_source(model_dir)
    if source is None or hf_config.get("tie_word_embeddings", False) or not is_cached_format(weights):
        return None
    try:
        matrices = GgufMatrices(source)
        return None if matrices.tied else matrices.embedding_table()
    except ValueError:
        return None  # a table the kernels cannot read: kept in float32
