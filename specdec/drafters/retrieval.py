"""Retrieval drafting (REST, He et al. 2023): continuations of the context found in a datastore, merged
into a token tree.

Each round the longest suffix of the context (16 down to 2 tokens) that occurs in the datastore is
looked up in its suffix array; what followed up to `max_matches` occurrences (up to `depth` tokens each)
is counted in a trie, and the `budget` most frequent prefixes become the draft tree (a prefix is never
rarer than its extensions, so they form a tree). Deterministic proposals: exact under greedy and
sampling. No model runs: the cost is a few binary searches; memory is the memory-mapped datastore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.core.tree import TokenTree
from specdec.drafters.base import Drafter
from specdec.drafters.eagle import TreeShape, tree_with
from specdec.heads.datastore import Datastore

MAX_SUFFIX, MIN_SUFFIX = 16, 2


class RetrievalDrafter(Drafter):
    def __init__(self, store: Datastore, name: str, budget: int = 16, depth: int = 8, max_matches: int = 128):
        self.store, self.name = store, name
        self.tree_node_budget, self.depth, self.max_matches = budget, depth, max_matches

    def fresh(self) -> "RetrievalDrafter":
        return self  # no per-generation state: the datastore is read-only

    def memory_bytes(self) -> int:
        """The datastore's token and suffix arrays (memory-mapped: the OS pages in what queries touch)."""
        return self.store.tokens.nbytes + self.store.suffixes.nbytes

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        pass

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        found = self.store.continuations(list(context), MAX_SUFFIX, MIN_SUFFIX, self.max_matches, self.depth)
        counts: dict[tuple[int, ...], int] = {}
        for continuation in found:
            for depth in range(1, len(continuation) + 1):
                prefix = tuple(continuation[:depth])
                counts[prefix] = counts.get(prefix, 0) + 1
        # Most frequent first; shorter first among equals, so a prefix always precedes its extensions.
        ranked = sorted(counts, key=lambda prefix: (-counts[prefix], len(prefix), prefix))[:max_tokens]
        if not ranked:
            return Draft.empty()
        tree = TokenTree.from_paths(sorted(ranked, key=len))
        return Draft(list(tree.tokens), list(tree.parents))

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        pass


@dataclass(frozen=True)
class RetrievalOptions:
    """retrieval:DATASTORE_DIR@budget=N,depth=D: the tree's nodes a round, and how deep it reaches."""

    budget: int = 16
    depth: int = 8

    def __post_init__(self):
        tree_with(TreeShape(), depth=self.depth, budget=self.budget)  # the ranges


def build(spec, target, device: str, dtype: str) -> RetrievalDrafter:
    """`retrieval:DATASTORE_DIR[@budget=N,depth=D]` (a spec.DrafterSpec)."""
    location, options = spec.argument, spec.options
    store = Datastore.open(location, target.tokenizer)
    return RetrievalDrafter(store, f"retrieval:{location.rstrip('/').rsplit('/', 1)[-1]}", options.budget,
                            options.depth)
