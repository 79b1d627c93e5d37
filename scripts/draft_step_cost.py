"""One draft step of a self-draft against one step of its target, interleaved in one process (300-token context,
medians): the draft cost ratio c, and where the draft's bytes are (docs/benchmarks.md section 20).

    python scripts/draft_step_cost.py qwen2.5-coder-1.5b-instruct quant:int4 20
"""

import statistics
import sys
import time

import torch

from specdec.drafters import make_drafter
from specdec.models.base import positions_after
from specdec.models.loading import load_model

CONTEXT = 300


def module_megabytes(module: torch.nn.Module) -> float:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()]) / 1e6


def main() -> None:
    name, spec, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 20
    target = load_model(name)
    draft = make_drafter(spec, target, "cpu", "float32").model
    print(f"draft: layers {module_megabytes(draft.model.layers):.0f} MB, LM head {module_megabytes(draft.lm_head):.0f} MB")
    prompt = torch.randint(0, 1000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    caches = {}
    for label, model in (("draft", draft), ("target", target.model)):
        caches[label] = model.new_cache(1, CONTEXT + 8)
        model.forward(prompt, positions_after(0, CONTEXT, 1, "cpu"), caches[label], last_logits_only=True)
    hidden = torch.randn(1, 1, draft.config.hidden_size)
    times: dict[str, list[float]] = {"draft step": [], "draft LM head": [], "target step": []}
    for _ in range(rounds):
        for label, model in (("draft", draft), ("target", target.model)):
            start = time.perf_counter()
            model.forward(torch.tensor([[5]]), positions_after(CONTEXT, 1, 1, "cpu"), caches[label], last_logits_only=True)
            times[f"{label} step"].append(time.perf_counter() - start)
            caches[label].truncate(CONTEXT)
        start = time.perf_counter()
        draft.lm_head(hidden)
        times["draft LM head"].append(time.perf_counter() - start)
    median = {label: statistics.median(values) * 1e3 for label, values in times.items()}
    print(" | ".join(f"{label} {ms:.1f} ms" for label, ms in median.items()))
    print(f"c = {median['draft step'] / median['target step']:.3f}")


if __name__ == "__main__":
    main()
