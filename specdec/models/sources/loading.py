"""Load a model by zoo name, Hugging Face directory or GGUF file.

Every source ends as a Hugging Face directory (config.json, tokenizer files,
*.safetensors). Zoo models and GGUF files are converted once and cached, without
weights: a run on the GGUF's own blocks reads them from the GGUF; other loads
quantize from tensors dequantized in memory, and float32 loads (ours or
transformers') write the float32 safetensors once (ensure_float32_weights), so
later loads only map that file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from specdec.errors import CorruptModelError, InvalidParameterError, UnknownModelError, UnsupportedModelError
from specdec.models.adapters import adapter_fingerprint, check_adapter_dir, merge_lora
from specdec.models.base import CausalLM
from specdec.models.config import NATIVE_MODEL_TYPES, ModelConfig
from specdec.models.fused_checkpoints import split_fused_projections
from specdec.models.quantized.packed_cache import (discard_packed, is_cached_format, load_packed, packed_cache_path,
                                                   save_packed, write_packed)
from specdec.models.quantized.packed_linear import PackedLinear, parse_weight_format
from specdec.models.sources.content_key import gguf_content_key, zoo_name_of
from specdec.models.sources.gguf_source import gguf_only_source, gguf_source
from specdec.models.sources.stores import resolve_store_name
from specdec.paths import converted_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BACKENDS = ("auto", "native", "transformers")


@dataclass
class LoadedModel:
    name: str
    path: Path  # the Hugging Face directory the weights came from
    model: CausalLM
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    eos_token_ids: tuple[int, ...]
    backend: str  # "native" or "transformers"

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def control_token_ids(self) -> frozenset[int]:
        """The tokenizer's special tokens other than end-of-sequence (chat-template and file markers such
        as <|im_start|>): text the model practically never generates inside an answer."""
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        return frozenset(i for i, token in added.items() if token.special) - frozenset(self.eos_token_ids)


def check_model_spec(spec: str) -> None:
    """A zoo name, a Hugging Face directory (with config.json), an existing .gguf file or a stored model
    (stores.py: ollama:, hf:, lmstudio:, a --models-dir name); else UnknownModelError. Only the store's index
    is read, nothing pulled: what a command checks before it loads anything."""
    _model_path(spec)


def _model_path(spec: str) -> tuple[str, Path | None]:
    """(display name, the directory or GGUF file it names; None for a zoo name)."""
    from specdec.models.sources import zoo

    stored = resolve_store_name(spec) if spec not in zoo.REGISTRY else None
    path = stored.path if stored is not None else Path(spec).expanduser()
    name = stored.name if stored is not None else (path.name if path.is_dir() else path.stem)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UnknownModelError(f"{spec}: directory has no config.json (not a Hugging Face model directory)")
        return name, path
    if path.suffix == ".gguf" or stored is not None:
        if not path.is_file():
            raise UnknownModelError(f"{spec}: no such GGUF file")
        return name, path
    if spec not in zoo.REGISTRY:
        raise UnknownModelError(f"unknown model {spec!r}: not a zoo name ({', '.join(zoo.REGISTRY)}), a model "
                                "directory, a .gguf file or a stored model (ollama:NAME, hf:ORG/REPO, "
                                "lmstudio:PUBLISHER/REPO, a name in --models-dir)")
    return spec, None


def resolve_model_dir(spec: str, pull_missing: bool = True) -> tuple[str, Path]:
    """(display name, Hugging Face directory) for a zoo name, a model directory, a .gguf file or a stored
    model."""
    from specdec.models.sources import zoo

    name, path = _model_path(spec)
    if path is None:
        return spec, zoo.ensure_pulled(spec) if pull_missing else zoo.model_dir(spec)
    if path.is_dir():
        return name, path
    same = zoo_name_of(path)  # a zoo model's file under another name: its name, defaults and caches
    return (same, zoo.model_dir(same) / "hf") if same is not None else (name, gguf_cache_dir(path, name))


def gguf_cache_dir(gguf_path: Path, label: str | None = None) -> Path:
    """The converted directory of a GGUF file, converting it on first use; one per content (content_key), so
    the same bytes under another path reuse it, and it names the path it was last reached by. `label`: the
    model's name (a store's blob is named by its digest), in the directory's name."""
    from specdec.models.sources.gguf_convert import convert_gguf

    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", label or gguf_path.stem).strip("-") or "model"
    out = converted_dir() / f"{readable}-{gguf_content_key(gguf_path)[:16]}"
    if not (out / "config.json").exists():
        matches = list(converted_dir().glob(f"*-{gguf_content_key(gguf_path)[:16]}"))
        out = matches[0] if matches and (matches[0] / "config.json").exists() else out
    if not (out / "config.json").exists():
        convert_gguf(gguf_path, out)
    record = out / "specdec_source.json"
    if gguf_source(out) != gguf_path.resolve():  # the first path it was converted from may be gone
        record.write_text(json.dumps({"gguf": str(gguf_path.resolve())}))
    return out


def load_model(
    spec: str,
    device: str = "cpu",
    dtype: str = "float32",
    backend: str = "auto",
    kernels: bool = True,
    weights: str = "float32",
    cuda_graphs: bool = True,
    ids_tokenizer=None,
    kv_dtype: str = "auto",
    adapter: str | None = None,
) -> LoadedModel:
    """Load a model; `kernels=False` keeps stock torch matmuls instead of the packed CPU kernel.
    `ids_tokenizer`: for a model used only through token ids (a draft), a loaded tokenizer to reuse where
    this model's vocabulary file is the same (its chat template, never used by a draft, may differ).
    On a GPU the native runtime replays its decode and verify forwards as CUDA graphs unless
    `cuda_graphs=False` (models/cuda_graphs.py). kv_dtype: the KV cache's element type (a DTYPES name; "auto":
    the model's dtype), native models only. adapter: a LoRA adapter directory (PEFT's format) merged into the
    float weights before they are packed (native models only; not into a GGUF file's own blocks).

    weights="int8" (weight-only, per output channel) or "int4[:G]" (grouped 4-bit, see packed_linear)
    quantizes the linear layers at load: that quantized model is then the target, whose plain output
    speculation reproduces exactly. weights="auto" (what the CLI and the API default to): see auto_weights."""
    check_load_options(device, dtype, backend, weights, kv_dtype)
    on_kernel = backend != "transformers" and kernels and uses_packed_kernel(device, DTYPES[dtype])
    if weights not in ("float32", "auto") and not on_kernel:
        raise InvalidParameterError(
            f"--weights {weights} runs on the CPU kernel only (native backend, float32 activations, "
            "a CPU with AVX2/FMA and a C++ compiler)")
    name, model_dir = resolve_model_dir(spec)
    hf_config = read_config(model_dir)
    if backend == "auto":
        backend = "native" if hf_config.get("model_type") in NATIVE_MODEL_TYPES else "transformers"
    if weights == "auto":
        weights = auto_weights(model_dir, on_kernel and backend == "native")
    if backend == "transformers" and weights != "float32":
        raise InvalidParameterError(f"--weights {weights} needs the native backend; {name} loads with transformers")
    if backend == "transformers" and kv_dtype != "auto":
        raise InvalidParameterError(f"--kv-dtype {kv_dtype} needs the native backend; {name} loads with transformers")
    adapter_key = checked_adapter_key(adapter, name, backend, weights)
    if backend == "native":
        # low-bit formats: the packing saved by an earlier load (models/quantized/packed_cache.py), else quantize and save
        model = load_native_packed(model_dir, hf_config, weights, adapter_key) if is_cached_format(weights) else None
        if model is None and weights == "gguf":
            model = load_native_gguf(name, model_dir, hf_config)
        if model is None:
            # a float32 model maps its safetensors on every load; a quantized one is cached packed instead
            model = load_native(model_dir, hf_config, device, DTYPES[dtype], keep_float32=weights == "float32")
            if adapter is not None:
                model = merge_lora(model, adapter)
            if kernels and uses_packed_kernel(device, DTYPES[dtype]):
                try:
                    model.pack_weights(weights, embedding_table=gguf_embedding_table(model_dir, hf_config, weights))
                except ValueError as error:  # e.g. an int4 group size that does not divide a layer
                    raise InvalidParameterError(f"{name}: {error}") from None
                if is_cached_format(weights):
                    save_packed(model, packed_cache_path(model_dir, weights, adapter_key))
        if kv_dtype != "auto":
            model.kv_dtype = DTYPES[kv_dtype]
        if cuda_graphs and torch.device(device).type == "cuda":
            model.use_cuda_graphs()
    else:
        model = load_transformers(model_dir, device, DTYPES[dtype])
    tokenizer = ids_tokenizer if same_vocabulary(ids_tokenizer, model_dir) else load_tokenizer(model_dir)
    eos = eos_token_ids(model_dir, hf_config, tokenizer)
    return LoadedModel(name, model_dir, model, tokenizer, eos, backend)


def checked_adapter_key(adapter: str | None, name: str, backend: str, weights: str) -> str | None:
    """The fingerprint of the LoRA adapter to merge (None: no adapter), once it is known to apply."""
    if adapter is None:
        return None
    if backend != "native" or weights == "gguf":
        raise InvalidParameterError(f"{name}: a LoRA adapter merges into float weights before they are packed: "
                                    f"not with {'weights gguf' if backend == 'native' else 'the transformers backend'}")
    return adapter_fingerprint(check_adapter_dir(adapter))


def check_load_options(device: str, dtype: str, backend: str, weights: str, kv_dtype: str = "auto") -> None:
    """InvalidParameterError for a device, dtype, backend, weight format or KV cache dtype `load_model` does not
    know ("auto" weights are resolved once the model's source is known)."""
    if weights != "auto":
        try:
            parse_weight_format(weights)
        except ValueError as error:
            raise InvalidParameterError(str(error)) from None
    if dtype not in DTYPES:
        raise InvalidParameterError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    if kv_dtype != "auto" and kv_dtype not in DTYPES:
        raise InvalidParameterError(f"unknown KV cache dtype {kv_dtype!r} (choose from auto, {', '.join(DTYPES)})")
    if backend not in BACKENDS:
        raise InvalidParameterError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    check_device(device)


def auto_weights(model_dir: Path, native_on_kernel: bool) -> str:
    """What weights="auto" loads where the native runtime runs on the CPU kernel (else float32): a model that
    came from a GGUF file runs on that file's own quantized blocks (the very values llama.cpp multiplies, a
    quarter of float32's bytes); a checkpoint stored in bfloat16 or float16 on panels of that type (the
    checkpoint's own values, half the bytes; the kernel computes what float32 computes on them); anything
    else as float32."""
    if not native_on_kernel:
        return "float32"
    if gguf_source(model_dir) is not None:
        return "gguf"
    return stored_float_format(model_dir)


STORED_FORMATS = {"BF16": "bf16", "F16": "fp16"}  # safetensors dtype names -> our weight formats


def stored_float_format(model_dir: Path) -> str:
    """bf16 or fp16 where every linear layer's weight in the checkpoint is stored in that type, else float32
    (read from the safetensors headers: no tensor is loaded)."""
    from safetensors import SafetensorError, safe_open

    dtypes = set()
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                dtypes.update(handle.get_slice(name).get_dtype() for name in handle.keys()
                              if is_linear_weight(name) and name.endswith(".weight"))
        except (SafetensorError, OSError):
            return "float32"  # the load proper reports what is wrong with the file
    return STORED_FORMATS.get(dtypes.pop(), "float32") if len(dtypes) == 1 else "float32"


def uses_packed_kernel(device: str, dtype: torch.dtype) -> bool:
    from specdec.kernels import packed_kernel

    return torch.device(device).type == "cpu" and dtype == torch.float32 and packed_kernel() is not None


def check_device(device: str) -> None:
    """cpu, cuda or cuda:N, where CUDA is available; else InvalidParameterError."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidParameterError(f"unknown device {device!r} (use cpu or cuda)") from None
    if parsed.type not in ("cpu", "cuda"):
        raise InvalidParameterError(f"unknown device {device!r} (use cpu or cuda)")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InvalidParameterError("device cuda requested but CUDA is not available on this machine")


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
    from specdec.models.sources.gguf_convert import write_float32_weights

    source = gguf_only_source(model_dir)
    if source is not None:
        logging.getLogger("specdec").warning(
            f"specdec: writing {source.name} as float32 safetensors (once, for float32 or transformers loads)")
        write_float32_weights(source, model_dir)
    return model_dir


def read_checkpoint(model_dir: Path, wanted: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (those whose name `wanted` accepts), as stored; for a GGUF-sourced directory
    without float32 safetensors, dequantized from the GGUF in memory."""
    from safetensors import SafetensorError, safe_open

    source = gguf_only_source(model_dir)
    if source is not None:
        from specdec.models.sources.gguf_convert import dequantized_state_dict, read_gguf

        return dequantized_state_dict(read_gguf(source), wanted)
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(model_dir):
        try:
            with safe_open(str(file), framework="pt") as handle:
                state.update({name: handle.get_tensor(name) for name in handle.keys() if wanted is None or wanted(name)})
        except (SafetensorError, OSError) as exc:
            raise CorruptModelError(f"{file}: corrupt safetensors file ({exc})") from None
    return state


def load_native(model_dir: Path, hf_config: dict, device: str, dtype: torch.dtype, keep_float32: bool = True):
    """The full-precision model; `keep_float32` writes a GGUF-sourced directory's float32 safetensors for
    the next load (else its tensors are dequantized in memory, for a caller that packs and caches them)."""
    from specdec.models.llama import LlamaForCausalLM

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


LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj",
                 "gate_up_proj")  # the last two: fused, as Phi-3 stores them


def is_linear_weight(name: str) -> bool:
    """Whether a checkpoint tensor belongs to a linear layer the CPU kernel packs (weight or bias): the
    projections, the LM head, a mixture's router (`mlp.gate`; gpt-oss's checkpoints: `mlp.router`) and experts."""
    parts = name.split(".")
    return (parts[0] == "lm_head" or (len(parts) >= 2 and parts[-2] in LINEAR_LAYERS) or "experts" in parts
            or parts[-3:-1] in (["mlp", "gate"], ["mlp", "router"]))


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
    from specdec.models.llama import EMBEDDING_TABLE, LlamaForCausalLM

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
    from specdec.models.quantized.gguf_matrices import GgufMatrices

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
    from specdec.models.quantized.gguf_matrices import GgufMatrices

    source = gguf_source(model_dir)
    if source is None or hf_config.get("tie_word_embeddings", False) or not is_cached_format(weights):
        return None
    try:
        matrices = GgufMatrices(source)
        return None if matrices.tied else matrices.embedding_table()
    except ValueError:
        return None  # a table the kernels cannot read: kept in float32


def load_transformers(model_dir: Path, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from specdec.models.hf_adapter import HFCausalLM

    path = str(ensure_float32_weights(model_dir))
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        except ValueError as exc:  # architectures without an sdpa path (gpt-oss's sinks): their eager attention
            if "scaled_dot_product_attention" not in str(exc):
                raise
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    except ValueError as exc:
        raise UnsupportedModelError(f"{model_dir}: transformers cannot load this model ({exc})".splitlines()[0]) from None
    return HFCausalLM(model.to(device))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
_tokenizers: dict[str, object] = {}  # the tokenizer files' digest -> the tokenizer loaded from them


def same_vocabulary(tokenizer, model_dir: Path) -> bool:
    """Whether `tokenizer` (or None) was loaded from a tokenizer.json with the same bytes as model_dir's."""
    if tokenizer is None:
        return False
    theirs, ours = Path(getattr(tokenizer, "name_or_path", "")) / "tokenizer.json", model_dir / "tokenizer.json"
    return theirs.is_file() and ours.is_file() and theirs.read_bytes() == ours.read_bytes()


def load_tokenizer(model_dir: Path):
    """The directory's tokenizer. Models whose tokenizer files are the same bytes (a draft of the target's
    family) share one object: building a 152k-token tokenizer costs over a second a load."""
    from transformers import AutoTokenizer

    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    key = digest.hexdigest()
    if key not in _tokenizers:
        try:
            _tokenizers[key] = AutoTokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError) as exc:
            raise CorruptModelError(f"{model_dir}: no usable tokenizer ({exc})".splitlines()[0]) from None
    return _tokenizers[key]


def eos_token_ids(model_dir: Path, hf_config: dict, tokenizer) -> tuple[int, ...]:
    """Every id that ends generation: config, generation_config.json and the tokenizer's EOS."""
    ids: set[int] = set()
    sources = [hf_config.get("eos_token_id")]
    generation_config = model_dir / "generation_config.json"
    if generation_config.exists():
        sources.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    sources.append(getattr(tokenizer, "eos_token_id", None))
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(int(i) for i in source)
    return tuple(sorted(ids))
