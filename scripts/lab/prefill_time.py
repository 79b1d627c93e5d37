"""Time one prefill: `load_model(MODEL)`, one forward over TOKENS random tokens, median of 3 (docs/notes/benchmarks-diary-2026.md
section 19).

    python scripts/lab/prefill_time.py qwen2.5-coder-1.5b-instruct 1024
"""

import sys
import time

import torch

from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model


def main() -> None:
    name, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    model = load_model(name).model
    tokens = torch.randint(0, 1000, (1, count), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(3):
        cache = model.new_cache(1, count + 8)
        start = time.perf_counter()
        model.forward(tokens, positions_after(0, count, 1, "cpu"), cache, last_logits_only=True)
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[1]
    print(f"{name}: prefill of {count} tokens {seconds:.2f} s ({count / seconds:.0f} tokens/s)")


if __name__ == "__main__":
    main()
