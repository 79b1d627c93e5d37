"""Tiny random-weight models and a byte-level tokenizer for fast, offline tests."""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch
import transformers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("Ġ", "t"), ("i", "n")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_vocab(merges: bool = True) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokens (256 byte symbols, a few merges unless merges=False, specials) in id order, and the merges."""
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    chosen = list(MERGES) if merges else []
    tokens += [a + b for a, b in chosen]
    return tokens + SPECIAL_TOKENS, chosen


def make_tokenizer(merges: bool = True) -> transformers.PreTrainedTokenizerFast:
    """The tiny byte-level BPE tokenizer; merges=False: bytes only (another tokenizer, for cross-tokenizer
    drafting: same text, other ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = byte_level_vocab(merges)
    vocab = {t: i for i, t in enumerate(tokens)}  # specials get fixed ids at the end
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


VOCAB = len(byte_level_vocab()[0])  # 263

# A code model's extra tokens: fill-in-the-middle (Qwen2.5-Coder's names) and Hermes tool-call markers.
CODER_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>", "<tool_call>",
                "</tool_call>"]
CODER_VOCAB = VOCAB + len(CODER_TOKENS)
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools>\nFor each function call, return <tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{%- if m.tool_calls %}{% for call in m.tool_calls %}"
    "<tool_call>\n{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}\n</tool_call>"
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_coder_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The tiny tokenizer with FIM and tool-call tokens and a Hermes-style chat template (tools listed)."""
    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS + CODER_TOKENS[:5]})
    tokenizer.add_tokens(CODER_TOKENS[5:])  # the tool markers are text tokens, as in Qwen2.5
    tokenizer.chat_template = HERMES_TEMPLATE
    return tokenizer


def tiny_config(kind: str = "llama", vocab_size: int = VOCAB, **overrides):
    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=VOCAB - 1, bos_token_id=VOCAB - 2,
    )
    common.update(overrides)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "llama3":
        return transformers.LlamaConfig(
            **common, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64},
        )
    if kind == "qwen2":
        return transformers.Qwen2Config(**{**common, "tie_word_embeddings": True})
    if kind == "qwen3":
        return transformers.Qwen3Config(**{"tie_word_embeddings": True, **common})
    if kind == "mistral":
        return transformers.MistralConfig(**{"sliding_window": None, **common})
    if kind == "gemma3":  # a window shorter than the tests' contexts; one sliding and one global layer
        return transformers.Gemma3TextConfig(**{
            "tie_word_embeddings": True, "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
            **common})
    if kind == "qwen3_moe":  # 4 experts, 2 a token; the second layer dense, as mlp_only_layers allows
        return transformers.Qwen3MoeConfig(**{
            "tie_word_embeddings": True, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "norm_topk_prob": True, "mlp_only_layers": [1], **common})
    if kind == "phi3":  # as Phi-4-mini: fused q/k/v and gate/up, 3/4 of each head rotated, longrope, tied
        return transformers.Phi3Config(**{
            "tie_word_embeddings": True, "partial_rotary_factor": 0.75, "sliding_window": None, "pad_token_id": 0,
            "original_max_position_embeddings": 256,  # the tests stay within it: short factors
            "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 3.0],
                             "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]},
            **common})
    if kind == "gpt_oss":  # a window shorter than the tests' contexts, 4 experts of 32, YaRN as the release has
        # it; yarn_truncate=True: YaRN's band in whole dimensions, as llama.cpp computes it from a GGUF file
        truncate = common.pop("yarn_truncate", False)
        return transformers.GptOssConfig(**{
            **common, "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": truncate, "original_max_position_embeddings": 128}})
    raise ValueError(kind)


def make_hf_model(kind: str = "llama", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    attention = "eager" if kind == "gpt_oss" else "sdpa"  # transformers has no sdpa path with sinks
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), attn_implementation=attention)
    # Random init gives nearly flat distributions; larger weights make argmax decisive
    # and outputs prefix-dependent, which greedy-equality tests need.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.mul_(4.0)
            elif kind == "gpt_oss" and (name.endswith("bias") or name.endswith("sinks")):
                param.normal_(0.0, 1.0)  # sinks and biases that matter (they start at zero)
    return model.eval()


def save_tiny_model(path: Path, kind: str = "llama", seed: int = 0, tokenizer=None, **overrides) -> Path:
    model = make_hf_model(kind, seed, **overrides)
    model.save_pretrained(path)
    (tokenizer or make_tokenizer()).save_pretrained(path)
    return path


def llama_cpp_permute(weight, num_heads: int):
    """llama.cpp's convert script permutes q/k rows of Llama-arch models this way."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# Where each format gguf-py cannot quantize to keeps its float16 scales: (offset of d, count of halves).
RANDOM_BLOCK_SCALES = {"Q2_K": (80, 2), "Q3_K": (108, 1), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1),
                       "IQ4_NL": (0, 1), "IQ4_XS": (0, 1), "IQ2_XXS": (0, 1)}


def random_k_blocks(format_name: str, rows: int, cols: int, seed: int):
    """Random blocks of a format gguf-py cannot quantize to (the K-quants, the i-quants) as (rows, bytes per
    row) uint8, with modest float16 scales: any codes with finite scales are a valid matrix of the format."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[format_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    offset, halves = RANDOM_BLOCK_SCALES[format_name]
    scales = rng.uniform(0.002, 0.02, (rows, cols // block_size, halves)).astype(np.float16).view(np.uint8)
    blocks[..., offset:offset + 2 * halves] = scales
    return blocks.reshape(rows, -1)


def write_tiny_gguf(path: Path, hf_model, quantization: str | dict[str, str] = "F32") -> Path:
    """Write `hf_model` (llama, qwen2, qwen3, gemma3 or phi3) and the tiny tokenizer as a GGUF file, as llama.cpp would.
    `quantization`: one format for every matrix, or GGUF tensor name suffix -> format with a "default"
    (as llama.cpp's mixes: e.g. {"default": "Q4_K", "attn_v.weight": "Q6_K"}); K-quant matrices get random
    blocks (random_k_blocks), not the model's weights."""
    import gguf
    import numpy as np

    config = hf_model.config
    arch = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3",
            "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}.get(config.model_type, "llama")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    rope = config.rope_parameters
    writer.add_rope_freq_base((rope["full_attention"] if arch == "gemma3" else rope)["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope_params = config.rope_parameters if arch == "phi3" else {}
    writer.add_rope_dimension_count(int(head_dim * rope_params.get("partial_rotary_factor", 1.0)))
    if arch == "phi3":  # as llama.cpp's converter: window 0, longrope's factors as tensors
        writer.add_sliding_window(0)
        if rope_params.get("rope_type") == "longrope":
            original = rope_params["original_max_position_embeddings"]
            scale = config.max_position_embeddings / original
            writer.add_rope_scaling_orig_ctx_len(original)
            writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
            writer.add_tensor("rope_factors_long.weight", np.array(rope_params["long_factor"], dtype=np.float32))
            writer.add_tensor("rope_factors_short.weight", np.array(rope_params["short_factor"], dtype=np.float32))
    if arch == "qwen3moe":  # every layer a mixture, as llama.cpp's qwen3moe models are
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "gpt-oss":  # as llama.cpp's converter: the experts' width, the window, YaRN's parameters
        writer.add_expert_count(config.num_local_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.intermediate_size)
        writer.add_sliding_window(config.sliding_window)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(config.rope_parameters["factor"])
        writer.add_rope_scaling_orig_ctx_len(config.rope_parameters["original_max_position_embeddings"])
    if arch in ("qwen3", "gemma3", "qwen3moe", "gpt-oss"):  # as llama.cpp writes it: the head width, not derived from hidden / heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "gemma3":  # llama.cpp takes the layer pattern (every 6th global) and local rope base as given
        writer.add_sliding_window(config.sliding_window)
    if arch == "gemma3":
        write_sentencepiece_vocab(writer)
    else:
        write_byte_level_vocab(writer, config.bos_token_id, config.eos_token_id)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                   "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
                   "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
                   "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
                   "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                   "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
                   "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    if arch == "qwen3moe":
        layer_names = {**layer_names, "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.gate_proj": "ffn_gate_exps.weight",
                       "mlp.experts.up_proj": "ffn_up_exps.weight", "mlp.experts.down_proj": "ffn_down_exps.weight"}
    if arch == "gpt-oss":
        layer_names = {**layer_names, "mlp.router.weight": "ffn_gate_inp.weight", "mlp.router.bias": "ffn_gate_inp.bias",
                       "self_attn.sinks": "attn_sinks.weight", "self_attn.o_proj.bias": "attn_output.bias",
                       "post_attention_layernorm.weight": "post_attention_norm.weight",
                       **{f"mlp.experts.{kind}{suffix}": f"ffn_{kind.split('_')[0]}_exps.{'bias' if suffix else 'weight'}"
                          for kind in ("gate_proj", "up_proj", "down_proj") for suffix in ("", "_bias")}}
    if arch == "phi3":
        layer_names = {**layer_names, "self_attn.qkv_proj.weight": "attn_qkv.weight",
                       "mlp.gate_up_proj.weight": "ffn_up.weight"}
    if arch == "gemma3":
        layer_names = {**layer_names, "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                       "post_attention_layernorm.weight": "post_attention_norm.weight",
                       "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
    formats = quantization if isinstance(quantization, dict) else {"default": quantization}
    for name, tensor in moe_tensors_as_llama_cpp(hf_model.state_dict(), config.model_type).items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            gguf_name = f"blk.{index}.{layer_names[rest]}"
        else:
            gguf_name = names[name]
        array = np.ascontiguousarray(tensor.detach().float().numpy())
        if arch == "gemma3" and name.endswith("norm.weight"):  # llama.cpp stores Gemma's norms as 1 + w
            array = array + 1.0
        if arch == "llama" and rest_is(name, "q_proj"):
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif arch == "llama" and rest_is(name, "k_proj"):
            array = llama_cpp_permute(array, config.num_key_value_heads)
        chosen = next((f for suffix, f in formats.items() if gguf_name.endswith(suffix)), formats["default"])
        qtype = gguf.GGMLQuantizationType[chosen]
        if array.ndim == 2 and chosen in RANDOM_BLOCK_SCALES:
            writer.add_tensor(gguf_name, random_k_blocks(chosen, *array.shape, seed=zlib.crc32(gguf_name.encode())), raw_dtype=qtype)
        elif array.ndim >= 2 and qtype != gguf.GGMLQuantizationType.F32 and not gguf_name.endswith(".bias"):
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_byte_level_vocab(writer, bos: int, eos: int) -> None:
    """The tiny byte-level tokenizer and its chat template as llama.cpp writes a GPT-2 style vocabulary."""
    tokens, merges = byte_level_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_chat_template(CHAT_TEMPLATE)


def moe_tensors_as_llama_cpp(state: dict, model_type: str = "qwen3_moe") -> dict:
    """A Qwen3-MoE state dict with each layer's fused gate/up experts (experts, 2 I, C) split into llama.cpp's
    separate gate and up expert tensors (ffn_gate_exps, ffn_up_exps); gpt-oss's (experts, C, 2 I) with gate
    and up interleaved, and its down (experts, I, C), as llama.cpp's converter writes them."""
    if model_type == "gpt_oss":
        return gpt_oss_tensors_as_llama_cpp(state)
    out = {}
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)
            base = name.removesuffix("gate_up_proj")
            out[base + "gate_proj"], out[base + "up_proj"] = gate, up
        else:
            out[name] = tensor
    return out


def gpt_oss_tensors_as_llama_cpp(state: dict) -> dict:
    out = {}
    for name, tensor in state.items():
        base, _, kind = name.rpartition(".experts.")
        if kind == "gate_up_proj":  # (E, C, 2I) -> gate, up (E, I, C)
            out[f"{base}.experts.gate_proj"] = tensor[:, :, 0::2].transpose(1, 2)
            out[f"{base}.experts.up_proj"] = tensor[:, :, 1::2].transpose(1, 2)
        elif kind == "gate_up_proj_bias":
            out[f"{base}.experts.gate_proj_bias"], out[f"{base}.experts.up_proj_bias"] = tensor[:, 0::2], tensor[:, 1::2]
        elif kind == "down_proj":  # (E, I, C) -> (E, C, I)
            out[f"{base}.experts.down_proj"] = tensor.transpose(1, 2)
        else:
            out[name] = tensor
    return out


SENTENCEPIECE_EOS, SENTENCEPIECE_BOS = 1, 2


def write_sentencepiece_vocab(writer) -> None:
    """A Gemma-style vocabulary of VOCAB entries (specials, 256 byte fallbacks, three pieces) as llama.cpp
    writes SentencePiece tokenizers: transformers rebuilds Gemma's tokenizer only from such a vocabulary.
    No chat template, as the Gemma 3 270M base model has none."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581", "\u2581t", "he"]
    assert len(tokens) == VOCAB
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 260 + [-1.0, -2.0, -3.0])
    writer.add_token_types([3, 3, 3, 2] + [6] * 256 + [1, 1, 1])  # control, unknown, byte, normal
    writer.add_bos_token_id(SENTENCEPIECE_BOS)
    writer.add_eos_token_id(SENTENCEPIECE_EOS)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)


def rest_is(name: str, projection: str) -> bool:
    return f".self_attn.{projection}." in name
