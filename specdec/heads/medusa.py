"""Medusa heads (Cai et al. 2024): H small residual blocks on the target's last feature.

Head k maps the feature f_j (which the target's LM head turns into token j+1) to a feature whose LM-head
scores predict token j+1+k. They share the target's LM head (restricted to the draft vocabulary), so a
head is one C x C matrix: cheap to train and to run, but blind to which tokens were chosen in between,
so acceptance falls quickly with depth. Candidates are combined by a static tree of top-k choices.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class MedusaShape:
    num_heads: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class ResidualBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # starts as the identity: head k first predicts what f_j predicts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, shape: MedusaShape):
        super().__init__()
        self.shape = shape
        self.blocks = nn.ModuleList(ResidualBlock(hidden_size) for _ in range(shape.num_heads))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (H, ..., C): head k's predicted feature for token j+1+k."""
        return torch.stack([block(features) for block in self.blocks])
