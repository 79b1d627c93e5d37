"""How far can a drafter that runs no model go on a target? Tokens per round (tau) of model-free drafters,
replayed offline on the target's own greedy answers, so no speed is measured and none is needed:

- n-gram: the library's NgramDrafter (prompt and output lookup), as `--drafter ngram` runs it;
- recycling: Token Recycling (Luo et al. 2024): an adjacency table token -> the target's top-k next tokens
  the last time that token was its input, refreshed from every verified row, drafted as a small static
  tree (the rows of rejected branches are not replayed: their logits are unknown offline, so this slightly
  undercounts);
- n-gram, then recycling where lookup has nothing.

Greedy acceptance is the longest tree path that matches the true answer. With a verification of T rows
costing v(T) plain steps (`python -m specdec.bench.forward_cost`), a drafter reaches at most tau / v(T).

    python scripts/lab/lookup_ceiling.py --target smollm2-135m-instruct --tasks code,mt_bench,qa --limit 3
"""

from __future__ import annotations

import argparse

import torch

# Static tree shapes: each path is the ranks of the adjacency candidates taken from the root down.
SHAPES = {
    "chain3": [(0,), (0, 0), (0, 0, 0)],
    "tree4": [(0,), (1,), (0, 0), (0, 0, 0)],
    "tree6": [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 1)],
    "tree8": [(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0), (0, 1), (0, 0, 0, 0)],
}
TOP = 4  # adjacency candidates kept per token


def top_next_tokens(model, ids: list[int]) -> list[list[int]]:
    """(T, TOP) the target's top next tokens at every position of ids (one teacher-forced forward)."""
    from specdec.models.base import positions_after

    cache = model.new_cache(1, len(ids) + 1)
    tokens = torch.tensor([ids])  # (1, T)
    with torch.no_grad():
        out = model.forward(tokens, positions_after(0, len(ids), 1, tokens.device), cache)
    return out.logits[0].topk(TOP, dim=-1).indices.tolist()


def recycled_tree(adjacency: dict[int, list[int]], last: int, shape) -> tuple[list[int], list[int]]:
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, ...], int] = {}
    for path in shape:
        if len(path) > 1 and path[:-1] not in node_of:
            continue
        source = last if len(path) == 1 else tokens[node_of[path[:-1]]]
        candidates = adjacency.get(source, [])
        if path[-1] < len(candidates):
            node_of[path] = len(tokens)
            tokens.append(candidates[path[-1]])
            parents.append(-1 if len(path) == 1 else node_of[path[:-1]])
    return tokens, parents


def accepted_length(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    node, length = -1, 0
    while length < len(truth):
        match = [i for i, p in enumerate(parents) if p == node and tokens[i] == truth[length]]
        if not match:
            break
        node, length = match[0], length + 1
    return length


def replay(cases, use_ngram: bool, shape_name: str | None, max_draft: int, control_ids) -> float:
    """tau over all cases; the adjacency table carries over from answer to answer, as it would in a server."""
    from specdec.drafters.ngram import NgramDrafter
    from specdec.core.rounds import VerifyResult
    from specdec.core.sampling import SamplingParams

    params, adjacency = SamplingParams(), {}
    rounds = committed = 0
    for prompt, answer, top in cases:
        sequence = prompt + answer
        adjacency[sequence[len(prompt) - 1]] = top[len(prompt) - 1]  # the prefill's last row
        lookup = NgramDrafter(never_propose=control_ids)
        lookup.begin(prompt, params, len(sequence))
        done = 0
        while done < len(answer):
            context = sequence[: len(prompt) + done]
            draft = lookup.propose(context, max_draft, params, None) if use_ngram else None
            if draft is not None and draft.tokens:
                tokens, parents = draft.tokens, draft.parents
            elif shape_name is not None:
                tokens, parents = recycled_tree(adjacency, context[-1], SHAPES[shape_name])
            else:
                tokens, parents = [], []
            length = accepted_length(tokens, parents, answer[done:])
            for row in range(length + 1):  # the verified rows on the true path refresh the table
                position = len(prompt) + done - 1 + row
                adjacency[sequence[position]] = top[position]
            if draft is not None and draft.tokens:
                lookup.on_verified(sequence[: len(prompt) + done + length + 1], draft,
                                   VerifyResult(len(tokens), list(range(length)), answer[done: done + length + 1]))
            step = min(length + 1, len(answer) - done)
            done, rounds, committed = done + step, rounds + 1, committed + step
    return committed / rounds


def main() -> None:
    from specdec import SpeculativeGenerator
    from specdec.bench.tasks import load_prompts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--tasks", default="code,mt_bench,qa")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-draft", type=int, default=5, help="n-gram draft length")
    args = parser.parse_args()

    generator = SpeculativeGenerator.from_pretrained(args.target, drafter="none")
    cases = []
    for prompt in load_prompts(args.tasks.split(","), args.limit):
        ids = generator.encode(prompt.prompt, prompt.chat)
        answer = generator.generate(prompt.prompt, max_new_tokens=args.max_new_tokens, chat=prompt.chat).token_ids
        cases.append((ids, answer, top_next_tokens(generator.target.model, ids + answer)))
    control = generator.target.control_token_ids()
    print(f"{args.target}, {len(cases)} prompts ({args.tasks}, limit {args.limit}), greedy answers; tau:")
    print(f"  n-gram (draft <= {args.max_draft}): {replay(cases, True, None, args.max_draft, control):.3f}")
    for shape in SHAPES:
        alone = replay(cases, False, shape, args.max_draft, control)
        combined = replay(cases, True, shape, args.max_draft, control)
        print(f"  recycling {shape} ({len(SHAPES[shape])} nodes): {alone:.3f}; n-gram then recycling: {combined:.3f}")


if __name__ == "__main__":
    main()
