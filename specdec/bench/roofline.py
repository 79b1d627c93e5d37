"""The memory-bandwidth roofline for decoding.

A one-token decode step must read every weight once, so plain decoding cannot
beat bandwidth / (weight bytes read per token) tokens/s; speculation lifts that
ceiling to tau times it (tau tokens per weight pass). The bandwidth is measured
here, with a streaming read of a buffer far larger than the caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specdec.bench.timing import median_seconds


@dataclass
class Roofline:
    bandwidth_gb_s: float  # measured streaming read
    weight_bytes_per_token: int  # bytes of weights one decode step reads
    ceiling_tokens_per_second: float  # bandwidth / bytes per token

    def fraction(self, tokens_per_second: float, tau: float = 1.0) -> float:
        """Achieved share of the ceiling for this tau (1 for plain decoding)."""
        return tokens_per_second / (self.ceiling_tokens_per_second * tau)


def measure_bandwidth(buffer_mb: int = 1024, repeats: int = 5, device: str = "cpu") -> float:
    """GB/s of a streaming read (a sum over a float32 buffer, all threads), median of repeats."""
    buffer = torch.ones(buffer_mb * (1 << 20) // 4, dtype=torch.float32, device=device)
    seconds = median_seconds(lambda: buffer.sum(), repeats, device)
    return buffer.numel() * 4 / seconds / 1e9


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every matrix a token passes through, once, in its stored
    format (int8 panels count one byte a weight). An embedding table is read one row per token, unless
    it is the tied LM head (then the head reads all of it)."""
    module = model if isinstance(model, nn.Module) else model.weights_module()  # a CausalLM or a torch module
    if module is None:
        raise TypeError(f"cannot count the weights of {type(model).__name__}")
    total = 0
    counted: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        if isinstance(sub, nn.Embedding):
            continue  # one row per token, below, unless the head shares it
        for tensor in [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]:
            if tensor is not None and tensor.dtype != torch.bool and id(tensor) not in counted:
                counted[id(tensor)] = tensor
                total += tensor.numel() * tensor.element_size()
    shared = {t.data_ptr() for t in counted.values()}
    for sub in module.modules():
        if isinstance(sub, nn.Embedding) and sub.weight.data_ptr() not in shared:
            total += sub.weight.shape[1] * sub.weight.element_size()
    return total


def measure_roofline(model, buffer_mb: int = 1024, device: str = "cpu") -> Roofline:
    bandwidth = measure_bandwidth(buffer_mb, device=device)
    weight_bytes = weight_bytes_per_token(model)
    return Roofline(bandwidth, weight_bytes, bandwidth * 1e9 / weight_bytes)
