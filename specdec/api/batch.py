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

from collections import deque
from typing import Callable, Sequence

import torch

from specdec.api.events import Chunk, Done, Event, Failed, Refused, Started
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
                 keep_conversations: bool = False, on_round: Callable[[BatchedRound], None] | None = None):
        """generator: a SpeculativeGenerator; prefix_cache: where prompts' keys and values are kept for later
        prompts (None: none); row_budget: target rows a round may verify, all generations together ("auto":
        the device's default, None: no limit); keep_conversations: also offer each finished generation's
        prompt + answer to the prefix cache (a chat's next turn resends them); on_round: told each batched
        round (the server's metrics)."""
        if row_budget == "auto":
            row_budget = default_row_budget(generator.target.model.device)
        if row_budget is not None and (not isinstance(row_budget, int) or row_budget < 1):
            raise InvalidParameterError(f"row_budget must be an integer >= 1, 'auto' or None, not {row_budget!r}")
        self.generator = generator
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        self.row_budget = row_budget
        self.keep_conversations = keep_conversations
        self.pass_cost = PassCost()  # what this target's batched passes cost by rows: sizes each request's K
        self.on_round = on_round or (lambda batch: None)
        self.running: list[tuple[object, Generation]] = []  # (the caller's key, its generation), admitted first

    # -- the loop's parts ------------------------------------------------------------------------
    def admit(self, key, request: GenerationRequest) -> Generation:
        """Start the request's generation under `key` (any object the caller names it by): its cache
        allocated, nothing computed; it is prefilled and runs in the next steps. InvalidParameterError for a
        request that cannot run (a prompt too long, ids outside the vocabulary): nothing is admitted."""
        generation = self.generator.start(request, interleaved=True)
        self.running.append((key, generation))
        return generation

    def drop(self, key) -> None:
        """Stop the generation under `key` (a cancelled request): its cache goes with it, but what its prefill
        computed is offered to the prefix cache first (a client that gave up on a long prompt's prefill and
        sends it again resumes where it stopped)."""
        for entry_key, generation in self.running:
            if entry_key is key and not generation.prefilled and generation.cache.length and self.prefix_cache:
                self.prefix_cache.store(generation.prompt_ids[:generation.cache.length], generation.cache)
        self.running = [entry for entry in self.running if entry[0] is not key]

    def step(self, prefill_budget: float | None = None) -> list[tuple[object, Event]]:
        """One step of the batch: prefill the admitted prompts (about `prefill_budget` prompt rows' work, the
        prompts with the fewest tokens left first; None: all of them), then one round of every prefilled
        generation, their verify forwards one pass. The events, each with its generation's key, in order:
        Started when a prompt is prefilled, Chunk for each round's new text, Done (the generation leaves),
        Refused for a request whose own input failed mid-output (a grammar the engine gave up on), Failed for a
        bug (the generations it hit leave; the others go on)."""
        events: list[tuple[object, Event]] = []
        self._prefill_some(prefill_budget, events)
        ready = [entry for entry in self.running if entry[1].prefilled and not entry[1].finished]
        if not ready:
            return events
        try:
            batch = self.round([generation for _, generation in ready])
            self.on_round(batch)
        except Exception as exc:  # a bug, not bad input: the requests of this round fail
            return events + self._leave([(key, Failed(exc)) for key, _ in ready])
        for index, ((key, generation), outcome) in enumerate(zip(ready, batch.outcomes)):
            if index in batch.refused:
                events += self._leave([(key, Refused(batch.refused[index]))])
                continue
            chunk = outcome.stream_chunk()
            if chunk is not None:
                events.append((key, Chunk(chunk)))
            if generation.finished:
                events += self._leave([(key, Done(self.finish(generation)))])
        return events

    def _prefill_some(self, budget: float | None, events: list) -> None:
        """A short request arriving behind a long prompt starts after one chunk of it, not after all of it,
        and the long prompt goes on in chunks between rounds."""
        prefilling = sorted((entry for entry in self.running if not entry[1].prefilled),
                            key=lambda entry: entry[1].prefill.tokens_left)
        for key, generation in prefilling:
            try:
                spent = self.prefill(generation, budget)
            except Exception as exc:
                events += self._leave([(key, Failed(exc))])
                continue
            if generation.prefilled:
                events.append((key, Started(len(generation.prompt_ids))))
            if budget is not None:
                budget -= max(1.0, spent)
                if budget <= 0:
                    return

    def _leave(self, final: list[tuple[object, Event]]) -> list[tuple[object, Event]]:
        for key, _ in final:
            self.drop(key)
        return final

    def prefill(self, generation: Generation, budget: float | None = None) -> float:
        """Prefill about `budget` more of the prompt (None: all), counted in prompt rows at depth 0: a row
        deeper in the prompt costs more (`prompt_row_cost`), so a step deep in a long prompt takes fewer
        rows and about as long as one near its start. The budget spent (at least the rows computed' cost).
        The first call takes the prompt's longest cached prefix; the last offers the prompt to the prefix
        cache."""
        head = generation.prompt_ids[:-1]
        if self.prefix_cache is not None and generation.cache.length == 0 and not generation.prefilled:
            generation.prefill.use_prompt_cache(self.prefix_cache.lookup(head))
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

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, requests: Sequence[GenerationRequest], max_batch: int = 16,
            on_result: Callable[[int, GenerationResult], None] | None = None) -> list[GenerationResult]:
        """Every request's result, in order: up to `max_batch` generations run together and a finished
        one's place goes to the next request (continuous batching). on_result(index, result) is called as
        each finishes. Every request is checked (encoded) before any generation starts."""
        if not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidParameterError("max_batch must be at least 1")
        requests = [request.replace(prompt=self.generator.prompt_ids(request), chat=False) for request in requests]
        results: list[GenerationResult | None] = [None] * len(requests)
        waiting = deque(range(len(requests)))
        while waiting or self.running:
            while waiting and len(self.running) < max_batch:
                index = waiting.popleft()
                self.admit(index, requests[index])
            for index, event in self.step():
                if isinstance(event, (Failed, Refused)):
                    raise event.error
                if isinstance(event, Done):
                    results[index] = event.result
                    if on_result is not None:
                        on_result(index, event.result)
        return results
