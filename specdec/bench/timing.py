"""Timing helpers shared by the benchmarks: medians of repeated, synchronized runs."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from specdec.models.forward_timing import synchronize


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu", warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
