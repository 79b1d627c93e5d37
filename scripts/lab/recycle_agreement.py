"""How often the target's recycled candidates guess its next token (issue 76, measured before building on it),
teacher-forced on the target's own greedy answers, per Spec-Bench category.

For each answer, its rows are replayed in order through the recycle drafter's table (drafters/recycle.py):
at each position the table, as earlier rows left it, guesses the next token from the current one (top-1,
top-2), and a chain of top-1 successors is walked to count how many answer tokens it would have drafted in a
row; then the position's own row refreshes the table. "cold": the table starts empty for every answer;
"warm": it carries over from the answers before (a server's shared table after a few requests). The verify
cost of K + 1 rows, measured on the target, turns each chain length into a predicted speedup over plain
decoding for a drafter that costs nothing: (1 + E[min(L, K)]) / (forward(K + 1) / forward(1)).

    python scripts/lab/recycle_agreement.py   # the 1.5B's answers, 6 prose categories + code, 4 prompts, 128 tokens
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.models.forward_timing import forward_costs
from specdec.bench.tasks import load_prompts
from specdec.drafters.recycle import SuccessorTable
from specdec.models.base import positions_after

TASKS = "translation,qa,mt_bench,math_reasoning,summarization,rag,code"
MAX_CHAIN = 8


def answer_rows(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """(len(answer), V): the target's logits at each answer position, teacher-forced in one forward."""
    ids = torch.tensor([prompt + answer[:-1]])
    with torch.no_grad():
        out = model.forward(ids, positions_after(0, ids.shape[1], 1, "cpu"), model.new_cache(1, ids.shape[1]))
    return out.logits[0, len(prompt) - 1:].float()


def replay(table: SuccessorTable, inputs: list[int], answer: list[int], rows: torch.Tensor) -> dict[str, list]:
    """Per position: top-1/2/4/8 hits, and the chain's run of correct tokens (at most MAX_CHAIN)."""
    out = defaultdict(list)
    for t, (current, truth) in enumerate(zip(inputs, answer)):
        guesses = table.following(current, 8)
        for width in (1, 2, 4, 8):  # what a tree branching this wide at its first level could catch there
            out[f"top{width}"].append(truth in guesses[:width])
        run, token = 0, current
        while run < MAX_CHAIN and t + run < len(answer):
            following = table.following(token, 1)
            if not following or following[0] != answer[t + run]:
                break
            token, run = following[0], run + 1
        out["run"].append(run)
        table.update([current], rows[t:t + 1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--tasks", default=TASKS)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--successors", type=int, default=8)
    args = parser.parse_args()
    generator = SpeculativeGenerator.from_pretrained(args.target)  # the default drafter: greedy, exact
    model = generator.target.model
    costs = {c.num_tokens: c.ratio for c in forward_costs(model, sizes=tuple(range(1, MAX_CHAIN + 2)), repeats=15)}
    print("forward(T)/forward(1): " + ", ".join(f"T={t} {r:.2f}" for t, r in costs.items()), flush=True)
    warm = SuccessorTable(args.successors)
    results: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for prompt in load_prompts(args.tasks.split(","), args.limit):
        request = GenerationRequest(prompt=prompt.prompt, max_new_tokens=args.max_new_tokens, chat=prompt.chat)
        ids, answer = generator.prompt_ids(request), generator.run(request).token_ids
        rows = answer_rows(model, ids, answer)
        inputs = [ids[-1], *answer[:-1]]
        for mode, table in (("cold", SuccessorTable(args.successors)), ("warm", warm)):
            for key, values in replay(table, inputs, answer, rows).items():
                results[(prompt.task, mode)][key] += values
    print("| task | table | positions | top-1 | top-2 | top-4 | top-8 | E[run] | "
          + " | ".join(f"K={k}" for k in (1, 2, 3, 4, 6, 8)) + " |")
    for (task, mode), values in sorted(results.items()):
        runs = values["run"]
        mean = lambda xs: sum(xs) / len(xs)
        predicted = [(1 + mean([min(r, k) for r in runs])) / costs[k + 1] for k in (1, 2, 3, 4, 6, 8)]
        hits = " | ".join(f"{mean(values[f'top{width}']):.3f}" for width in (1, 2, 4, 8))
        print(f"| {task} | {mode} | {len(runs)} | {hits} | {mean(runs):.2f} | "
              + " | ".join(f"{p:.2f}x" for p in predicted) + " |", flush=True)


if __name__ == "__main__":
    main()
