"""Self-drafting: the target itself, made cheaper, drafts for itself. No second checkpoint, the same
tokenizer, and distributions close to the target's.

- `quant:int8` / `quant:int4[:G]`: the target's matrices quantized to int8, or to grouped 4-bit weights
  multiplied with int8-quantized activations (docs/runtime.md); a quarter / an eighth of the memory;
- `layerskip:SPEC`: the target running a subset of its layers, sharing every weight (memory: its KV only).

Both are draft-model drafters (specdec.drafters.draft_model) over a derived model, so drafting,
rollback and the exact acceptance rule are the ones tested for draft models.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.draft_options import DraftOptions, with_head_vocab
from specdec.errors import InvalidParameterError
from specdec.kernels import FLOAT_PANEL_DTYPES
from specdec.models.derived import cached_quantized_copy, layer_subset_copy, quantized_copy
from specdec.models.llama import LlamaForCausalLM
from specdec.models.quantized.packed_linear import PackedLinear, parse_weight_format
from specdec.models.quantized.torch_quant_linear import TORCH_QUANT_FORMATS
from specdec.models.sources.checkpoint import read_config
from specdec.models.sources.loading import LoadedModel
from specdec.models.sources.native_load import load_native_gguf

LAYERSKIP_SPECS = "first:N | every:N | RANGES (e.g. 0-7,28-29)"

# Chosen by `python -m specdec.bench.layer_skip_search` (docs/drafters.md has the search and its figures).
# Without early-exit training no subset pays on these models (all measured below 0.4x with K=3); the
# entry is the least bad, and `--k auto` switches a drafter that does not pay off (K=0).
DEFAULT_LAYER_SUBSETS: dict[str, str] = {"smollm2-135m-instruct": "0-6,23-29"}
FALLBACK_LAYER_SUBSET = "every:2"
QUANT_FLOAT32 = "quant drafter: choose a smaller format (bf16, fp16, int8, int4[:GROUP], int7[:GROUP], gguf)"


def quantized_self_draft(target: LoadedModel, weights: str, options: DraftOptions = DraftOptions(),
                         spec: str | None = None) -> DraftModelDrafter:
    """The target with its linear layers quantized to `weights`, as a draft model (quant:FORMAT; `spec`:
    its name, by default quant:FORMAT)."""
    spec = spec or f"quant:{weights}"
    try:
        kind, _ = parse_weight_format(weights)
    except ValueError as error:
        raise InvalidParameterError(f"quant drafter: {error}") from None
    if kind == "float32":
        raise InvalidParameterError(QUANT_FLOAT32)
    model = target.model
    if not isinstance(model, LlamaForCausalLM):
        raise InvalidParameterError("quant drafter: needs the native backend (--backend native)")
    if not isinstance(model.lm_head, PackedLinear):  # stock torch layers: torch's own low-bit operators
        return torch_quantized_self_draft(target, weights, kind, options, spec)
    if model.lm_head.weight_format not in FLOAT_PANEL_DTYPES:
        raise InvalidParameterError(f"quant drafter: the target already has {model.lm_head.weight_format} weights; "
                                    "a quantized self-draft is made from a float32, bf16 or fp16 target")
    # the blocks of the GGUF the target was converted from, where the cache does not have them yet
    source_layers = (lambda: gguf_block_layers(target)) if kind == "gguf" else None
    try:
        copy = cached_quantized_copy(model, target.path, weights, source_layers)
    except ValueError as error:  # e.g. an int4 group size that does not divide a layer
        raise InvalidParameterError(f"quant drafter: {error}") from None
    return quantized_copy_drafter(target, copy, weights, options, spec)


def quantized_copy_drafter(target: LoadedModel, copy: nn.Module, weights: str, options: DraftOptions,
                           spec: str) -> DraftModelDrafter:
    """The drafter over a quantized copy of the target's model (quant:SPEC)."""
    draft = with_head_vocab(dataclasses.replace(target, name=f"{target.name}-{weights}", model=copy), options.vocab,
                            "quant")
    return DraftModelDrafter(draft, target.model.vocab_size, options.confidence, name=spec,
                             shares_with=target.model, prompt_window=options.context, start_window=options.start,
                             shares_prompt_cache=options.context is None and options.start is None)  # an explicit window is a request


def torch_quantized_self_draft(target: LoadedModel, weights: str, kind: str, options: DraftOptions,
                               spec: str) -> DraftModelDrafter:
    """quant:int8 / quant:int4[:G] for a target on stock torch layers (a GPU, a CPU without the kernel,
    bfloat16/float16 weights): the copy runs on torch's own low-bit operators (models/quantized/torch_quant_linear.py)."""
    if kind not in TORCH_QUANT_FORMATS:
        raise InvalidParameterError(f"quant drafter: {weights} needs the CPU kernel (float32 weights on an x86 CPU "
                                    "with AVX2 and a C++ compiler); on this target choose int8 or int4[:GROUP]")
    try:
        copy = quantized_copy(target.model, weights)
    except (ValueError, NotImplementedError, RuntimeError) as error:  # a group size or shape the operators refuse
        raise InvalidParameterError(f"quant drafter: {weights}: {error}".splitlines()[0]) from None
    return quantized_copy_drafter(target, copy, weights, options, spec)


def gguf_block_layers(target: LoadedModel) -> dict:
    """Packed layer name -> GgufLinear for a float32 target converted from a GGUF file (quant:gguf): the
    file's own blocks, whose values the float32 weights are; loading them once writes the packed-weight
    cache a `--weights gguf` target reads too."""
    blocks = load_native_gguf(target.name, target.path, read_config(target.path))
    return {name: module for name, module in blocks.named_modules() if isinstance(module, PackedLinear)}


def parse_layer_subset(spec: str, num_layers: int) -> list[int]:
    """'first:N' (layers 0..N-1), 'every:N' (0, N, 2N, ... and always the last), or ranges '0-7,28-29'."""
    kind, _, value = spec.partition(":")
    try:
        if kind == "first":
            layers = list(range(int(value)))
        elif kind == "every":
            step = int(value)
            if step < 1:
                raise ValueError
            layers = sorted(set(range(0, num_layers, step)) | {num_layers - 1})
        else:
            layers = []
            for part in spec.split(","):
                low, _, high = part.partition("-")
                layers += range(int(low), int(high or low) + 1)
            layers = sorted(set(layers))
    except ValueError:
        raise InvalidParameterError(f"layerskip drafter: cannot read {spec!r} ({LAYERSKIP_SPECS})") from None
    if not layers or layers[0] < 0 or layers[-1] >= num_layers:
        raise InvalidParameterError(f"layerskip drafter: {spec!r} selects no layers within 0..{num_layers - 1}")
    if len(layers) == num_layers:
        raise InvalidParameterError(f"layerskip drafter: {spec!r} keeps all {num_layers} layers (no cheaper draft)")
    return layers


def layer_skip_draft(target: LoadedModel, spec: str) -> DraftModelDrafter:
    model = target.model
    if not isinstance(model, LlamaForCausalLM):
        raise InvalidParameterError("layerskip drafter: needs the native backend")
    spec = spec or DEFAULT_LAYER_SUBSETS.get(target.name, FALLBACK_LAYER_SUBSET)
    layers = parse_layer_subset(spec, model.num_layers)
    draft = dataclasses.replace(target, name=f"{target.name}-layers{len(layers)}",
                                model=layer_subset_copy(model, layers))
    return DraftModelDrafter(draft, model.vocab_size, name=f"layerskip:{spec}", shares_with=model)


def check_layer_skip_spec(spec) -> None:
    """The registry's check at spec parse: a SUBSET that cannot be read is refused before the target loads
    (whether its layers exist is known only once the target has loaded)."""
    if spec.argument:
        parse_layer_subset(spec.argument, ANY_DEPTH)


ANY_DEPTH = 1 << 20  # a model depth no subset can reach: only the subset's syntax is checked


def check_quant_spec(spec) -> None:
    """InvalidParameterError for a quant:FORMAT spec whose format or options are wrong."""
    try:
        kind, _ = parse_weight_format(spec.argument)
    except ValueError as error:
        raise InvalidParameterError(f"quant drafter: {error}") from None
    if kind == "float32":
        raise InvalidParameterError(QUANT_FLOAT32)


def build_quantized(spec, target: LoadedModel, device: str, dtype: str) -> DraftModelDrafter:
    """`quant:FORMAT[@options]` (a spec.DrafterSpec)."""
    return quantized_self_draft(target, spec.argument, spec.options, spec.text)


def build_layer_skip(spec, target: LoadedModel, device: str, dtype: str) -> DraftModelDrafter:
    """`layerskip[:SUBSET]` (a spec.DrafterSpec)."""
    return layer_skip_draft(target, spec.argument)
