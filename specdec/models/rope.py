"""Rotary position embeddings, including Llama-3's frequency scaling."""

from __future__ import annotations

import math

import torch

from specdec.models.config import RopeConfig


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies on the CPU (callers move them), scaled as the checkpoint's rope_type
    says. Computed on the CPU even inside a meta-device context: on the meta device the division imported
    torch's compiler, seconds of every model load.

    With partial rotary (rope.rotary_dim < D) the frequencies of the rotary_dim / 2 rotated pairs come first
    and the rest are 0: angle 0, so cos 1 and sin 0 leave those dimensions as they are. The loader orders each
    head's query and key dimensions to match (models/fused_checkpoints.py: rotary_row_order)."""
    dim = rope.rotary_dim or head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    if rope.rope_type == "longrope":
        # as transformers: the divisor applied before the reciprocal
        inv_freq = 1.0 / (torch.tensor(rope.short_factor, dtype=torch.float32, device="cpu") * rope.theta ** exponents)
    else:
        inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        # Llama 3.1: long wavelengths are divided by `factor`, short ones kept,
        # and the band in between interpolated smoothly.
        old_context = rope.original_max_position_embeddings
        low_freq_wavelen = old_context / rope.low_freq_factor
        high_freq_wavelen = old_context / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    elif rope.rope_type == "yarn":
        inv_freq = _yarn_blend(rope.theta ** exponents, rope, dim)
    return torch.nn.functional.pad(inv_freq, (0, head_dim // 2 - inv_freq.shape[0]))


def _yarn_blend(wavelength_base: torch.Tensor, rope: RopeConfig, dim: int) -> torch.Tensor:
    """YaRN (as transformers' _compute_yarn_parameters): pairs that turn fewer than beta_slow times over the
    original context are interpolated (divided by factor), more than beta_fast times kept, and a linear ramp
    over the dimensions between blends the two."""
    def dimension(rotations: float) -> float:  # the pair index that turns `rotations` times over the context
        turns = rope.original_max_position_embeddings / (rotations * 2 * math.pi)
        return dim * math.log(turns) / (2 * math.log(rope.theta))

    low, high = dimension(rope.beta_fast), dimension(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # the share of the unscaled frequency
    return 1.0 / (rope.factor * wavelength_base) * (1 - kept) + 1.0 / wavelength_base * kept


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype,
                 attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, D) for positions (B, T); computed in float32 like transformers.
    `attention_factor` (longrope, yarn) scales both on the rotated dimensions only."""
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (B, T, D/2)
    angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)  # (B, 1, T, D)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        rotated = torch.cat([inv_freq, inv_freq]) != 0
        scale = torch.where(rotated, torch.tensor(attention_factor, dtype=torch.float32), torch.tensor(1.0))
        cos, sin = cos * scale.to(cos.device), sin * scale.to(cos.device)
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by the half-split convention used by Hugging Face checkpoints."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
