"""One batch runner: generations of one generator run together, their verify forwards batched.

`SpeculativeGenerator.generate_batch` and the server's scheduler both drive generations through it: the
scheduler keeps only its queue, its thread, its KV budget and its events. The runner owns what makes the
batch fast and exact:
  - admission: a new generation's prompt takes the longest cached prefix it shares with earlier prompts
    (prefix_cache.py) and prefills only the rest, in chunks if the caller asks;
  - rounds: one round of every running generation, their verify forwards one pass over the weights
    (engine.run_round_together), within a row budget whose draft rows go where they are accepted most
    (batch_drafts.py), sized by the measured cost of past passes (`PassCost`);
  - the end: a finished conversation is offered to the prefix cache (the next turn's history).
Each generation's tokens are those it produces alone (same request, same seed).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specdec.api.prefix_cache import PrefixCache
from specdec.api.request import GenerationRequest
from specdec.core.batch_drafts import PassCost
from specdec.core.rounds import GenerationResult
from specdec.engine import BatchedRound, Generation, run_round_together
from specdec.errors import InvalidParameterError


def default_row_budget(device: torch.device) -> int | None:
    """Target rows a batched round verifies on this device, all requests together. On the CPU kernels a pass
    over a few rows costs about one row's, but past a few dozen its cost grows with its rows; there, about
    two dozen rows is where drafting for a batch stops paying (batched plain decoding wins). A GPU pass of
    hundreds of rows costs about one row's: no limit."""
    return None if device.type == "cuda" else 32


class BatchRunner:
    def __init__(self, generator, prefix_cache: PrefixCache | None = None, row_budget: int | None | str = "auto",
                 keep_conversations: bool = False):
        """generator: a SpeculativeGenerator; prefix_cache: where prompts' keys and values are kept for later
        prompts (None: none); row_budget: target rows a round may verify, all generations together ("auto":
        the device's default, None: no limit); keep_conversations: also offer each finished generation's
        prompt + answer to the prefix cache (a chat's next turn resends them)."""
        if row_budget == "auto":
            row_budget = default_row_budget(generator.target.model.device)
        if row_budget is not None and (not isinstance(row_budget, int) or row_budget < 1):
            raise InvalidParameterError(f"row_budget must be an integer >= 1, 'auto' or None, not {row_budget!r}")
        self.generator = generator
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        self.row_budget = row_budget
        self.keep_conversations = keep_conversations
        self.pass_cost = PassCost()  # what this target's batched passes cost by rows: sizes each request's K

    def start(self, request: GenerationRequest) -> Generation:
        """The request's generation: its cache allocated, nothing computed (InvalidParameterError for a
        request that cannot run: a prompt too long, ids outside the vocabulary)."""
        return self.generator.start(request, interleaved=True)

    def prefill(self, generation: Generation, budget: float | None = None) -> float:
        """Prefill about `budget` more of the prompt (None: all), counted in prompt rows at depth 0: a row
        deeper in the prompt costs more (`prompt_row_cost`), so a step deep in a long prompt takes fewer
        rows and about as long as one near its start. The budget spent (at least the rows computed' cost).
        The first call takes the prompt's longest cached prefix; the last offers the prompt to the prefix
        cache."""
        head = generation.prompt_ids[:-1]
        if self.prefix_cache is not None and generation.cache.length == 0 and not generation.prefilled:
            generation.use_prompt_cache(self.prefix_cache.lookup(head))
        cost = self.generator.target.model.prompt_row_cost
        depth = generation.cache.length
        rows = None if budget is None else max(1, int(budget / cost(depth)))
        done = generation.prefill_step(rows)
        if generation.prefilled and self.prefix_cache is not None:
            self.prefix_cache.store(head, generation.cache)
        return done * cost(depth + done // 2)

    def round(self, generations: Sequence[Generation]) -> BatchedRound:
        """One round of each prefilled, unfinished generation, their verify forwards batched."""
        return run_round_together(generations, self.row_budget, self.pass_cost)

    def finish(self, generation: Generation) -> GenerationResult:
        """The finished generation's result; its conversation goes to the prefix cache if kept."""
        if self.prefix_cache is not None and self.keep_conversations:
            kept = generation.cache.length
            self.prefix_cache.store(generation.context[:kept], generation.cache, len(generation.prompt_ids) - 1)
        return generation.result()

    def run(self, requests: Sequence[GenerationRequest], max_batch: int = 16,
            on_result: Callable[[int, GenerationResult], None] | None = None) -> list[GenerationResult]:
        """Every request's result, in order: up to `max_batch` generations run together and a finished
        one's place goes to the next request (continuous batching). on_result(index, result) is called as
        each finishes. Every request is checked (encoded) before any generation starts."""
        if not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidParameterError("max_batch must be at least 1")
        requests = [request.replace(prompt=self.generator.prompt_ids(request), chat=False) for request in requests]
        results: list[GenerationResult | None] = [None] * len(requests)
        waiting = list(range(len(requests)))[::-1]
        running: list[tuple[int, Generation]] = []
        while waiting or running:
            while waiting and len(running) < max_batch:
                index = waiting.pop()
                generation = self.start(requests[index])
                self.prefill(generation)
                running.append((index, generation))
            ready = [generation for _, generation in running if not generation.finished]
            if ready:
                self.round(ready)
            for index, generation in [entry for entry in running if entry[1].finished]:
                results[index] = self.finish(generation)
                if on_result is not None:
                    on_result(index, results[index])
            running = [entry for entry in running if not entry[1].finished]
        return results
