"""Cost of one target forward over T new tokens at a given context, relative to T = 1: what verifying K
drafts costs (forward(K + 1)) against plain decoding's forward(1) per token. Timed here for the benchmarks
(bench/forward_cost.py) and for `--drafter auto`'s calibration (specdec.pairing)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from specdec.models.base import CausalLM, positions_after


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (timings on a GPU would otherwise measure the launch only)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


WARMUP = 2  # forwards per size and model before timing


@dataclass
class ForwardCost:
    num_tokens: int
    seconds: float  # median
    ratio: float  # seconds / seconds at 1 token


def forward_costs(model: CausalLM, context: int = 300, sizes=(1, 2, 4, 8, 16), repeats: int = 10) -> list[ForwardCost]:
    return interleaved_forward_costs({"": model}, context, sizes, repeats)[""]


def interleaved_forward_costs(models: dict[str, CausalLM], context: int = 300, sizes=(1, 2, 4, 8, 16),
                              repeats: int = 10) -> dict[str, list[ForwardCost]]:
    """forward_costs of several models (runtimes of one model, say) timed in turns, one forward each per turn:
    the machine's drifting memory speed then moves them all alike, and their ratios hold."""
    gen = torch.Generator().manual_seed(0)
    some = next(iter(models.values()))
    prefix = torch.randint(0, some.vocab_size, (1, context), generator=gen).to(some.device)
    caches = {}
    for label, model in models.items():
        caches[label] = model.new_cache(1, context + max(sizes))
        model.forward(prefix, positions_after(0, context, 1, model.device), caches[label], last_logits_only=True)
    times: dict[tuple[str, int], list[float]] = {(label, size): [] for label in models for size in sizes}
    inputs = {size: (torch.randint(0, some.vocab_size, (1, size), generator=gen).to(some.device),
                     positions_after(context, size, 1, some.device)) for size in sizes}
    for turn in range(WARMUP + repeats):
        for size in sizes:
            for label, model in models.items():
                tokens, positions = inputs[size]
                start = time.perf_counter()
                model.forward(tokens, positions, caches[label])
                synchronize(model.device)
                if turn >= WARMUP:
                    times[label, size].append(time.perf_counter() - start)
                caches[label].truncate(context)
    costs = {}
    for label in models:
        base = statistics.median(times[label, sizes[0]])
        costs[label] = [ForwardCost(size, statistics.median(times[label, size]),
                                    statistics.median(times[label, size]) / base) for size in sizes]
    return costs
