"""One round of several generations of one target, their verify forwards one batched pass."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from specdec.core.batch_drafts import PassCost, acceptance_rate, draft_caps, draft_seconds_per_token
from specdec.core.commit import CommitOutcome
from specdec.core.rounds import StreamChunk
from specdec.engine.generation import Generation
from specdec.errors import SpecdecError


@dataclass
class BatchedRound:
    outcomes: list[CommitOutcome | None]  # one per generation, in order (None: refused, below)
    rows: int  # target rows verified, all generations together
    drafted: list[int]  # draft tokens each generation verified (its K this round), in order
    # generations whose own input failed this round (their grammar's engine gave up mid-output): index ->
    # the error; they commit nothing more and leave, the others' rounds are whole
    refused: dict[int, SpecdecError] = field(default_factory=dict)


def run_round_together(generations: Sequence[Generation], row_budget: int | None = None,
                       pass_cost: PassCost | None = None) -> BatchedRound:
    """One round of each of several prefilled, unfinished generations of one target, with the target's
    verify forwards run as one batched pass (`forward_batch`: each request's rows, positions, cache and
    mask as its own, the weights read once). Each generation drafts, accepts and commits as in its own
    round, on outputs identical to its own forward's, so its tokens are those it produces alone.

    Rows compete: a request's draft tokens cost what other requests' next tokens would. At most row_budget
    rows are verified; with `pass_cost` (the caller's record of its passes, updated here) the draft rows go to
    the generations whose drafts are accepted most, while they raise the round's tokens per second
    (batch_drafts.draft_caps); without it, every generation gets an even share."""
    wanted = [generation.plan_k() for generation in generations]
    cost = None if pass_cost is None or len(generations) < 2 else pass_cost.fit()
    rates = [acceptance_rate(g.rounds) if cost is not None and k else 0.0 for g, k in zip(generations, wanted)]
    spend = [draft_seconds_per_token(g.rounds) if cost is not None and k else 0.0 for g, k in zip(generations, wanted)]
    caps = draft_caps(rates, wanted, row_budget, cost, spend)
    rounds = [g.prepare_round(cap, k) for g, cap, k in zip(generations, caps, wanted)]
    outcomes: list[CommitOutcome | None] = [None] * len(generations)
    refused: dict[int, SpecdecError] = {}
    groups: dict[tuple, list[int]] = {}  # generations asking for the same hidden layers share one pass
    for index, generation in enumerate(generations):
        groups.setdefault(generation.hidden_layers, []).append(index)
    for hidden_layers, members in groups.items():
        target = generations[members[0]].target
        started = time.perf_counter()
        outs = verify_forwards(target, [rounds[i].request for i in members], hidden_layers)
        if outs and outs[0].logits.device.type == "cuda":
            torch.cuda.synchronize(outs[0].logits.device)
        ended = time.perf_counter()
        if pass_cost is not None:
            pass_cost.observe(sum(rounds[i].request.tokens.shape[1] for i in members), ended - started)
        for index, out in zip(members, outs):
            try:
                outcomes[index] = generations[index].finish_round(rounds[index], out, started, ended)
            except SpecdecError as error:  # this request's fault: it ends, the batch goes on
                refused[index] = error
    return BatchedRound(outcomes, sum(r.request.tokens.shape[1] for r in rounds), [len(r.draft) for r in rounds],
                        refused)


def verify_forwards(target, requests: Sequence, hidden_layers: tuple) -> list:
    """The verify forwards' outputs: one request runs the target's own forward (its fastest path for one
    sequence: CUDA graphs, the one-request kernels), several one batched pass."""
    if len(requests) > 1:
        return target.forward_batch(requests, hidden_layers)
    request = requests[0]
    return [target.forward(request.tokens, request.positions, request.cache, request.attn_mask,
                           hidden_layers=hidden_layers)]


def run_alone(generation: Generation) -> Iterator[StreamChunk]:
    """Drive one generation to its end: prefill, then its rounds (the batch's round, a batch of one), each
    round's new text as it is committed."""
    generation.begin()
    while not generation.finished:
        batch = run_round_together([generation])
        if batch.refused:
            raise batch.refused[0]
        chunk = batch.outcomes[0].stream_chunk()
        if chunk is not None:
            yield chunk
    generation.seconds = time.perf_counter() - generation.started
