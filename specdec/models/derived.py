"""Models derived from a loaded native model, sharing its weights where they can: a copy in another weight
format (a quantized self-draft), a copy running a subset of the layers (layer skip), a copy whose LM head
computes only the first token ids (a cheaper draft head), and the on-disk cache a quantized copy is kept in."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Callable, Sequence

from torch import nn

from specdec.models.cuda_graphs import CudaGraphs
from specdec.models.llama import LlamaForCausalLM
from specdec.models.quantized.packed_cache import (
    discard_packed,
    is_cached_format,
    load_packed,
    packed_cache_path,
    save_packed,
)
from specdec.models.quantized.packed_linear import PackedEmbedding, PackedLinear, head_weight_format
from specdec.models.quantized.torch_quant_linear import TorchQuantLinear


def quantized_copy(model: LlamaForCausalLM, weights: str, cached: dict[str, nn.Module] | None = None
                   ) -> LlamaForCausalLM:
    """The same model with its matrices in another format (e.g. an int8 self-draft).

    Norms, embeddings and rope tables are shared with this model; only the quantized matrices are
    new memory. Packed models (the CPU kernel) get packed copies in any of its formats; `cached`
    (packed layer name -> PackedLinear in that format, from models/quantized/packed_cache.py) supplies them
    instead of quantizing. Stock torch layers (a GPU, no kernel here, bfloat16) get int8 or int4[:G]
    copies on torch's own low-bit operators (models/quantized/torch_quant_linear.py), with an int8 LM head
    for int4, as the packed form keeps a 7-bit one."""
    packed = isinstance(model.lm_head, PackedLinear)

    def clone(module: nn.Module, name: str) -> nn.Module:
        if isinstance(module, PackedEmbedding):  # an embedding table of its own: shared, as untied ones are
            return module
        if isinstance(module, PackedLinear):
            if cached is not None:
                return cached[name]
            return module.quantized_copy(head_weight_format(weights) if module is model.lm_head else weights)
        if type(module) is nn.Linear and not packed:
            return TorchQuantLinear(module, "int8" if module is model.lm_head else weights)
        if type(module) is nn.Embedding:  # shared (tied or not): only matrices are quantized
            return module
        twin = copy.copy(module)  # shares parameters and buffers; gets its own child table
        twin._modules = {child_name: clone(child, f"{name}.{child_name}" if name else child_name)
                         for child_name, child in module._modules.items()
                         if not (isinstance(child, PackedEmbedding) and child.head[0] is model.lm_head)}
        return twin

    twin = clone(model, "")
    if packed and model.config.tie_word_embeddings:
        twin.model.embed_tokens = PackedEmbedding(twin.lm_head)
    twin.graphs = None if model.graphs is None else CudaGraphs(twin)
    return twin


def layer_subset_copy(model: LlamaForCausalLM, layers: Sequence[int]) -> LlamaForCausalLM:
    """The same model running only `layers` (in order), sharing every weight: a layer-skip self-draft.
    Its KV cache has one layer per kept layer."""
    if not layers or sorted(set(layers)) != list(layers) or layers[-1] >= model.config.num_layers or layers[0] < 0:
        raise ValueError(f"layers must be increasing indices in [0, {model.config.num_layers})")
    twin = copy.copy(model)
    twin._modules = dict(model._modules)
    stack = copy.copy(model.model)
    stack._modules = {**model.model._modules, "layers": nn.ModuleList(model.model.layers[i] for i in layers)}
    twin._modules["model"] = stack
    twin.config = dataclasses.replace(model.config, num_layers=len(layers))
    twin.graphs = None if model.graphs is None else CudaGraphs(twin)
    return twin


def head_prefix_copy(model: LlamaForCausalLM, count: int) -> LlamaForCausalLM:
    """The same model whose LM head computes only token ids [0, count): a cheaper draft (a 1.5B's
    151k-row head is ~40% of an int4 0.5B draft's bytes). Byte-level BPE vocabularies number tokens
    in merge order, so the first ids are the common ones (the first 32768 cover ~94% of Python
    source tokens and ~92% of Spec-Bench prose for Qwen2.5). Shares every weight."""
    twin = copy.copy(model)
    twin._modules = dict(model._modules)  # the model stack (tied embeddings included) stays shared
    if hasattr(model.lm_head, "first_outputs"):
        twin._modules["lm_head"] = model.lm_head.first_outputs(count)
    else:
        if not 0 < count <= model.lm_head.out_features:
            raise ValueError(f"the head has {model.lm_head.out_features} outputs, not {count}")
        head = nn.Linear(model.config.hidden_size, count, bias=False, device="meta")  # no weight allocated
        head.weight = nn.Parameter(model.lm_head.weight.detach()[:count], requires_grad=False)  # a view
        twin._modules["lm_head"] = head
    twin.graphs = None if model.graphs is None else CudaGraphs(twin)
    return twin


def cached_quantized_copy(model: LlamaForCausalLM, model_dir: Path, weights: str,
                          source_layers: Callable[[], dict] | None = None) -> LlamaForCausalLM:
    """`quantized_copy` of a packed model through the packed-weight cache a `--weights FORMAT` load of
    `model_dir` reads and writes: the cached layers when they fit, else `source_layers()` (e.g. a GGUF file's
    own blocks) or a fresh quantization, saved for the next time. ValueError for a format the layers refuse.
    Float formats (a bf16 copy) are a cast, not cached."""
    if not is_cached_format(weights):
        return quantized_copy(model, weights)
    cache_path = packed_cache_path(model_dir, weights)
    cached = load_packed(cache_path)
    if cached is None and source_layers is not None:
        cached = source_layers()
    try:
        twin = quantized_copy(model, weights, cached=cached)
    except KeyError as error:  # a cache of another model layout
        discard_packed(cache_path, f"no layer {error}")
        twin, cached = quantized_copy(model, weights), None
    if cached is None:
        save_packed(twin, cache_path)
    return twin
