"""The kernels' operations on torch tensors: each passes pointers to the selected build
(`build.packed_kernel()`). Callers check that a build exists (models fall back to torch where none does).
Every C function is declared here, next to its wrapper: its source, its name and its argument types."""

from __future__ import annotations

from ctypes import c_float, c_int, c_int32, c_int64, c_void_p

import torch

from specdec.kernels.build import declare
from specdec.kernels.layouts import GGUF_LAYOUTS, PANEL, grouped_bits

P, I64 = c_void_p, c_int64  # a pointer, a size
_MATMUL_FLOAT = (P, P, P, I64, I64, I64, c_int)  # x, panels, y, rows, cols, outputs, threads
_packed_matmul = {torch.float32: declare("packed_matmul.cpp", "packed_matmul_f32", *_MATMUL_FLOAT),
                  torch.bfloat16: declare("packed_matmul.cpp", "packed_matmul_bf16", *_MATMUL_FLOAT),
                  torch.float16: declare("packed_matmul.cpp", "packed_matmul_f16", *_MATMUL_FLOAT)}
_packed_matmul_q8 = declare("packed_matmul.cpp", "packed_matmul_q8", P, P, P, P, I64, I64, I64, c_int)
_INTEGER = (P, P, P, P, I64, I64, I64, I64, c_int)  # x, codes, scales, y, rows, cols, outputs, group, threads
_int4_matmul = declare("integer_matmul.cpp", "int4_matmul", *_INTEGER)
_int7_matmul = declare("integer_matmul.cpp", "int7_matmul", *_INTEGER)
_gguf_matmul = declare("gguf_matmul.cpp", "gguf_matmul", P, P, P, P, P, I64, I64, I64, c_int32, I64, I64, c_int)
_attention_rows = declare("attention.cpp", "attention_rows", P, P, P, P, P, *[I64] * 7, c_float, P, c_int, c_int)
_attention_block = declare("block_attention.cpp", "attention_block", *[P] * 4, *[I64] * 6, c_float, P, c_int, c_int)
_add_rms_norm = declare("layer_ops.cpp", "add_rms_norm", P, P, P, P, P, I64, I64, c_float)
_rope_qkv_to_cache = declare("layer_ops.cpp", "rope_qkv_to_cache", *[P] * 6, *[I64] * 6, c_int)
_silu_mul = declare("layer_ops.cpp", "silu_mul", P, P, I64, I64)
# The KV cache element types the kernels read and write (vector_math.h's KvType): a two-byte cache is widened
# to float32 exactly as it is read, and written rounded to nearest even, as torch rounds.
KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# A span of decoder layers in one call (models/layer_plan.py builds the arguments): one request, and a batch.
decoder_layers = declare("decoder_layers.cpp", "decoder_layers", P, I64, *[P] * 5, I64, I64, P, *[I64] * 7, P,
                         c_float, c_int)
decoder_layers_batch = declare("decoder_layers.cpp", "decoder_layers_batch", P, I64, *[P] * 4, *[I64] * 4,
                               c_float, c_int)
# A mixture's feed-forward over rows in one call: experts' gate/up and down descriptions, rows, picks, weights
mixture_of_experts = declare("decoder_layers.cpp", "mixture_of_experts", P, P, I64, P, P, P, P, I64, I64, c_float,
                             c_float, c_int)


# Up to here a forward's rows attend row by row (llama.ROW_BY_ROW_MAX) and its layers run in one C call
# (models/layer_plan.py): decoding and verification, trees of 24+ nodes included. Int8 panels take their kernel
# up to here too; above, they are dequantized for the call (prefill is compute-bound, widening int8 is not free).
SMALL_ROWS = 64


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ packed (P, K, 16) float32, bfloat16 or float16 panels -> (T, out_features),
    any T.

    The kernel's rows round the same at any T (plain and speculative decoding agree bit for bit), and it
    serves prefill too: the panels are the layout a GEMM packs its right-hand side into, and it measured
    faster at prefill sizes than torch's batched matmul over the panels or its GEMM over an unpacked matrix.
    Two-byte panels are widened to float32 in registers: the same result as float32 panels of their values.
    """
    rows, cols = x.shape
    kernel = _packed_matmul[packed.dtype]()
    y = torch.empty(rows, out_features, dtype=torch.float32)
    kernel(x.data_ptr(), packed.data_ptr(), y.data_ptr(), rows, cols, out_features, torch.get_num_threads())
    return y


def packed_matmul_int8(x: torch.Tensor, quantized: torch.Tensor, scales: torch.Tensor,
                       out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ int8 panels (P, K, 16) with per-column scales -> (T, out_features).

    Up to SMALL_ROWS rows the int8 kernel (batch-invariant), more rows (prefill, a draft model catching up)
    float32 panels dequantized for this call (compute-bound there, the copy is cheap)."""
    rows, cols = x.shape
    if rows > SMALL_ROWS:  # float32 panels for this call, then the float32 kernel
        return packed_matmul(x, quantized.to(torch.float32).mul_(scales.view(-1, 1, PANEL)), out_features)
    y = torch.empty(rows, out_features, dtype=torch.float32)
    _packed_matmul_q8()(x.data_ptr(), quantized.data_ptr(), scales.data_ptr(), y.data_ptr(), rows, cols,
                        out_features, torch.get_num_threads())
    return y


def integer_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ 4-bit or 7-bit grouped codes -> (T, out_features), any T
    (integer_matmul.cpp: activations quantized to int8 per block of 32, integer dot products)."""
    rows, cols = x.shape
    group_size = cols // scales.shape[1]
    y = torch.empty(rows, out_features, dtype=torch.float32)
    kernel = (_int4_matmul if grouped_bits(packed, cols) == 4 else _int7_matmul)()
    kernel(x.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), rows, cols, out_features, group_size,
           torch.get_num_threads())
    return y


def gguf_matmul(x: torch.Tensor, codes: torch.Tensor, group_codes: torch.Tensor, super_scales: torch.Tensor,
                out_features: int, layout: str, group: int, super_group: int) -> torch.Tensor:
    """(T, K) float32 contiguous @ a matrix in llama.cpp's block form (models/quantized/gguf_blocks.py) -> (T, N),
    any T (gguf_matmul.cpp: activations quantized to int8 per super-block of 32 or 256, integer dot products)."""
    rows, cols = x.shape
    y = torch.empty(rows, out_features, dtype=torch.float32)
    _gguf_matmul()(x.data_ptr(), codes.data_ptr(), group_codes.data_ptr(), super_scales.data_ptr(), y.data_ptr(),
                   rows, cols, out_features, GGUF_LAYOUTS[layout], group, super_group, torch.get_num_threads())
    return y


def attention_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                   prefix: int, scale: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (1, H, T, D), the cache's keys/values views (1, Hkv, prefix + W, D; float32, bf16 or fp16), visible
    (T, W) uint8: which of the keys after the shared `prefix` each row sees -> (1, T, H * D) float32: each row's
    attention as its own one-token step computes it (attention.cpp). Scores are scaled by `scale` (None:
    1/sqrt(D)); sinks (H,): each head's sink logit (gpt-oss), None: none."""
    _, heads, rows, dim = q.shape
    q = q.contiguous()
    if sinks is not None:
        sinks = sinks.detach().to(torch.float32).contiguous()
    out = torch.empty(1, rows, heads * dim, dtype=torch.float32)
    _attention_rows()(q.data_ptr(), keys.data_ptr(), values.data_ptr(), visible.data_ptr(), out.data_ptr(), rows,
                      heads, keys.shape[1], dim, prefix, visible.shape[1], keys.stride(1),
                      dim ** -0.5 if scale is None else scale, None if sinks is None else sinks.data_ptr(),
                      KV_TYPES[keys.dtype], torch.get_num_threads())
    return out


def attention_block(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (1, H, T, D) of a prefill block after `start` cached tokens (D a multiple of 8), the cache's keys/values
    views (1, Hkv, >= start + T, D; float32, bf16 or fp16) holding the block's own at [start, start + T) ->
    (1, T, H * D) float32: row t attends to keys [0, start + t], each row's arithmetic its own whatever rows
    share the call (block_attention.cpp). `scale` None: 1/sqrt(D); sinks (H,): each head's sink logit."""
    _, heads, rows, dim = q.shape
    q = q.contiguous()
    if sinks is not None:
        sinks = sinks.detach().to(torch.float32).contiguous()
    out = torch.empty(1, rows, heads * dim, dtype=torch.float32)
    _attention_block()(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), rows, heads, keys.shape[1],
                       dim, start, keys.stride(1), dim ** -0.5 if scale is None else scale,
                       None if sinks is None else sinks.data_ptr(), KV_TYPES[keys.dtype], torch.get_num_threads())
    return out


# -- the steps between a layer's matmuls (layer_ops.cpp): float32, contiguous, batch 1 -------------------
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., C) [+ residual (..., C)] -> (the sum, or x itself; RMSNorm of it times weight)."""
    rows, size = x.numel() // x.shape[-1], x.shape[-1]
    total = x if residual is None else torch.empty_like(x)
    normed = torch.empty_like(x)
    _add_rms_norm()(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
                    total.data_ptr(), normed.data_ptr(), rows, size, eps)
    return total, normed


def rope_qkv_to_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, heads: int, kv_heads: int, start: int) -> torch.Tensor:
    """Fused q/k/v rows (1, T, (H + 2 Hkv) D) and rope tables (1, 1, T, D) -> queries (1, H, T, D); the
    rotated keys and the values go to one layer of the cache, key_cache/value_cache (Hkv, S_max, D; float32,
    bf16 or fp16), at slots [start, start + T)."""
    rows, dim = qkv.shape[1], cos.shape[-1]
    q = torch.empty(1, heads, rows, dim, dtype=torch.float32)
    _rope_qkv_to_cache()(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), key_cache.data_ptr(),
                         value_cache.data_ptr(), rows, heads, kv_heads, dim, start, key_cache.stride(0),
                         KV_TYPES[key_cache.dtype])
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Fused gate/up rows (..., 2 I) -> silu(gate) * up (..., I)."""
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=torch.float32)
    _silu_mul()(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * width), width)
    return out
