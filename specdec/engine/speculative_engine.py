"""A target, a drafter and a speculation length: generations started from them."""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from specdec.core.commit import StopCriteria
from specdec.core.constraint import Constraint
from specdec.core.rounds import GenerationResult, StreamChunk
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import FixedK, KSetting, SourceLengths, SpeculationLength
from specdec.core.verify import Acceptance
from specdec.drafters.base import Drafter
from specdec.engine.batched import run_alone
from specdec.engine.generation import Generation
from specdec.models.base import CausalLM, positions_after


def speculation_for(drafter: Drafter | None, k: KSetting) -> SpeculationLength:
    """How many tokens `drafter` drafts a round for the setting `k`: chain drafters follow it."""
    if drafter is None:
        return FixedK(0)
    # Tree drafters (EAGLE, Medusa) draft a node budget, which AdaptiveK's chain model does not describe.
    if k.is_auto and drafter.tree_node_budget is not None:
        return FixedK(drafter.tree_node_budget)
    # A combined drafter's sources are accepted at rates far apart: each gets its own K.
    return SourceLengths(k.max_k) if k.is_auto and drafter.drafts_per_source else k.new_length()


class SpeculativeEngine:
    def __init__(self, target: CausalLM, drafter: Drafter | None = None, speculation: SpeculationLength | None = None,
                 acceptance: Acceptance | str = Acceptance.MATCH):
        """acceptance: the sampling rule (specdec.core.verify): "match" returns the text plain sampling returns for
        the same seed; "rejection" accepts more of a sampling drafter's tokens, exact in distribution only."""
        self.target = target
        self.drafter = drafter
        self.speculation = speculation or FixedK(0 if drafter is None else 4)
        if drafter is not None and isinstance(self.speculation, SourceLengths):
            drafter.use_source_lengths(self.speculation)
        self.acceptance = Acceptance.parse(acceptance)

    @property
    def drafter_name(self) -> str:
        return "none" if self.drafter is None else self.drafter.name

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, criteria: StopCriteria, tokenizer,
                 seed: int | None = None, on_chunk: Callable[[StreamChunk], None] | None = None,
                 prompt_cache=None) -> GenerationResult:
        """`prompt_cache`: a target cache holding exactly prompt_ids[:-1] (`prompt_cache()`), copied instead of
        a prefill when many generations share one prompt (the same keys and values, so the same output)."""
        run = Generation(self, list(prompt_ids), params, criteria, tokenizer, seed, prompt_cache)
        for chunk in run_alone(run):
            if on_chunk is not None:
                on_chunk(chunk)
        return run.result()

    def stream(self, prompt_ids: Sequence[int], params: SamplingParams, criteria: StopCriteria, tokenizer,
               seed: int | None = None) -> Iterator[StreamChunk]:
        return run_alone(self.start(prompt_ids, params, criteria, tokenizer, seed))

    def prompt_cache(self, prompt_ids: Sequence[int]):
        """The target's cache after a prefill of prompt_ids[:-1], for `generate(..., prompt_cache=)`."""
        head = list(prompt_ids)[:-1]
        cache = self.target.new_cache(1, max(1, len(head)))
        if head:
            tokens = torch.tensor([head], device=self.target.device)  # (1, P-1)
            self.target.forward(tokens, positions_after(0, len(head), 1, tokens.device), cache, last_logits_only=True)
        return cache

    def start(self, prompt_ids: Sequence[int], params: SamplingParams, criteria: StopCriteria, tokenizer,
              seed: int | None = None, constraint: Constraint | None = None,
              logprobs: int | None = None) -> Generation:
        """A generation to drive round by round (`run_alone`, or a batch runner), then `result()`.
        `constraint`: the grammar its output must match (core/constraint.py), in its initial state;
        `logprobs`: record each token's log-probability and this many alternatives' (None: none)."""
        return Generation(self, list(prompt_ids), params, criteria, tokenizer, seed, constraint=constraint,
                          logprobs=logprobs)
