"""The decoder's feed-forward: the gated MLP (SwiGLU, GELU, gpt-oss's clamped SwiGLU) and the mixture of
experts (Qwen3-MoE, gpt-oss), whose routing and sums are row-invariant on the CPU kernels."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels import packed_kernel
from specdec.models.config import ModelConfig
from specdec.models.layer_plan import ExpertTable


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, intermediate_size: int | None = None):
        super().__init__()
        c, width = config, intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(c.hidden_size, width, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, width, bias=c.mlp_bias)
        self.down_proj = nn.Linear(width, c.hidden_size, bias=c.mlp_bias)
        self.gate_up_proj = None  # gate and up fused into one packed layer by pack_weights()
        self.activation = c.activation
        self.limit, self.alpha = c.swiglu_limit, c.swiglu_alpha  # gpt-oss's clamped SwiGLU (limit None: plain)

    def pack_projections(self, packed: Callable[[str, list[nn.Linear]], nn.Module], prefix: str) -> None:
        self.gate_up_proj = packed(f"{prefix}.gate_up_proj", [self.gate_proj, self.up_proj])
        self.down_proj = packed(f"{prefix}.down_proj", [self.down_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x) if self.gate_up_proj is not None else (self.gate_proj(x), self.up_proj(x))
        if self.limit is not None:  # as transformers' GptOssExperts
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            return self.down_proj((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))
        gate = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
        return self.down_proj(gate * up)


class MixtureOfExperts(nn.Module):
    """Qwen3-MoE's and gpt-oss's sparse feed-forward: a router (`gate`, as Qwen3's checkpoints name it) scores
    the experts for each row, the top experts_per_token run on it, and their outputs are summed weighted by
    the router's softmax (Qwen3: over all experts; gpt-oss: over the picked ones). Each row's sum runs over
    its picks in rank order, and the router and experts are the kernels' row-count-invariant matmuls on the
    CPU: a row computes the same whichever rows share its pass, so a verification pass routes and sums each
    row exactly as one-token steps do. On the CPU's packed layers the layer plan runs all of it in C
    (decoder_layers.cpp: mixture)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=c.router_bias)
        self.experts = nn.ModuleList(MLP(c, c.moe_intermediate_size) for _ in range(c.num_experts))
        self.top_k, self.normalize = c.experts_per_token, c.norm_topk_prob
        self.softmax_after_topk = c.softmax_after_topk
        self.touched = 0  # distinct experts the last forward ran (stats: experts per pass)
        # (the first expert's packed gate/up, held so it cannot be replaced unnoticed; the C table of the packing)
        self.table: tuple[nn.Module | None, ExpertTable | None] | None = None

    def pack_projections(self, packed: Callable[[str, list[nn.Linear]], nn.Module], prefix: str) -> None:
        self.gate = packed(f"{prefix}.gate", [self.gate])
        for index, expert in enumerate(self.experts):
            expert.pack_projections(packed, f"{prefix}.experts.{index}")

    def route(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (N, top_k) in the rows' dtype, experts (N, top_k)) of rows (N, C), best first."""
        logits = self.gate(rows)
        if self.softmax_after_topk:
            top, experts = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(top, dim=-1).to(rows.dtype), experts
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probabilities, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(rows.dtype), experts

    def kernel_table(self, rows: torch.Tensor) -> ExpertTable | None:
        """The packed experts as one C call runs them (CPU float32 rows, every expert packed), else None."""
        if rows.device.type != "cpu" or rows.dtype != torch.float32 or packed_kernel() is None:
            return None
        packing = self.experts[0]._modules.get("gate_up_proj")  # pack_weights and copies replace the modules
        if self.table is None or self.table[0] is not packing:
            self.table = (packing, ExpertTable.of(self.experts))
        return self.table[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (N, C)
        weights, experts = self.route(rows)
        chosen = experts.unique().tolist()
        self.touched = len(chosen)
        table = self.kernel_table(rows)
        if table is not None:  # the same sums in C: no Python between an expert's two products
            return table.run(rows, experts, weights).reshape(x.shape)
        picked = rows.new_zeros(rows.shape[0], self.top_k, rows.shape[1])  # (N, top_k, C): each pick's output
        for expert in chosen:
            row, rank = (experts == expert).nonzero(as_tuple=True)  # the rows that picked it, grouped
            picked[row, rank] = self.experts[expert](rows[row]) * weights[row, rank].unsqueeze(-1)
        out = picked[:, 0]
        for rank in range(1, self.top_k):
            out = out + picked[:, rank]
        return out.reshape(x.shape)
