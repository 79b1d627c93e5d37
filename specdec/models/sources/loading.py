"""Load a model by zoo name, Hugging Face directory or GGUF file.

Every source ends as a Hugging Face directory (config.json, tokenizer files,
*.safetensors). Zoo models and GGUF files are converted once and cached, without
weights: a run on the GGUF's own blocks reads them from the GGUF; other loads
quantize from tensors dequantized in memory, and float32 loads (ours or
transformers') write the float32 safetensors once (ensure_float32_weights), so
later loads only map that file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import InvalidParameterError, UnknownModelError, UnsupportedModelError
from specdec.kernels import packed_kernel
from specdec.models.adapters import adapter_fingerprint, check_adapter_dir, merge_lora
from specdec.models.base import CausalLM
from specdec.models.config import NATIVE_MODEL_TYPES
from specdec.models.hf_adapter import HFCausalLM
from specdec.models.quantized.packed_cache import is_cached_format, packed_cache_path, save_packed
from specdec.models.quantized.packed_linear import parse_weight_format
from specdec.models.sources import zoo
from specdec.models.sources.checkpoint import ensure_float32_weights, read_config, stored_float_format
from specdec.models.sources.content_key import gguf_content_key, zoo_name_of
from specdec.models.sources.gguf_convert import convert_gguf
from specdec.models.sources.gguf_source import gguf_source
from specdec.models.sources.native_load import gguf_embedding_table, load_native, load_native_gguf, load_native_packed
from specdec.models.sources.stores import resolve_store_name
from specdec.models.sources.tokenizer_files import eos_token_ids, load_tokenizer, same_vocabulary
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


def model_location(spec: str) -> Path | None:
    """The GGUF file or model directory a spec names, without loading, converting or pulling anything (a zoo
    model: its pulled GGUF file, None when it is not pulled); UnknownModelError as check_model_spec."""
    _, path = _model_path(spec)
    if path is None:
        gguf = zoo.model_dir(spec) / f"{spec}.gguf"
        return gguf if gguf.is_file() else None
    return path


def resolve_model_dir(spec: str, pull_missing: bool = True) -> tuple[str, Path]:
    """(display name, Hugging Face directory) for a zoo name, a model directory, a .gguf file or a stored
    model."""
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
        model = _native_model(name, model_dir, hf_config, device, dtype, kernels, weights, adapter, adapter_key)
        if kv_dtype != "auto":
            model.kv_dtype = DTYPES[kv_dtype]
        if cuda_graphs and torch.device(device).type == "cuda":
            model.use_cuda_graphs()
    else:
        model = load_transformers(model_dir, device, DTYPES[dtype])
    tokenizer = ids_tokenizer if same_vocabulary(ids_tokenizer, model_dir) else load_tokenizer(model_dir)
    eos = eos_token_ids(model_dir, hf_config, tokenizer)
    return LoadedModel(name, model_dir, model, tokenizer, eos, backend)


def _native_model(name: str, model_dir: Path, hf_config: dict, device: str, dtype: str, kernels: bool,
                  weights: str, adapter: str | None, adapter_key: str | None):
    """The native runtime's model in `weights`: a low-bit format from the packing an earlier load saved
    (models/quantized/packed_cache.py), GGUF blocks from the file, else built from the checkpoint (the LoRA
    adapter merged), packed for the CPU kernel and, in a cached format, saved for the next load."""
    model = load_native_packed(model_dir, hf_config, weights, adapter_key) if is_cached_format(weights) else None
    if model is None and weights == "gguf":
        model = load_native_gguf(name, model_dir, hf_config)
    if model is not None:
        return model
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
    return model


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



def uses_packed_kernel(device: str, dtype: torch.dtype) -> bool:
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


def load_transformers(model_dir: Path, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

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


