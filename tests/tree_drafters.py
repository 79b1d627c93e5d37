"""Tree drafters for tests: they exercise tree verification and cache compaction before the real
tree drafters (Medusa, EAGLE) exist."""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch

from specdec.drafters.base import Drafter
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams, processed_probs, sample


class RandomTreeDrafter(Drafter):
    """`branching[d]` children per node at depth d, drawn from a draft model's distribution: either its
    top tokens (deterministic: one-hot draft_probs) or independent samples (draft_probs = that law)."""

    def __init__(self, next_logits: Callable[[tuple[int, ...]], torch.Tensor], branching: Sequence[int],
                 sampled: bool, seed: int = 0):
        self.name = "random-tree"
        self.next_logits, self.branching, self.sampled = next_logits, list(branching), sampled
        self.generator = torch.Generator().manual_seed(seed)  # siblings are independent draws, not one per position

    def begin(self, prompt_ids, params, max_length):
        pass

    def propose(self, context, max_tokens, params: SamplingParams, noise) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        frontier = [(-1, tuple(context))]  # (node, prefix through it)
        for width in self.branching:
            next_frontier = []
            for parent, prefix in frontier:
                probs = processed_probs(self.next_logits(prefix).unsqueeze(0), params, torch.tensor(prefix))[0]
                if self.sampled:
                    children = [int(sample(probs.unsqueeze(0), self.generator)[0]) for _ in range(width)]
                else:
                    children = probs.topk(min(width, probs.shape[0])).indices.tolist()
                for token in children:
                    if len(tokens) == max_tokens:
                        return self._draft(tokens, parents, rows)
                    tokens.append(token)
                    parents.append(parent)
                    rows.append(probs)
                    next_frontier.append((len(tokens) - 1, prefix + (token,)))
            frontier = next_frontier
        return self._draft(tokens, parents, rows)

    def _draft(self, tokens, parents, rows) -> Draft:
        return Draft(tokens, parents, torch.stack(rows) if self.sampled and rows else None)

    def on_verified(self, context, draft: Draft, result: VerifyResult) -> None:
        pass

    def fresh(self) -> "RandomTreeDrafter":
        return self


class OracleTreeDrafter(Drafter):
    """Knows the target's greedy continuation and hides it in a tree among random siblings, leaving
    it out at some depths: greedy tree verification must still reproduce plain decoding exactly."""

    def __init__(self, continuation: Sequence[int], prompt_length: int, vocab_size: int, seed: int = 0):
        self.name = "oracle-tree"
        self.continuation, self.prompt_length, self.vocab = list(continuation), prompt_length, vocab_size
        self.rng = random.Random(seed)

    def begin(self, prompt_ids, params, max_length):
        pass

    def propose(self, context, max_tokens, params, noise) -> Draft:
        truth = self.continuation[len(context) - self.prompt_length:]
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for depth, token in enumerate(truth):
            siblings = [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, 2))]
            keep_truth = self.rng.random() > 0.15
            choices = siblings + ([token] if keep_truth else [])
            self.rng.shuffle(choices)
            if not choices or len(tokens) + len(choices) > max_tokens:
                break
            next_parent = None
            for choice in choices:
                tokens.append(choice)
                parents.append(parent)
                if choice == token and keep_truth and next_parent is None:
                    next_parent = len(tokens) - 1
            if next_parent is None:
                break
            parent = next_parent
        return Draft(tokens, parents)

    def on_verified(self, context, draft: Draft, result: VerifyResult) -> None:
        pass

    def fresh(self) -> "OracleTreeDrafter":
        return self
