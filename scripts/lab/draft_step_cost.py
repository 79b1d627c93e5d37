"""One step of each draft (self-drafts, draft models) against one step of their target, interleaved in one
process (300-token context, medians): the draft cost ratio c of each, and where a draft's bytes are
(docs/notes/benchmarks-diary-2026.md sections 20 and 27).

    python scripts/lab/draft_step_cost.py qwen2.5-coder-1.5b-instruct 20 quant:int4 [quant:gguf ...]
"""

import statistics
import sys
import time

import torch

from specdec.drafters import make_drafter
from specdec.drafters.base import module_bytes
from specdec.models.base import positions_after
from specdec.models.sources.loading import load_model

CONTEXT = 300


def main() -> None:
    name, rounds, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    target = load_model(name)
    models = {"target": target.model}
    for spec in specs:
        models[spec] = make_drafter(spec, target, "cpu", "float32").model
        print(f"{spec}: layers {module_bytes(models[spec].model.layers) / 1e6:.0f} MB, "
              f"LM head {module_bytes(models[spec].lm_head) / 1e6:.0f} MB")
    prompt = torch.randint(0, 1000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    caches = {}
    for label, model in models.items():
        caches[label] = model.new_cache(1, CONTEXT + 8)
        model.forward(prompt, positions_after(0, CONTEXT, 1, "cpu"), caches[label], last_logits_only=True)
    steps: dict[str, list[float]] = {label: [] for label in models}
    heads: dict[str, list[float]] = {label: [] for label in specs}
    for _ in range(rounds):
        for label, model in models.items():
            start = time.perf_counter()
            model.forward(torch.tensor([[5]]), positions_after(CONTEXT, 1, 1, "cpu"), caches[label], last_logits_only=True)
            steps[label].append(time.perf_counter() - start)
            caches[label].truncate(CONTEXT)
            if label in heads:
                start = time.perf_counter()
                model.lm_head(torch.randn(1, 1, model.config.hidden_size))
                heads[label].append(time.perf_counter() - start)
    target_ms = statistics.median(steps["target"]) * 1e3
    print(f"target step {target_ms:.1f} ms")
    for spec in specs:
        step_ms, head_ms = statistics.median(steps[spec]) * 1e3, statistics.median(heads[spec]) * 1e3
        print(f"{spec}: step {step_ms:.1f} ms (LM head {head_ms:.1f} ms), c = {step_ms / target_ms:.3f}")


if __name__ == "__main__":
    main()
