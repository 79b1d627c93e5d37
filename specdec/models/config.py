"""ModelConfig: the few numbers the native Llama-family decoder needs.

Built from a Hugging Face config.json dictionary. One decoder covers Llama 2/3/3.2,
SmolLM/SmolLM2, Qwen2/Qwen2.5, Qwen3 (dense and mixture-of-experts), Mistral, Gemma 3 and Phi-3/3.5/4-mini:
they differ only in the flags below (Phi-3's fused q/k/v and gate/up checkpoints, gpt-oss's 3-D experts, are split
at load: models/fused_checkpoints.py). gpt-oss adds attention sinks, a biased router whose softmax runs over the
picked experts only, biased experts with a clamped SwiGLU, and YaRN rope.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import UnsupportedModelError

NATIVE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "phi3", "gpt_oss")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}  # HF name -> ours
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 scaling only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope (Phi-3.5, Phi-4-mini): per-frequency divisors for contexts up to the original length, and the
    # scale of cos and sin. Only the short factors are used: as llama.cpp at a context of at most
    # original_max_position_embeddings (transformers switches to long_factor beyond it).
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0  # longrope and yarn: cos and sin scaled by it
    # yarn (gpt-oss): wavelengths between beta_fast and beta_slow rotations over the original context are
    # blended between interpolated (divided by factor) and kept; truncate rounds that band to whole dimensions
    # (transformers' default and llama.cpp's only way; gpt-oss's config turns it off)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # Rotate only the first rotary_dim dimensions of each head (Phi-4-mini: 3/4 of them); None: all
    rotary_dim: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: bias on q/k/v projections only
    o_bias: bool  # Llama's attention_bias also puts a bias on o_proj
    mlp_bias: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm over each head's queries and keys, before rope
    # -- Gemma 3 ------------------------------------------------------------------------------------------
    activation: str = "silu"  # of the gated feed-forward: "silu" or "gelu_tanh"
    norm_offset: bool = False  # RMSNorm scales by (1 + weight), computed in float32, as Gemma does
    sandwich_norms: bool = False  # norms after attention and around the feed-forward, on the residual branch
    embedding_scale: float | None = None  # token embeddings multiplied by this (Gemma: sqrt(hidden))
    query_scale: float | None = None  # attention scores scale when not 1/sqrt(head_dim) (query_pre_attn_scalar)
    final_logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    # Sliding-window attention: a token at position p sees keys at positions > p - sliding_window, on the
    # layers `sliding_layers` names; those layers use `local_rope` where it is set (Gemma 3: base 10k).
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    local_rope: RopeConfig | None = None
    # -- mixture of experts (Qwen3-MoE) ---------------------------------------------------------------------
    # On `moe_layers` the feed-forward is `num_experts` small ones (moe_intermediate_size wide) of which a
    # router picks `experts_per_token` a token, their outputs weighted by the router's softmax (renormalized
    # over the picked ones where norm_topk_prob).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()
    # -- gpt-oss ----------------------------------------------------------------------------------------------
    # The router has a bias and takes the softmax over the picked experts' logits only (Qwen3-MoE: over all of
    # them, then picks); the experts have biases and a clamped SwiGLU: (clamp(up, -limit, limit) + 1) *
    # g * sigmoid(alpha g), g = min(gate, limit); each head's attention has a learned sink logit in its softmax.
    router_bias: bool = False
    softmax_after_topk: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0
    attention_sinks: bool = False

    def dense(self) -> "ModelConfig":
        """The same widths as a dense model: no experts, sinks or gpt-oss's clamped SwiGLU (a draft head's layer,
        which is a plain Llama-style layer whatever its target)."""
        return dataclasses.replace(self, num_experts=0, experts_per_token=0, moe_intermediate_size=0,
                                   norm_topk_prob=False, moe_layers=(), router_bias=False, softmax_after_topk=False,
                                   swiglu_limit=None, swiglu_alpha=1.0, attention_sinks=False)

    @property
    def attention_depth(self) -> float:
        """The context depth at which a row's attention (scores and values over every earlier key: 4 x query
        width multiply-adds a key and layer) costs as much arithmetic as its products with the layer's
        weights (2 a weight): a row at depth d costs about 1 + d / attention_depth of a row at depth 0."""
        query, keys = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        weights = self.hidden_size * (2 * query + 2 * keys) + 3 * self.hidden_size * self.intermediate_size
        return weights / (2 * query)

    @property
    def runs_layer_plan(self) -> bool:
        """Whether the one-C-call path through the layers (models/layer_plan.py) computes this architecture:
        it has no step for Gemma's norms, GELU or scaled queries."""
        return not (self.norm_offset or self.sandwich_norms or self.activation != "silu"
                    or self.embedding_scale is not None or self.query_scale is not None)

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        activation = _native_activation(cfg, model_type)
        gemma = model_type == "gemma3_text"
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        head_dim = cfg.get("head_dim") or hidden // num_heads
        attention_bias = bool(cfg.get("attention_bias", False))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        num_layers = cfg["num_hidden_layers"]
        oss = model_type == "gpt_oss"
        window, sliding_layers = _sliding_from_hf(cfg, model_type, num_layers)
        query_scale = None
        if gemma and cfg.get("query_pre_attn_scalar", head_dim) != head_dim:
            query_scale = float(cfg["query_pre_attn_scalar"]) ** -0.5
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=oss or bool(cfg.get("mlp_bias", False)),  # gpt-oss: every feed-forward is biased experts
            rope=_rope_from_hf(cfg, "full_attention", head_dim),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
            activation=ACTIVATIONS[activation],
            norm_offset=gemma,
            sandwich_norms=gemma,
            embedding_scale=hidden ** 0.5 if gemma else None,
            query_scale=query_scale,
            final_logit_softcap=cfg.get("final_logit_softcapping") if gemma else None,
            sliding_window=int(window) if sliding_layers else None,
            sliding_layers=sliding_layers,
            local_rope=_rope_from_hf(cfg, "sliding_attention") if gemma else None,
            attention_sinks=oss,
            **_mixture_from_hf(cfg, model_type, num_layers),
        )


def _native_activation(cfg: dict[str, Any], model_type: str) -> str:
    """The feed-forward's activation name, once the native decoder is known to run this config; else
    UnsupportedModelError naming what it lacks."""
    if model_type not in NATIVE_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {model_type!r} has no native decoder (native: {', '.join(NATIVE_MODEL_TYPES)}); "
            "use backend='transformers' for other architectures"
        )
    activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if activation not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"activation {activation!r} is not supported natively (supported: {', '.join(ACTIVATIONS)})")
    if model_type == "qwen2" and cfg.get("use_sliding_window"):
        raise UnsupportedModelError("Qwen2 with use_sliding_window is not supported natively; "
                                    "use backend='transformers'")
    for unsupported in ("attn_logit_softcapping", "use_bidirectional_attention"):
        if cfg.get(unsupported):
            raise UnsupportedModelError(f"{unsupported}={cfg[unsupported]!r} is not supported natively")
    return activation


def _sliding_from_hf(cfg: dict[str, Any], model_type: str, num_layers: int) -> tuple[int | None, tuple[int, ...]]:
    """(the sliding window, the layers that use it); (None, ()) for full attention everywhere."""
    sliding = model_type in ("gemma3_text", "gpt_oss", "mistral", "phi3")
    window = cfg.get("sliding_window") if sliding else None
    if model_type == "phi3" and window and window >= cfg.get("max_position_embeddings", 4096):
        window = None  # Phi-3.5 / Phi-4-mini's 262144: no window within the context
    if not window:
        return None, ()
    # Gemma 3 names each layer's kind; Mistral's window (when set) applies to every layer
    kinds = cfg.get("layer_types") or ["sliding_attention"] * num_layers
    return window, tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")


def _mixture_from_hf(cfg: dict[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
    """ModelConfig's mixture-of-experts fields (none for a dense model)."""
    if model_type not in ("qwen3_moe", "gpt_oss"):
        return {}
    oss = model_type == "gpt_oss"
    # transformers 5 writes num_local_experts, the released configs num_experts
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if not experts:
        return {}
    sparse_step, dense_layers = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
    return dict(
        num_experts=experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
        # gpt-oss's experts are intermediate_size wide
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        moe_layers=tuple(i for i in range(num_layers) if i not in dense_layers and (i + 1) % sparse_step == 0),
        router_bias=oss,
        softmax_after_topk=oss,
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)) if oss else None,
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)) if oss else 1.0,
    )


def _rope_from_hf(cfg: dict[str, Any], layer_kind: str, head_dim: int | None = None) -> RopeConfig:
    # transformers 5.x keeps theta and scaling in `rope_parameters` (Gemma 3: one entry per layer kind,
    # "full_attention" and "sliding_attention"); 4.x in `rope_theta` + `rope_scaling` (Gemma 3:
    # `rope_local_base_freq` for the sliding layers). Accept both.
    params = dict(cfg.get("rope_parameters") or {})
    if layer_kind in params:
        params = dict(params[layer_kind] or {})
    elif layer_kind == "sliding_attention":  # 4.x Gemma 3: local layers take the local base, unscaled
        return RopeConfig(theta=float(cfg.get("rope_local_base_freq", 10000.0)))
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported natively (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * partial) if head_dim and partial != 1.0 else None
    if rotary_dim is not None and (rotary_dim % 2 or (head_dim - rotary_dim) % 2):
        raise UnsupportedModelError(f"partial rotary factor {partial} of {head_dim}-wide heads is not supported natively")
    original = int(params.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings") or 8192))
    attention_factor = 1.0
    if rope_type == "yarn":
        attention_factor = params.get("attention_factor") or _yarn_attention_factor(params, cfg, original)
    if rope_type == "longrope":
        attention_factor = params.get("attention_factor")
        if attention_factor is None:  # as transformers derives it from the context's extension
            factor = params.get("factor") or cfg.get("max_position_embeddings", original) / original
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor") or 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
        short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
        long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
        attention_factor=float(attention_factor),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        rotary_dim=rotary_dim,
    )


def _yarn_attention_factor(params: dict[str, Any], cfg: dict[str, Any], original: int) -> float:
    """YaRN's cos/sin scale where the config gives none, as transformers derives it: 0.1 ln(factor) + 1,
    or the ratio of two such terms where mscale and mscale_all_dim are both given."""
    factor = float(params.get("factor") or cfg.get("max_position_embeddings", original) / original)

    def mscale(scale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

    if params.get("mscale") and params.get("mscale_all_dim"):
        return mscale(float(params["mscale"])) / mscale(float(params["mscale_all_dim"]))
    return mscale(1.0)
