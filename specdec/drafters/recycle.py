"""Token Recycling (Luo et al., ACL 2025, arXiv 2408.08696): the target's own candidate tokens, kept, as a
draft that costs no forward.

Every verify forward computes the target's distribution at each of its rows, and all but the committed
token are thrown away. This drafter keeps them: a table holds, for every token id, the `successors`
likeliest next tokens the target gave at the last row whose input was that token (a row of a rejected draft
token too: it is still the target's view of what follows that token). Drafting walks the table from the
last committed token: a chain of top-1 successors, or a tree that branches into the top `width` at its first
`levels` levels. Proposals are deterministic (one-hot draft_probs), verified by the same exact rule as every
drafter's.

The table is the model's own statistics, not any request's text: with `shared=1` (the default) every
generation of this drafter, and every request a server runs with it, reads and refreshes one table, so it
warms up across requests; only drafts cross between requests, and verification decides every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.drafters.base import Drafter
from specdec.drafters.combined import LookupSource
from specdec.drafters.spec import DrafterSpec
from specdec.errors import InvalidParameterError

SHAPES = ("chain", "tree")
TREE_NODES = 8  # a tree round's nodes under k="auto"


@dataclass(frozen=True)
class RecycleOptions:
    """`recycle@successors=8,shape=chain,width=2,levels=1,shared=1`."""

    successors: int = 8  # next tokens kept per token id
    shape: str = "chain"  # chain: top-1 successors; tree: the top `width` at each node of the first `levels`
    width: int = 2
    levels: int = 1
    shared: int = 1  # 1: one table for every generation and request of this drafter; 0: each starts empty

    def __post_init__(self):
        if not 1 <= self.successors <= 64:
            raise InvalidParameterError("successors must be between 1 and 64")
        if self.shape not in SHAPES:
            raise InvalidParameterError(f"shape must be one of {', '.join(SHAPES)}, not {self.shape!r}")
        if not 1 <= self.width <= self.successors or self.levels < 0:
            raise InvalidParameterError("width must be between 1 and successors, levels >= 0")
        if self.shared not in (0, 1):
            raise InvalidParameterError("shared must be 0 or 1")


class SuccessorTable:
    """token id -> its `successors` likeliest next tokens, likeliest first (-1: none seen yet), as the target
    gave them at the last row whose input was that token. Sized on the first rows it is given (the LM head's
    width)."""

    def __init__(self, successors: int):
        self.successors = successors
        self.next: torch.Tensor | None = None  # (V, successors) int32

    def update(self, inputs: Sequence[int], logits: torch.Tensor) -> None:
        """Rows `logits` (R, V), row r computed with inputs[r] as its last token. A token given twice keeps its
        last row's successors."""
        if self.next is None:
            self.next = torch.full((logits.shape[-1], self.successors), -1, dtype=torch.int32)
        top = torch.topk(logits.detach().float().cpu(), min(self.successors, logits.shape[-1]), dim=-1).indices
        latest = {token: row for row, token in enumerate(inputs)}  # the last row of each token
        rows = list(latest.values())
        self.next[list(latest)] = top[rows].to(torch.int32)  # (distinct inputs, successors)

    def following(self, token: int, count: int) -> list[int]:
        """Up to `count` successors of `token`, likeliest first."""
        if self.next is None or not 0 <= token < self.next.shape[0]:
            return []
        return [t for t in self.next[token, :count].tolist() if t >= 0]

    def nbytes(self) -> int:
        return 0 if self.next is None else self.next.numel() * self.next.element_size()


class RecycleDrafter(Drafter, LookupSource):
    """Drafts from the target's recycled candidates: costs a table walk, reads every verify row's logits."""

    reads_logits = True

    def __init__(self, options: RecycleOptions = RecycleOptions(), table: SuccessorTable | None = None,
                 name: str = "recycle"):
        self.options, self.name = options, name
        self.table = table if table is not None else SuccessorTable(options.successors)
        self.tree_node_budget = TREE_NODES if options.shape == "tree" else None

    def fresh(self) -> "RecycleDrafter":
        return RecycleDrafter(self.options, self.table if self.options.shared else None, self.name)

    def memory_bytes(self) -> int:
        return self.table.nbytes()

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        if not self.options.shared:
            self.table = SuccessorTable(self.options.successors)

    def take_logits(self, inputs: Sequence[int], logits: torch.Tensor) -> None:
        self.table.update(inputs, logits)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        if max_tokens <= 0 or not context:
            return Draft.empty()
        if self.options.shape == "chain":
            return Draft.chain(self._chain(context[-1], max_tokens))
        return self._tree(context[-1], max_tokens)

    def _chain(self, token: int, length: int) -> list[int]:
        tokens: list[int] = []
        while len(tokens) < length:
            following = self.table.following(token, 1)
            if not following:
                break
            token = following[0]
            tokens.append(token)
        return tokens

    def _tree(self, root: int, budget: int) -> Draft:
        """Breadth first: every node of the first `levels` levels branches into its top `width` successors,
        deeper nodes into their top one, until `budget` nodes."""
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(-1, root, 0)]  # (node index, token, depth)
        while frontier and len(tokens) < budget:
            parent, token, depth = frontier.pop(0)
            for child in self.table.following(token, self.options.width if depth < self.options.levels else 1):
                if len(tokens) == budget:
                    break
                tokens.append(child)
                parents.append(parent)
                frontier.append((len(tokens) - 1, child, depth + 1))
        return Draft(tokens, parents) if tokens else Draft.empty()

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        """Nothing to roll back: the table learns from the verify rows (take_logits), whatever was kept."""


def build(spec: DrafterSpec, target, device: str, dtype: str) -> RecycleDrafter:
    return RecycleDrafter(spec.options, name=spec.text or "recycle")
