"""How far a two-byte KV cache moves greedy output from the float32 cache's: plain decoding of Spec-Bench
questions (the first `--per-category` of each category) with each KV cache type, token by token against
float32's: how many outputs are identical and how many tokens agree before the first difference.

    python scripts/lab/kv_dtype_agreement.py --target qwen2.5-coder-1.5b-instruct --per-category 2
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

from specdec.api.generator import SpeculativeGenerator

QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"


def questions(path: Path, per_category: int) -> list[str]:
    taken: dict[str, list[str]] = defaultdict(list)
    for line in path.read_text().splitlines():
        item = json.loads(line)
        if len(taken[item["category"]]) < per_category:
            taken[item["category"]].append(item["turns"][0])
    return [prompt for prompts in taken.values() for prompt in prompts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--kv-dtypes", nargs="+", default=["bfloat16", "float16"])
    args = parser.parse_args()
    prompts = questions(args.questions, args.per_category)
    outputs = {}
    for kv_dtype in ["float32", *args.kv_dtypes]:
        generator = SpeculativeGenerator.from_pretrained(args.target, drafter="none", kv_dtype=kv_dtype)
        outputs[kv_dtype] = [generator.generate(prompt, args.max_new_tokens).token_ids for prompt in prompts]
    print(f"{args.target}, {len(prompts)} Spec-Bench questions, greedy, {args.max_new_tokens} new tokens")
    print("| KV cache | outputs identical to float32's | mean tokens before the first difference |")
    print("|---|---|---|")
    for kv_dtype in args.kv_dtypes:
        same, agreeing = 0, []
        for ours, reference in zip(outputs[kv_dtype], outputs["float32"]):
            same += ours == reference
            agreeing.append(next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b),
                                 min(len(ours), len(reference))))
        print(f"| {kv_dtype} | {same} of {len(prompts)} | {sum(agreeing) / len(agreeing):.0f} |")


if __name__ == "__main__":
    main()
