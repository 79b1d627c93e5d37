"""Where a decode step's time goes on a device: forward alone, a hand-written greedy loop, the engine's
plain decoding, and profiles (cProfile for Python, torch.profiler for operators) of the engine.

    python scripts/gpu_profile.py MODEL_DIR --device cuda --dtype bfloat16 --out DIR
"""

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from specdec.models.forward_timing import forward_costs  # noqa: E402
from specdec.models.forward_timing import synchronize  # noqa: E402
from specdec.api.generator import SpeculativeGenerator  # noqa: E402
from specdec.models.base import positions_after  # noqa: E402
from specdec.models.sources.loading import load_model  # noqa: E402

PROMPT = "def quicksort(items):\n    "


def hand_loop_ms(model, prompt_ids, steps: int, device) -> float:
    cache = model.new_cache(1, len(prompt_ids) + steps + 1)
    tokens = torch.tensor([prompt_ids], device=device)
    out = model.forward(tokens, positions_after(0, len(prompt_ids), 1, device), cache, last_logits_only=True)
    token = int(out.logits[0, -1].argmax())
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        out = model.forward(torch.tensor([[token]], device=device), positions_after(cache.length, 1, 1, device), cache)
        token = int(out.logits[0, -1].argmax())
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    out = Path(args.out)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    model = loaded.model
    plain = SpeculativeGenerator(loaded, None)
    plain.generate(PROMPT, 8, chat=False)  # warm up
    costs = forward_costs(model, 300, (1, 4), 20)
    print(f"forward T=1 {costs[0].seconds * 1e3:.2f} ms, T=4 {costs[1].seconds * 1e3:.2f} ms")
    ids = plain.encode(PROMPT, chat=False)
    print(f"hand-written greedy loop: {hand_loop_ms(model, ids, args.tokens, args.device):.2f} ms/token")
    synchronize(args.device)
    start = time.perf_counter()
    result = plain.generate(PROMPT, args.tokens, chat=False)
    seconds = time.perf_counter() - start
    print(f"engine plain decoding: {seconds / len(result.token_ids) * 1e3:.2f} ms/token "
          f"({len(result.token_ids)} tokens, prefill {result.stats.prefill_seconds * 1e3:.1f} ms)")
    graphs = getattr(model, "graphs", None)
    if graphs is not None:
        print(f"CUDA graph replays so far: {graphs.replays}")
        eager = load_model(args.model, device=args.device, dtype=args.dtype, cuda_graphs=False)
        eager_plain = SpeculativeGenerator(eager, None)
        eager_plain.generate(PROMPT, 8, chat=False)
        eager_costs = forward_costs(eager.model, 300, (1, 4), 20)
        synchronize(args.device)
        start = time.perf_counter()
        eager_result = eager_plain.generate(PROMPT, args.tokens, chat=False)
        eager_seconds = time.perf_counter() - start
        print(f"eager (no graphs): forward T=1 {eager_costs[0].seconds * 1e3:.2f} ms, T=4 "
              f"{eager_costs[1].seconds * 1e3:.2f} ms, engine plain decoding "
              f"{eager_seconds / len(eager_result.token_ids) * 1e3:.2f} ms/token")
        del eager, eager_plain

    profiler = cProfile.Profile()
    profiler.enable()
    plain.generate(PROMPT, args.tokens, chat=False)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    (out / "cprofile.txt").write_text(text.getvalue())
    print("\n".join(text.getvalue().splitlines()[:45]))

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(args.device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        plain.generate(PROMPT, 16, chat=False)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    (out / "torch_profile.txt").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
