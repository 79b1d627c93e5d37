"""Checkpoints whose projections are stored fused (Phi-3: q/k/v as one `qkv_proj`, gate/up as one
`gate_up_proj`; a mixture's experts as one 3-D tensor; gpt-oss's experts transposed, gate and up
interleaved), split into the separate projections the native decoder names; and the order of query and key
rows that partial rotary needs.

Partial rotary (Phi-4-mini rotates 96 of each head's 128 dimensions, pairing i with i + 48) is computed
with the half-split rope over the whole head (rope.py pairs i with i + D/2): each head's query and key rows
are reordered so that the rotated pairs land D/2 apart and the dimensions left alone fill the rest, where
the rope tables hold angle 0. Queries and keys are reordered alike, so every attention score is the same
sum in another order; values and o_proj are untouched.
"""

from __future__ import annotations

import torch

from specdec.models.config import ModelConfig

# fused projection -> the projections it stacks, in row order
FUSED_PROJECTIONS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def fused_split_sizes(config: ModelConfig, fused: str) -> list[int]:
    """Rows of each projection a fused matrix stacks (FUSED_PROJECTIONS order)."""
    if fused == "self_attn.qkv_proj":
        keys = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, keys, keys]
    return [config.intermediate_size, config.intermediate_size]


def rotary_row_order(num_heads: int, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """(num_heads * head_dim,) int64: the checkpoint row that each row of a query or key projection takes
    (module docstring): per head, the first halves of the rotated pairs, half the unrotated dimensions, the
    second halves of the pairs, the other half of the unrotated ones."""
    half, rest = rotary_dim // 2, (head_dim - rotary_dim) // 2
    one_head = torch.cat([torch.arange(half), rotary_dim + torch.arange(rest),
                          half + torch.arange(half), rotary_dim + rest + torch.arange(rest)])
    return (torch.arange(num_heads).unsqueeze(1) * head_dim + one_head).reshape(-1)


def qkv_row_order(config: ModelConfig) -> torch.Tensor | None:
    """The row order of a fused q/k/v matrix under partial rotary (queries, keys reordered; values kept), or
    None where every dimension rotates."""
    rotary = config.rope.rotary_dim
    if rotary is None or rotary == config.head_dim:
        return None
    queries, keys, values = fused_split_sizes(config, "self_attn.qkv_proj")
    return torch.cat([rotary_row_order(config.num_heads, config.head_dim, rotary),
                      queries + rotary_row_order(config.num_kv_heads, config.head_dim, rotary),
                      queries + keys + torch.arange(values)])


def split_fused_projections(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with fused projections split into the projections they stack and, under
    partial rotary, query/key rows in rotary_row_order. Other tensors pass through as they are."""
    if config.model_type == "gpt_oss":
        return split_gpt_oss_experts(state)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".mlp.experts." in name and tensor.dim() == 3:
            out.update(split_experts(name, tensor))
            continue
        prefix, _, kind = name.rpartition(".")  # kind: weight or bias
        fused = next((f for f in FUSED_PROJECTIONS if prefix.endswith(f)), None)
        if fused is None:
            rotary = config.rope.rotary_dim
            heads = {"self_attn.q_proj": config.num_heads, "self_attn.k_proj": config.num_kv_heads}
            separate = next((heads[p] for p in heads if prefix.endswith(p)), None)
            if rotary is not None and separate is not None:  # a checkpoint with separate q/k under partial rotary
                tensor = tensor[rotary_row_order(separate, config.head_dim, rotary)]
            out[name] = tensor
            continue
        if fused == "self_attn.qkv_proj" and (order := qkv_row_order(config)) is not None:
            tensor = tensor[order]
        base = prefix[: -len(fused)]
        block = fused.split(".")[0]
        for part, piece in zip(FUSED_PROJECTIONS[fused], tensor.split(fused_split_sizes(config, fused))):
            out[f"{base}{block}.{part}.{kind}"] = piece.contiguous()
    return out


def split_experts(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """A mixture's experts stored as one (experts, rows, inputs) tensor (transformers' in-memory
    `mlp.experts.gate_up_proj` / `down_proj`, a GGUF file's gate, up and down) as each expert's matrices."""
    base, _, kind = name.rpartition(".experts.")
    kind = kind.removesuffix(".weight")
    out = {}
    for index, matrix in enumerate(tensor):
        if kind == "gate_up_proj":
            gate, up = matrix.chunk(2)
            out[f"{base}.experts.{index}.gate_proj.weight"] = gate.contiguous()
            out[f"{base}.experts.{index}.up_proj.weight"] = up.contiguous()
        else:
            out[f"{base}.experts.{index}.{kind}.weight"] = matrix.contiguous()
    return out


# gpt-oss's checkpoint names for the mixture -> ours (MixtureOfExperts: the router is `gate`)
_GPT_OSS_ROUTER = {"mlp.router.weight": "mlp.gate.weight", "mlp.router.bias": "mlp.gate.bias"}


def split_gpt_oss_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss's checkpoint layout -> the native decoder's: the router renamed, and each layer's experts,
    stored as `gate_up_proj` (experts, inputs, 2 I) with gate and up in alternate columns, its bias (experts,
    2 I), `down_proj` (experts, I, outputs) and its bias, as each expert's gate/up/down weights (outputs,
    inputs) and biases. Other tensors pass through."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        base, _, rest = name.partition(".mlp.")
        if f"mlp.{rest}" in _GPT_OSS_ROUTER:
            out[f"{base}.{_GPT_OSS_ROUTER['mlp.' + rest]}"] = tensor
        elif rest.startswith("experts."):
            kind = rest.removeprefix("experts.")
            for index, matrix in enumerate(tensor):
                prefix = f"{base}.mlp.experts.{index}"
                if kind == "gate_up_proj":  # (inputs, 2 I) -> gate (I, inputs) and up
                    out[f"{prefix}.gate_proj.weight"] = matrix[:, 0::2].t().contiguous()
                    out[f"{prefix}.up_proj.weight"] = matrix[:, 1::2].t().contiguous()
                elif kind == "gate_up_proj_bias":
                    out[f"{prefix}.gate_proj.bias"] = matrix[0::2].contiguous()
                    out[f"{prefix}.up_proj.bias"] = matrix[1::2].contiguous()
                elif kind == "down_proj":
                    out[f"{prefix}.down_proj.weight"] = matrix.t().contiguous()
                else:  # down_proj_bias
                    out[f"{prefix}.down_proj.bias"] = matrix.contiguous()
        else:
            out[name] = tensor
    return out


def gpt_oss_checkpoint_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A GGUF file's gpt-oss tensors (models/sources/gguf_convert.py names them: the router as `mlp.gate`, the
    experts' gate, up and down as (experts, outputs, inputs) `mlp.experts.{gate,up,down}_proj` with
    `..._bias` (experts, outputs)) in the checkpoint layout transformers reads and split_gpt_oss_experts
    splits: gate and up in alternate columns of one transposed tensor."""
    out: dict[str, torch.Tensor] = {}
    router = {ours: theirs for theirs, ours in _GPT_OSS_ROUTER.items()}
    for name, tensor in state.items():
        base, _, rest = name.partition(".mlp.")
        if f"mlp.{rest}" in router:
            out[f"{base}.{router['mlp.' + rest]}"] = tensor
        elif rest in ("experts.gate_proj", "experts.gate_proj_bias"):
            up = state[f"{base}.mlp.{rest.replace('gate_proj', 'up_proj')}"]
            pair = torch.stack([tensor, up], dim=2)  # (experts, I, 2[, inputs]): gate then up for each output
            if rest == "experts.gate_proj":  # -> (experts, inputs, 2 I)
                out[f"{base}.mlp.experts.gate_up_proj"] = pair.flatten(1, 2).transpose(1, 2).contiguous()
            else:
                out[f"{base}.mlp.experts.gate_up_proj_bias"] = pair.flatten(1, 2).contiguous()
        elif rest == "experts.down_proj":
            out[f"{base}.mlp.experts.down_proj"] = tensor.transpose(1, 2).contiguous()
        elif rest not in ("experts.up_proj", "experts.up_proj_bias"):
            out[name] = tensor  # down_proj_bias (experts, outputs) is stored as it is
    return out
