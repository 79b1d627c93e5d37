"""Convert a GGUF file into a Hugging Face model directory (config, tokenizer, safetensors).

Config and tokenizer are rebuilt from the GGUF metadata by transformers, under a
temporary name renamed at the end, so an interrupted conversion leaves nothing
half-written. The float32 weights (dequantized with the `gguf` package) are
written only when something needs them as a file (`write_float32_weights`):
a run on the GGUF's own blocks never does, and float32 is four to eight times
the GGUF's size on disk.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from specdec.errors import UnsupportedModelError
from specdec.models.fused_checkpoints import gpt_oss_checkpoint_layout, split_experts
from specdec.models.sources.gguf_file import GgufFile
from specdec.paths import building_directory, replace_flushed

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "mistral", "gemma3", "phi3", "gpt-oss")

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # Qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3 names its four norms differently: llama.cpp's ffn_norm is the one before the feed-forward
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# Phi-3 keeps its projections fused as its checkpoints do (models/fused_checkpoints.py splits them)
_PHI3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}
# Qwen3-MoE: the router and each layer's experts as one (experts, rows, inputs) tensor per projection
_QWEN3MOE_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj",
    "ffn_up_exps.weight": "mlp.experts.up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
}
# gpt-oss: biased attention output, a sink per head, the norm before the experts named as Gemma's, a biased
# router and biased experts (gate, up and down apart, as llama.cpp's converter splits them); read into the
# checkpoint's layout by fused_checkpoints.gpt_oss_checkpoint_layout
_GPT_OSS_LAYER_NAMES = {
    **_QWEN3MOE_LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.bias": "mlp.gate.bias",
    "ffn_gate_exps.bias": "mlp.experts.gate_proj_bias",
    "ffn_up_exps.bias": "mlp.experts.up_proj_bias",
    "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for tensors we derive instead (rope_freqs)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    layer_names = {"gemma3": _GEMMA3_LAYER_NAMES, "phi3": _PHI3_LAYER_NAMES,
                   "qwen3moe": _QWEN3MOE_LAYER_NAMES, "gpt-oss": _GPT_OSS_LAYER_NAMES}.get(arch, _LAYER_NAMES)
    match = _BLOCK.match(gguf_name)
    if match and match.group(2) in layer_names:
        return f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}"
    if gguf_name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        return None  # read into the config (phi3_rope_parameters) or derived from it
    raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} has no mapping to the {arch} layout")


def stores_norms_plus_one(arch: str) -> bool:
    """llama.cpp's converter writes Gemma's norm weights as 1 + w (its norm multiplies by the weight);
    Hugging Face checkpoints keep w (their norm multiplies by 1 + w)."""
    return arch == "gemma3"


def unpermute_llama_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rope pairs -> half-split rope)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def read_gguf(path: Path) -> GgufFile:
    """The file's metadata and tensor index (gguf_file.py: its tokenizer arrays are skipped, not parsed)."""
    return GgufFile(Path(path))


def gguf_field(reader: GgufFile, key: str, default=None):
    return reader.field(key, default)


def dequantized_state_dict(reader, wanted: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """float32 tensors under Hugging Face names (those `wanted` accepts, by the name of the whole tensor; the
    others are not dequantized)."""
    arch = gguf_field(reader, "general.architecture")
    num_heads = gguf_field(reader, f"{arch}.attention.head_count")
    num_kv_heads = gguf_field(reader, f"{arch}.attention.head_count_kv", num_heads)
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, arch)
        if name is None or (wanted is not None and not wanted(name)):
            continue
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"GGUF tensor {tensor.name}: quantization {tensor.tensor_type.name} cannot be dequantized"
            ) from None
        array = np.asarray(array, dtype=np.float32).reshape(tuple(reversed([int(d) for d in tensor.shape])))
        if arch == "llama" and ".attn_q." in tensor.name:
            array = unpermute_llama_qk(array, num_heads)
        elif arch == "llama" and ".attn_k." in tensor.name:
            array = unpermute_llama_qk(array, num_kv_heads)
        elif stores_norms_plus_one(arch) and name.endswith("norm.weight"):
            array = array - 1.0
        values = torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True))
        # a mixture's (experts, rows, inputs) tensors as each expert's matrices, as its checkpoints store them
        state.update(split_experts(name, values) if values.dim() == 3 and arch != "gpt-oss" else {name: values})
    return gpt_oss_checkpoint_layout(state) if arch == "gpt-oss" else state


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Write `out_dir` (config.json, tokenizer files, specdec_source.json naming the GGUF) from a GGUF file.
    The weights stay in the GGUF until `write_float32_weights` is asked for them."""
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    gguf_path = Path(gguf_path)
    reader = read_gguf(gguf_path)
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf_path.name}: GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    names = [hf_tensor_name(tensor.name, arch) for tensor in reader.tensors]  # refuses unknown tensors up front
    with building_directory(out_dir) as tmp:
        if arch == "gpt-oss":  # transformers' GGUF reader fails on the file's YaRN keys: read it ourselves
            config = gpt_oss_config(reader)
        else:
            config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        config.tie_word_embeddings = "lm_head.weight" not in names
        # transformers' GGUF mapping drops key_length; Qwen3's heads are wider than hidden / heads
        head_dim = gguf_field(reader, f"{arch}.attention.key_length")
        if head_dim is not None:
            config.head_dim = int(head_dim)
        if arch == "gemma3":
            # not in the file: llama.cpp scales scores by 1/sqrt(head_dim), but by 1/sqrt(hidden / heads)
            # for the 62-layer 27B model (its query_pre_attn_scalar); transformers would assume 256
            heads = gguf_field(reader, f"{arch}.attention.head_count")
            if gguf_field(reader, f"{arch}.block_count") == 62:
                config.query_pre_attn_scalar = int(gguf_field(reader, f"{arch}.embedding_length")) // int(heads)
            else:
                config.query_pre_attn_scalar = int(head_dim or config.hidden_size // heads)
        if arch == "qwen3moe":  # transformers' GGUF mapping drops the experts' width
            config.moe_intermediate_size = int(gguf_field(reader, "qwen3moe.expert_feed_forward_length"))
        if arch == "phi3":
            config.rope_parameters = {**(config.rope_parameters or {}), **phi3_rope_parameters(reader)}
            config.sliding_window = None  # llama.cpp disables Phi-3's window; a run on its file matches that
        config.dtype = "float32"
        config.save_pretrained(tmp)
        # AutoTokenizer reads a GGUF file's config again (for gpt-oss: the failing reader); the fast tokenizer
        # class reads only the vocabulary
        tokenizers = PreTrainedTokenizerFast if arch == "gpt-oss" else AutoTokenizer
        tokenizer = tokenizers.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer.save_pretrained(tmp)
        (tmp / "specdec_source.json").write_text(json.dumps({"gguf": str(gguf_path.resolve())}))
    return out_dir


def gpt_oss_config(reader: GgufFile):
    """A gpt-oss file's config, as llama.cpp reads the file: the experts' width (expert_feed_forward_length),
    the window on every other layer from the first, and YaRN's band rounded to whole dimensions, as llama.cpp
    always rounds it (the checkpoint's own config says not to; a run on the file matches llama.cpp).
    transformers' GGUF reader would do most of this, but fails on the rope.scaling keys every such file has."""
    from transformers import GptOssConfig

    def field(key: str, default=None):
        return gguf_field(reader, f"gpt-oss.{key}", default)

    layers = int(field("block_count"))
    rope = {"rope_type": "default", "rope_theta": float(field("rope.freq_base", 150000.0))}
    if field("rope.scaling.type") == "yarn":
        rope.update(rope_type="yarn", factor=float(field("rope.scaling.factor", 1.0)), truncate=True,
                    original_max_position_embeddings=int(field("rope.scaling.original_context_length", 4096)),
                    beta_fast=32.0, beta_slow=1.0)  # llama.cpp's defaults; its files do not record them
    heads = int(field("attention.head_count"))
    vocab = next(int(tensor.shape[1]) for tensor in reader.tensors if tensor.name == "token_embd.weight")
    return GptOssConfig(
        vocab_size=vocab, hidden_size=int(field("embedding_length")),
        intermediate_size=int(field("expert_feed_forward_length")), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=int(field("attention.head_count_kv", heads)),
        head_dim=int(field("attention.key_length", int(field("embedding_length")) // heads)),
        num_local_experts=int(field("expert_count")), num_experts_per_tok=int(field("expert_used_count")),
        sliding_window=int(field("attention.sliding_window")), rms_norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(field("context_length")), rope_parameters=rope,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=gguf_field(reader, "tokenizer.ggml.eos_token_id"))


def phi3_rope_parameters(reader: GgufFile) -> dict:
    """Phi-3's rope as transformers' config holds it, from what llama.cpp's converter writes (which
    transformers' GGUF mapping drops): the rotated share of each head and, for the long-context models,
    longrope's factor tensors, original context length and cos/sin scale."""
    hidden, heads = gguf_field(reader, "phi3.embedding_length"), gguf_field(reader, "phi3.attention.head_count")
    rotary = gguf_field(reader, "phi3.rope.dimension_count", hidden // heads)
    params = {"rope_theta": float(gguf_field(reader, "phi3.rope.freq_base", 10000.0)),
              "partial_rotary_factor": rotary / (hidden // heads), "rope_type": "default"}
    factors = {tensor.name: tensor for tensor in reader.tensors if tensor.name.startswith("rope_factors_")}
    if "rope_factors_short.weight" in factors:
        params.update(
            rope_type="longrope",
            short_factor=[float(f) for f in np.asarray(factors["rope_factors_short.weight"].data, dtype=np.float32)],
            long_factor=[float(f) for f in np.asarray(factors["rope_factors_long.weight"].data, dtype=np.float32)],
            original_max_position_embeddings=int(gguf_field(reader, "phi3.rope.scaling.original_context_length")),
            attention_factor=float(gguf_field(reader, "phi3.rope.scaling.attn_factor", 1.0)))
    return params


def write_float32_weights(gguf_path: Path, out_dir: Path) -> Path:
    """`out_dir`/model.safetensors: every tensor of the GGUF dequantized to float32, written under a
    temporary name and renamed, so a crash (or a second process doing the same) leaves no partial file."""
    state = dequantized_state_dict(read_gguf(Path(gguf_path)))
    final = Path(out_dir) / "model.safetensors"
    partial = final.with_name(f".model.safetensors.{os.getpid()}.partial")
    try:
        save_file(state, str(partial), metadata={"format": "pt"})
        replace_flushed(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    return final
