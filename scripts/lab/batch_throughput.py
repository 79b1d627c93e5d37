"""Batched rounds against one generation at a time, same prompts, same process (one interleaved run).

    python scripts/lab/batch_throughput.py [--target smollm2-135m-instruct] [--drafters none,ngram]
        [--batches 4,8,16] [--prompts 16] [--max-new-tokens 64] [--tasks code,mt_bench,...]

For each drafter: the prompts generated one after another (generate), then all of them with generate_batch
at each batch size; total generated tokens / wall seconds (prefills included), the draft tokens verified (a
batch's rows go to drafts only where the measured pass cost says they pay, so this varies with the machine's
load), and whether every output equals its one-at-a-time output (greedy).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from specdec.bench.tasks import load_prompts
from specdec.api.generator import SpeculativeGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafters", default="none,ngram")
    parser.add_argument("--batches", default="4,8,16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", default="auto")
    parser.add_argument("--tasks", default="code,mt_bench,qa,summarization,translation,rag,math_reasoning")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    prompts = [p.prompt for p in load_prompts(tasks, max(1, args.prompts // len(tasks) + 1))][: args.prompts]
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {len(prompts)} prompts, "
          f"{args.max_new_tokens} new tokens, greedy")
    print("| drafter | mode | tokens/s | vs one at a time | draft tokens verified | outputs equal |")
    print("|---|---|---|---|---|---|")
    for drafter in args.drafters.split(","):
        generator = SpeculativeGenerator.from_pretrained(args.target, drafter=drafter, k=args.k)
        generator.generate(prompts[0], 8)  # warm-up: kernels, caches
        started = time.perf_counter()
        alone = [generator.generate(p, args.max_new_tokens) for p in prompts]
        base = sum(len(r.token_ids) for r in alone) / (time.perf_counter() - started)
        drafted = sum(r.stats.drafted for r in alone)
        print(f"| {drafter} | one at a time | {base:.1f} | 1.00x | {drafted} | |", flush=True)
        for size in map(int, args.batches.split(",")):
            started = time.perf_counter()
            together = generator.generate_batch(prompts, args.max_new_tokens, max_batch=size)
            speed = sum(len(r.token_ids) for r in together) / (time.perf_counter() - started)
            equal = sum(a.token_ids == b.token_ids for a, b in zip(alone, together))
            drafted = sum(r.stats.drafted for r in together)
            print(f"| {drafter} | batch {size} | {speed:.1f} | {speed / base:.2f}x | {drafted} | "
                  f"{equal}/{len(prompts)} |", flush=True)


if __name__ == "__main__":
    main()
