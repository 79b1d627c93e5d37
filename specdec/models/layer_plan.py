"""A packed model's decoder layers as one C call (kernels/decoder_layers.cpp).

At decode and verification sizes a layer's arithmetic is a few kernel calls, and calling them one by one
from Python (ctypes conversions, output tensors, cache views) cost ~0.3 ms a layer here: a quarter of a
135M model's step. A `LayerPlan` records, once, every pointer those calls need (each fused projection's
buffers and format, each norm's weight) in a ctypes array; a forward then hands the whole span of layers to
`decoder_layers` in one call. The plan keeps the tensors it points to alive and is rebuilt when any layer
module or buffer is replaced (quantize_, a packed-weight cache, a copy with other layers).
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import torch
from torch import nn

from specdec.kernels import GGUF_LAYOUTS, grouped_bits
from specdec.kernels.ops import KV_TYPES, decoder_layers, decoder_layers_batch, mixture_of_experts
from specdec.models.kv_cache import KVCache
from specdec.models.quantized.packed_linear import PackedLinear

FLOAT32, INT8, INT4, INT7, GGUF, BF16, FP16 = range(7)  # decoder_layers.cpp's MatrixKind
FLOAT_KINDS = {torch.float32: FLOAT32, torch.bfloat16: BF16, torch.float16: FP16}


class PackedMatrix(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("gguf_layout", ctypes.c_int32), ("codes", ctypes.c_void_p),
                ("scales", ctypes.c_void_p), ("super_scales", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64), ("group", ctypes.c_int64),
                ("super_group", ctypes.c_int64)]


class MixtureWeights(ctypes.Structure):
    """A mixture-of-experts feed-forward (decoder_layers.cpp's MixtureWeights)."""
    _fields_ = [("router", PackedMatrix), ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p),
                ("num_experts", ctypes.c_int64), ("top_k", ctypes.c_int64), ("softmax_after_topk", ctypes.c_int32),
                ("normalize", ctypes.c_int32), ("limit", ctypes.c_float), ("alpha", ctypes.c_float),
                ("touched", ctypes.c_void_p)]


class LayerWeights(ctypes.Structure):
    _fields_ = [("qkv", PackedMatrix), ("o", PackedMatrix), ("gate_up", PackedMatrix), ("down", PackedMatrix),
                ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("input_eps", ctypes.c_float),
                ("post_eps", ctypes.c_float), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("qk_eps", ctypes.c_float), ("sinks", ctypes.c_void_p), ("mixture", ctypes.c_void_p),
                ("sliding", ctypes.c_int64)]


class Segment(ctypes.Structure):
    """One request's rows in a batched span (decoder_layers.cpp's Segment)."""
    _fields_ = [("key_cache", ctypes.c_void_p), ("value_cache", ctypes.c_void_p), ("layer_stride", ctypes.c_int64),
                ("head_stride", ctypes.c_int64), ("visible", ctypes.c_void_p), ("prefix", ctypes.c_int64),
                ("rows", ctypes.c_int64), ("start", ctypes.c_int64), ("kv_type", ctypes.c_int64),
                ("first_key", ctypes.c_void_p)]


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def describe(linear: PackedLinear) -> PackedMatrix | None:
    """The C description of a packed layer, or None for a layer the span kernel does not multiply."""
    if not isinstance(linear, PackedLinear) or linear.packed.device.type != "cpu" or not linear.packed.is_contiguous():
        return None
    packed, scales = linear.packed, linear.scales
    group = super_group = layout = 0
    if getattr(linear, "block_form", None) is not None:  # GgufLinear
        kind, form = GGUF, linear.block_form
        layout, group, super_group = GGUF_LAYOUTS[form["layout"]], form["group"], form["super_group"]
    elif packed.dtype in FLOAT_KINDS:
        kind = FLOAT_KINDS[packed.dtype]
    elif packed.dtype == torch.int8:
        kind = INT8
    else:
        kind = INT4 if grouped_bits(packed, linear.in_features) == 4 else INT7
        group = linear.in_features // scales.shape[1]
    if linear.bias is not None and (linear.bias.dtype != torch.float32 or not linear.bias.is_contiguous()):
        return None
    return PackedMatrix(kind, layout, packed.data_ptr(), _pointer(scales),
                        _pointer(getattr(linear, "super_scales", None)), _pointer(linear.bias),
                        linear.in_features, linear.out_features, group, super_group)


def _parts(layer: nn.Module) -> list:
    """What a layer's plan entry points into: the four packed projections (a mixture: its router and first
    expert's gate/up, which stand for its experts as in MixtureOfExperts.kernel_table), the two norms, the
    query/key norms (or None). Read through the modules' own dicts: nn.Module.__getattr__ made checking a plan
    cost 3 ms a forward."""
    attn, mlp = layer._modules["self_attn"]._modules, layer._modules["mlp"]._modules  # no fused ones: None
    if "experts" in mlp:
        feed_forward = [mlp.get("gate"), mlp["experts"][0]._modules.get("gate_up_proj")]
    else:
        feed_forward = [mlp.get("gate_up_proj"), mlp.get("down_proj")]
    return [attn.get("qkv_proj"), attn.get("o_proj"), *feed_forward, layer._modules["input_layernorm"],
            layer._modules["post_attention_layernorm"], attn.get("q_norm"), attn.get("k_norm")]


def _members(layer: nn.Module) -> list:
    """Every module and tensor a layer's entry was read from: the layer, its parts, their buffers and weights."""
    members = [layer]
    for part in _parts(layer):
        members.append(part)
        if part is not None:
            members.extend(part._buffers.values())
            members.extend(part._parameters.values())
    return members


def _signature(layer: nn.Module) -> tuple:
    return tuple(map(id, _members(layer)))


class LayerPlan:
    def __init__(self, layers: Sequence[nn.Module], entries: ctypes.Array, keep: list, touched: list):
        self.entries = entries
        self.keep = keep  # the mixtures' C structures the entries point to
        self.mixtures = {index: layer._modules["mlp"] for index, layer in enumerate(layers)
                         if "experts" in layer._modules["mlp"]._modules}  # layer index -> MixtureOfExperts
        self.touched = touched  # each mixture's distinct experts of the last run (c_int64 a layer)
        # the objects the entries point into, kept alive: a tensor replaced in a layer is not freed while the
        # plan exists, so no new object can take its id and pass for it in `matches`
        self.members = [_members(layer) for layer in layers]
        self.signatures = [tuple(map(id, members)) for members in self.members]

    @classmethod
    def build(cls, layers: Sequence[nn.Module], sliding: Sequence[int] = ()) -> "LayerPlan | None":
        """The plan of packed float32 layers on the CPU (`sliding`: the indices of sliding-window layers), or None
        where a layer cannot go through the kernel."""
        entries, keep = (LayerWeights * len(layers))(), []
        touched = [ctypes.c_int64(0) for _ in layers]
        for index, layer in enumerate(layers):
            parts = _parts(layer)
            matrices = [describe(module) for module in parts[:4]]
            if any(m is None for m in matrices):
                return None
            norms = [parts[4].weight, parts[5].weight] + [p.weight for p in parts[6:] if p is not None]
            sinks = layer._modules["self_attn"]._parameters.get("sinks")
            if any(not _plain_floats(w) for w in norms) or (sinks is not None and not _plain_floats(sinks)):
                return None
            mixture = None
            if "experts" in layer._modules["mlp"]._modules:
                mixture = _mixture_weights(layer._modules["mlp"], matrices[2], touched[index])
                if mixture is None:
                    return None
                keep.append(mixture)
            q_norm, k_norm = parts[6], parts[7]
            head_norms = (q_norm.weight.data_ptr(), k_norm.weight.data_ptr(), q_norm.eps) if q_norm is not None \
                else (None, None, 0.0)
            entries[index] = LayerWeights(
                *matrices, norms[0].data_ptr(), norms[1].data_ptr(), parts[4].eps, parts[5].eps, *head_norms,
                _pointer(sinks), None if mixture is None else ctypes.addressof(mixture[0]), int(index in sliding))
        return cls(layers, entries, keep, touched)

    def report_experts(self, first: int, stop: int) -> None:
        """The distinct experts each mixture of layers [first, stop) ran in the last call, into its `touched`
        (what MixtureOfExperts.forward records when it runs itself)."""
        for index, mixture in self.mixtures.items():
            if first <= index < stop:
                mixture.touched = self.touched[index].value

    def matches(self, layers: Sequence[nn.Module]) -> bool:
        """Whether every module and buffer the plan points into is still the one in `layers`."""
        return len(layers) == len(self.signatures) and all(
            _signature(layer) == known for layer, known in zip(layers, self.signatures))

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, first: int, stop: int,
            rows, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
        """Layers [first, stop) over x (1, T, C): a new tensor (x is left as it was). The new tokens' keys and
        values go to cache slots [cache.length, cache.length + T); `rows` (attention.RowAttention) says which
        cached keys each row sees, and on sliding-window layers from which slot on (rows.first_key); a
        attention.CausalBlock (visible None) runs a prefill block through the block kernel."""
        out = x.contiguous().clone()
        first_key = None if rows.first_key is None else torch.tensor(rows.first_key, dtype=torch.int64)
        keys, values = cache.keys[first, 0], cache.values[first, 0]  # (Hkv, S_max, D)
        entry = ctypes.addressof(self.entries) + first * ctypes.sizeof(LayerWeights)
        decoder_layers()(
            entry, stop - first, out.data_ptr(), cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(),
            cache.keys.stride(0), keys.stride(0), _pointer(rows.visible), rows.prefix, out.shape[1], heads,
            kv_heads, head_dim, cache.length, KV_TYPES[keys.dtype], _pointer(first_key), head_dim ** -0.5,
            torch.get_num_threads())
        self.report_experts(first, stop)
        return out


    def run_batch(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, parts: Sequence[tuple],
                  first: int, stop: int, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
        """Layers [first, stop) over several requests' rows at once: x (1, R, C), cos/sin (1, 1, R, D), the rows
        of `parts` = [(cache, rows (attention.RowAttention), count), ...] one after another. Each request's keys
        and values go to its own cache; each row computes what it computes in `run` for its request alone."""
        out = x.contiguous().clone()
        cos, sin = cos.contiguous(), sin.contiguous()  # held here: the C call reads them through raw pointers
        segments = (Segment * len(parts))()
        for index, (cache, rows, count) in enumerate(parts):
            keys, values = cache.keys[first, 0], cache.values[first, 0]  # (Hkv, S_max, D)
            segments[index] = Segment(keys.data_ptr(), values.data_ptr(), cache.keys.stride(0), keys.stride(0),
                                      rows.visible.data_ptr(), rows.prefix, count, cache.length,
                                      KV_TYPES[keys.dtype], None)
        entry = ctypes.addressof(self.entries) + first * ctypes.sizeof(LayerWeights)
        decoder_layers_batch()(
            entry, stop - first, out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            ctypes.addressof(segments), len(parts), heads, kv_heads, head_dim, head_dim ** -0.5,
            torch.get_num_threads())
        self.report_experts(first, stop)
        return out


def _plain_floats(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float32 and tensor.device.type == "cpu" and tensor.is_contiguous()


def _mixture_weights(mlp: nn.Module, router: PackedMatrix, touched: ctypes.c_int64) -> tuple | None:
    """(MixtureWeights, its ExpertTable) for a packed MixtureOfExperts, or None; its C call writes the
    distinct experts it ran to `touched`."""
    table = ExpertTable.of(mlp.experts)
    if table is None:
        return None
    weights = MixtureWeights(router, ctypes.addressof(table.gate_up), ctypes.addressof(table.down), table.count,
                             mlp.top_k, int(mlp.softmax_after_topk), int(mlp.normalize), table.limit, table.alpha,
                             ctypes.addressof(touched))
    return weights, table


def plan_applies(x: torch.Tensor, cache, rows) -> bool:
    """Whether a forward of x over `cache` attended as `rows` can go through a plan (see layer_plan)."""
    if rows is None or not rows.uses_kernel(x) or x.shape[0] != 1 or not isinstance(cache, KVCache):
        return False
    keys = cache.keys
    return keys.dtype in KV_TYPES and keys.shape[1] == 1 and keys.stride(-1) == 1 and \
        keys.stride(-2) == keys.shape[-1]


def layer_plan(owner: nn.Module, layers: Sequence[nn.Module], x: torch.Tensor, cache, rows,
               sliding: Sequence[int] = ()) -> LayerPlan | None:
    """The plan of `layers` (packed decoder layers of `owner`: a model, an EAGLE head) where the one-call path
    applies to this forward: float32 rows on the CPU attended row by row (`rows`, attention.RowAttention), batch
    1, a contiguous KV cache of float32, bf16 or fp16. Built on first use and rebuilt after the layers change; else None."""
    if not plan_applies(x, cache, rows):
        return None
    plan = owner.__dict__.get("_layer_plan")
    if plan is None or not plan.matches(layers):
        plan = LayerPlan.build(layers, sliding)
        owner.__dict__["_layer_plan"] = plan
    return plan


class ExpertTable:
    """A mixture's experts as one C call reads them (decoder_layers.cpp: mixture_of_experts): each expert's
    packed gate/up and down described once; the modules keep the tensors alive."""

    def __init__(self, gate_up: list[PackedMatrix], down: list[PackedMatrix], limit: float | None = None,
                 alpha: float = 1.0):
        self.count = len(gate_up)
        self.gate_up, self.down = (PackedMatrix * self.count)(*gate_up), (PackedMatrix * self.count)(*down)
        self.limit, self.alpha = limit or 0.0, alpha  # gpt-oss's clamped SwiGLU (limit 0: silu)

    @classmethod
    def of(cls, experts: nn.ModuleList) -> "ExpertTable | None":
        """The table of packed experts (models/llama.py's MLP), or None where one is not packed for the kernels."""
        gate_up = [describe(expert._modules.get("gate_up_proj")) for expert in experts]
        down = [describe(expert._modules.get("down_proj")) for expert in experts]
        if any(m is None for m in gate_up + down):
            return None
        return cls(gate_up, down, experts[0].limit, experts[0].alpha)

    def run(self, rows: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """rows (N, C) float32, experts (N, top_k) int64 and weights (N, top_k) float32 -> (N, C)."""
        rows, experts, weights = rows.contiguous(), experts.contiguous(), weights.float().contiguous()
        out = torch.empty_like(rows)
        mixture_of_experts()(self.gate_up, self.down, self.count, rows.data_ptr(), experts.data_ptr(),
                             weights.data_ptr(), out.data_ptr(), rows.shape[0], experts.shape[1], self.limit,
                             self.alpha, torch.get_num_threads())
        return out
