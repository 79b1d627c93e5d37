"""Lookahead decoding (Fu et al. 2024): Jacobi iterations run alongside verification, in the same forward.

The lookahead branch is a window of W columns and N-1 levels of guessed tokens. Token (level j,
column w) stands at position root + w + j + 1 and attends to the committed prefix, the root, level 0 up to
column w, and its own column's levels 1..j: a causal chain of distinct positions, so the target's argmax
after it is a Jacobi update for the next position along that diagonal. After each forward, every
column yields an n-gram (level 0..N-2 of the column, then the target's output after level N-2), added to
a pool keyed by its first token; the levels shift up and the outputs become the new last level.

The verification branch is the pool's n-grams (up to G) that start with the last committed token,
merged into a token tree and verified exactly like any tree draft (greedy and sampling). The lookahead
branch rides along as side inputs (`Draft.side`): the target computes them in the same forward,
they are never verified nor kept in the KV cache, so the output stays exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.drafters.base import Drafter, container_bytes
from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, SideInputs, VerifyResult
from specdec.errors import InvalidParameterError
from specdec.core.sampling import SamplingParams
from specdec.core.tree import TokenTree


class LookaheadDrafter(Drafter):
    def __init__(self, window: int = 4, ngram: int = 3, pool: int = 4, seed: int = 0):
        if not (1 <= window <= 16 and 2 <= ngram <= 8 and 1 <= pool <= 32):
            raise InvalidParameterError("lookahead drafter: need 1 <= W <= 16, 2 <= N <= 8, 1 <= G <= 32")
        self.window, self.ngram, self.pool_size, self.seed = window, ngram, pool, seed
        self.name = f"lookahead:W{window},N{ngram},G{pool}"
        self.tree_node_budget = pool * (ngram - 1)  # the verification branch's node budget
        self.side_capacity = window * (ngram - 1)
        self.side_mask, self.side_positions = self.lookahead_mask(window, ngram)
        self.levels: list[list[int]] = []
        self.pool: dict[int, list[tuple[int, ...]]] = {}

    def fresh(self) -> "LookaheadDrafter":
        return LookaheadDrafter(self.window, self.ngram, self.pool_size, self.seed)

    @staticmethod
    def lookahead_mask(window: int, ngram: int) -> tuple[torch.Tensor, list[int]]:
        """(S, S) mask and position offsets of the lookahead branch, tokens ordered level by level."""
        levels = ngram - 1
        index = lambda level, column: level * window + column  # noqa: E731
        size = levels * window
        mask = torch.zeros(size, size, dtype=torch.bool)
        positions = [0] * size
        for level in range(levels):
            for column in range(window):
                me = index(level, column)
                positions[me] = column + level + 1
                mask[me, [index(0, c) for c in range(column + 1)]] = True  # level 0 up to this column
                mask[me, [index(j, column) for j in range(1, level + 1)]] = True  # own column, levels 1..level
        return mask, positions

    def memory_bytes(self) -> int:
        """The n-gram pool and the Jacobi window (its extra KV slots live in the target's cache)."""
        return container_bytes(self.pool) + container_bytes(self.levels)

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        # Start the Jacobi window from random prompt tokens (any start converges; prompt tokens help).
        rng = random.Random(self.seed)
        self.levels = [[rng.choice(list(prompt_ids)) for _ in range(self.window)] for _ in range(self.ngram - 1)]
        self.pool = {}

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        candidates = self.pool.get(context[-1], [])
        paths, budget = [], max_tokens
        for candidate in candidates:
            if budget < len(candidate):
                break
            paths.append(list(candidate))
            budget -= len(candidate)
        tree = TokenTree.from_paths(paths)
        side = SideInputs([token for level in self.levels for token in level], list(self.side_positions),
                          self.side_mask)
        return Draft(list(tree.tokens), list(tree.parents), side=side)

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        outputs = None if draft.side is None else draft.side.outputs
        if outputs is None:
            return
        last_level = outputs[(self.ngram - 2) * self.window:]  # the target's next token on each diagonal
        for column in range(self.window):
            gram = tuple(self.levels[j][column] for j in range(self.ngram - 1)) + (last_level[column],)
            bucket = self.pool.setdefault(gram[0], [])
            if gram[1:] in bucket:
                bucket.remove(gram[1:])
            bucket.insert(0, gram[1:])  # most recent first
            del bucket[self.pool_size:]
        # Jacobi step: levels move up one, the outputs after the last level become the new last level.
        self.levels = self.levels[1:] + [list(last_level)]
        # Seed the pool with the committed text too (n-grams the output itself contains).
        committed = list(context[-(len(result.tokens) + self.ngram):])
        for start in range(len(committed) - self.ngram + 1):
            gram = tuple(committed[start: start + self.ngram])
            bucket = self.pool.setdefault(gram[0], [])
            if gram[1:] not in bucket:
                bucket.insert(0, gram[1:])
                del bucket[self.pool_size:]


@dataclass(frozen=True)
class LookaheadShape:
    """`lookahead:W,N,G`, read and range-checked when the spec is parsed (before any model loads)."""

    window: int = 4
    ngram: int = 3
    pool: int = 4

    def __post_init__(self):
        if not (1 <= self.window <= 16 and 2 <= self.ngram <= 8 and 1 <= self.pool <= 32):
            raise InvalidParameterError("lookahead drafter: need 1 <= W <= 16, 2 <= N <= 8, 1 <= G <= 32")

    @classmethod
    def parse(cls, argument: str) -> "LookaheadShape":
        if not argument:
            return cls()
        try:
            window, ngram, pool = (int(value) for value in argument.split(","))
        except ValueError:
            raise InvalidParameterError(f"lookahead drafter: {argument!r} is not W,N,G (e.g. 4,3,4)") from None
        return cls(window, ngram, pool)


def check(spec) -> None:
    """The registry's check at spec parse: a bad W,N,G is refused before the target loads."""
    LookaheadShape.parse(spec.argument)


def build(spec, target, device: str, dtype: str) -> LookaheadDrafter:
    """`lookahead[:W,N,G]` (a spec.DrafterSpec)."""
    shape = LookaheadShape.parse(spec.argument)
    return LookaheadDrafter(shape.window, shape.ngram, shape.pool)
