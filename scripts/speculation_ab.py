"""Interleaved A/B of drafters with their speculation lengths on bench prompts, decode time only (prefill
left out, so the drafters' differences are not diluted): `specdec bench` runs every drafter with one --k.
Each method starts each prompt from a fresh AdaptiveK (K 4); greedy output is checked against plain.

    python scripts/speculation_ab.py qwen2.5-coder-1.5b-instruct code 5 128 "quant:int4|auto:8" "quant:int4|auto"

Methods are "DRAFTER|K" (K: N, auto or auto:N), run in turn on each prompt after plain decoding.
"""

import statistics
import sys

from specdec.bench.tasks import load_prompts
from specdec.drafters import make_drafter
from specdec.api.generator import SpeculativeGenerator
from specdec.core.speculation_length import KSetting
from specdec.models.sources.loading import load_model


def main() -> None:
    target_name, tasks, limit, new_tokens = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    target = load_model(target_name)
    prompts = load_prompts(tasks, limit)
    methods: dict[str, tuple[SpeculativeGenerator, str | None]] = {"plain": (SpeculativeGenerator(target, None), None)}
    for method in sys.argv[5:]:
        spec, _, k = method.partition("|")
        methods[method] = (SpeculativeGenerator(target, make_drafter(spec, target, "cpu", "float32"), k or "auto"),
                           k or "auto")
    totals = {name: {"tokens": 0, "seconds": 0.0, "rounds": 0, "drafted": 0, "accepted": 0, "draft": 0.0,
                     "verify": 0.0, "ratios": []} for name in methods}
    for prompt in prompts:
        plain_rate, plain_ids = 0.0, None
        for name, (generator, k) in methods.items():
            if k is not None:
                generator.engine.speculation = KSetting.parse(k).new_length()  # fresh per prompt
            result = generator.generate(prompt.prompt, new_tokens, chat=prompt.chat, temperature=0.0, seed=0)
            s = result.stats
            decode = s.seconds - s.prefill_seconds
            total = totals[name]
            total["tokens"] += s.new_tokens
            total["seconds"] += decode
            total["rounds"] += s.rounds
            total["drafted"] += s.drafted
            total["accepted"] += s.accepted
            total["draft"] += s.draft_seconds or 0.0
            total["verify"] += s.verify_seconds or 0.0
            rate = s.new_tokens / decode
            if k is None:
                plain_rate, plain_ids = rate, result.token_ids
                print(f"{prompt.prompt_id} plain {rate:.2f} tok/s", flush=True)
                continue
            total["ratios"].append(rate / plain_rate)
            same = "" if result.token_ids == plain_ids else "  OUTPUT DIFFERS FROM PLAIN"
            print(f"{prompt.prompt_id} {name} {rate:.2f} tok/s ({rate / plain_rate:.2f}x) tau {s.tau:.2f} "
                  f"K {s.k_chosen}{same}", flush=True)
    plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    print(f"\nplain: {plain:.2f} tok/s (decode)")
    for name, total in totals.items():
        if name == "plain":
            continue
        rounds = max(total["rounds"], 1)
        rate = total["tokens"] / total["seconds"]
        print(f"{name}: {rate:.2f} tok/s, {rate / plain:.2f}x pooled (median {statistics.median(total['ratios']):.2f}x)"
              f", tau {total['tokens'] / rounds:.2f}, drafted a round {total['drafted'] / rounds:.2f}, accepted "
              f"{total['accepted'] / max(total['drafted'], 1):.3f}, draft + verify {1e3 * total['draft'] / rounds:.0f}"
              f" + {1e3 * total['verify'] / rounds:.0f} ms a round")


if __name__ == "__main__":
    main()
