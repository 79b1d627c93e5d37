"""How batched rounds share draft rows, A/B in one process, interleaved: generate_batch with the draft planner
(batch_drafts.draft_caps: rows to the drafts most likely accepted, while they pay) against an even share of
the row budget, and plain batched decoding; the same prompts, two repetitions, greedy outputs compared.

    python scripts/lab/draft_planner_ab.py [--target smollm2-135m-instruct] [--prompts 32] [--batch 16]
"""

from __future__ import annotations

import argparse
import time

import specdec.core.batch_drafts as batch_drafts
from specdec.bench.tasks import load_prompts
from specdec.api.generator import SpeculativeGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    tasks = ["code", "mt_bench", "qa", "summarization"]
    prompts = [p.prompt for p in load_prompts(tasks, args.prompts // len(tasks) + 1)][:args.prompts]
    drafting = SpeculativeGenerator.from_pretrained(args.target, drafter=args.drafter, k="auto")
    plain = SpeculativeGenerator.from_pretrained(args.target, drafter="none")
    drafting.generate(prompts[0], 8)  # warm-up
    fit = batch_drafts.PassCost.fit

    def run(label: str, generator, planner: bool) -> list[list[int]]:
        batch_drafts.PassCost.fit = fit if planner else (lambda self: None)  # None: the even share
        started = time.perf_counter()
        results = generator.generate_batch(prompts, args.max_new_tokens, max_batch=args.batch)
        seconds = time.perf_counter() - started
        tokens = sum(len(r.token_ids) for r in results)
        drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
        print(f"| {label} | {args.batch} | {tokens / seconds:.1f} | {drafted} | {accepted} |", flush=True)
        return [r.token_ids for r in results]

    print("| mode | batch | tokens/s | drafted | accepted |\n|---|---|---|---|---|")
    for _ in range(2):
        outputs = [run(f"{args.drafter}, planner", drafting, True), run(f"{args.drafter}, even share", drafting, False),
                   run("plain", plain, True)]
        assert outputs[0] == outputs[1] == outputs[2], "greedy outputs differ"


if __name__ == "__main__":
    main()
