"""Several chain drafters, cheapest first: each round takes the first one that proposes anything.

`ngram+draft:MODEL` drafts for free wherever the text repeats the prompt or itself (code edits, quoted
passages) and asks the model only where lookup has nothing. Exactness needs nothing new: whichever
source proposed, its draft is verified by the same rule.

The sources that did not propose this round keep lagging state (a draft model's cache holds committed
tokens only and catches up at its next proposal), which the drafter contract allows; only the source
that proposed is told the round's result.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Drafter
from specdec.errors import InvalidParameterError
from specdec.rounds import Draft, VerifyResult
from specdec.sampling import SamplingParams


class CombinedDrafter(Drafter):
    def __init__(self, sources: Sequence[Drafter]):
        if len(sources) < 2:
            raise InvalidParameterError("a combined drafter needs at least two drafters joined by '+'")
        for source in sources:
            if source.feature_layer is not None or source.tree_node_budget is not None or source.side_capacity:
                raise InvalidParameterError(f"drafter {source.name!r} drafts trees or reads the target's features; "
                                            "only chain drafters (ngram, draft:, quant:, layerskip) combine with '+'")
        self.sources = list(sources)
        self.name = "+".join(source.name for source in self.sources)
        self.proposer: Drafter | None = None

    def fresh(self) -> "CombinedDrafter":
        return CombinedDrafter([source.fresh() for source in self.sources])

    def memory_bytes(self) -> int:
        return sum(source.memory_bytes() for source in self.sources)

    def take_prompt_cache(self, target_cache) -> None:
        for source in self.sources:
            source.take_prompt_cache(target_cache)

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        for source in self.sources:
            source.begin(prompt_ids, params, max_length)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        self.proposer = None
        for source in self.sources:
            draft = source.propose(context, max_tokens, params, generator)
            if len(draft):
                self.proposer = source
                return draft
        return Draft.empty()

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        if self.proposer is not None:
            self.proposer.on_verified(context, draft, result)
