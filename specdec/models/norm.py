"""RMSNorm, as the Llama family normalizes (Gemma 3's (1 + w) scale with `offset`)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if offset else torch.ones(size))
        self.eps = eps
        self.offset = offset  # Gemma: the scale is (1 + weight), applied in float32 before the cast back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 (as transformers does) so bf16 weights stay accurate.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (x32 * (1.0 + self.weight.float())).type_as(x)
        return self.weight * x32.to(x.dtype)
