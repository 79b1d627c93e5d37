"""The round loop: draft -> verify -> accept -> commit.

Cache discipline (invariant 2): the target's cache holds every committed token
except the last one, which is the first input of the next round. A round feeds
[last committed token] + K draft tokens to the target in one forward, which
yields the target's distribution after each of them (K + 1 rows: K to judge the
drafts, one for the bonus token), then truncates the cache back to the
committed tokens. With no drafter (K = 0) the round is one plain decoding step,
so plain decoding and speculative decoding share this one loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from specdec.core.batch_drafts import PassCost, acceptance_rate, draft_caps
from specdec.core.commit import Committer, CommitOutcome, StopCriteria
from specdec.core.constraint import Constraint, masked_logits
from specdec.drafters.base import Drafter
from specdec.errors import ContextLengthError
from specdec.models.base import CausalLM, ForwardRequest, positions_after, tree_attention_mask
from specdec.core.rounds import Draft, GenerationResult, SideInputs, StreamChunk, VerifyResult
from specdec.core.randomness import PositionalNoise, Purpose, random_seed
from specdec.core.sampling import SamplingParams, check_seed, processed_probs, token_logprobs, tree_processed_probs
from specdec.core.speculation_length import FixedK, SourceLengths, SpeculationLength
from specdec.core.stats import GenerationStats, RoundStats
from specdec.core.tree import TokenTree
from specdec.core.verify import (check_acceptance, verify_chain_greedy, verify_chain_match, verify_chain_rejection,
                            verify_tree_greedy, verify_tree_match, verify_tree_rejection)


class SpeculativeEngine:
    def __init__(self, target: CausalLM, drafter: Drafter | None = None, speculation: SpeculationLength | None = None,
                 acceptance: str = "match"):
        """acceptance: the sampling rule (specdec.core.verify): "match" returns the text plain sampling returns for
        the same seed; "rejection" accepts more of a sampling drafter's tokens, exact in distribution only."""
        check_acceptance(acceptance)
        self.target = target
        self.drafter = drafter
        self.speculation = speculation or FixedK(0 if drafter is None else 4)
        if drafter is not None and isinstance(self.speculation, SourceLengths):
            drafter.use_source_lengths(self.speculation)
        self.acceptance = acceptance

    @property
    def drafter_name(self) -> str:
        return "none" if self.drafter is None else self.drafter.name

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, criteria: StopCriteria, tokenizer,
                 seed: int | None = None, on_chunk: Callable[[StreamChunk], None] | None = None,
                 prompt_cache=None) -> GenerationResult:
        """`prompt_cache`: a target cache holding exactly prompt_ids[:-1] (`prompt_cache()`), copied instead of
        a prefill when many generations share one prompt (the same keys and values, so the same output)."""
        run = Generation(self, list(prompt_ids), params, criteria, tokenizer, seed, prompt_cache)
        for chunk in run.chunks():
            if on_chunk is not None:
                on_chunk(chunk)
        return run.result()

    def stream(self, prompt_ids: Sequence[int], params: SamplingParams, criteria: StopCriteria, tokenizer,
               seed: int | None = None) -> Iterator[StreamChunk]:
        return self.start(prompt_ids, params, criteria, tokenizer, seed).chunks()

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
              logprobs: int | None = None) -> "Generation":
        """A generation to drive round by round (`chunks()`), then `result()`: what a scheduler interleaves.
        `constraint`: the grammar its output must match (core/constraint.py), in its initial state;
        `logprobs`: record each token's log-probability and this many alternatives' (None: none)."""
        return Generation(self, list(prompt_ids), params, criteria, tokenizer, seed, constraint=constraint,
                          logprobs=logprobs)


@dataclass
class PreparedRound:
    draft: Draft
    tree: TokenTree | None
    request: ForwardRequest  # the verify forward
    draft_seconds: float
    catch_up_seconds: float = 0.0  # of draft_seconds, the drafter's catching up with the context (a prefill)


@dataclass
class BatchedRound:
    outcomes: list[CommitOutcome]  # one per generation, in order
    rows: int  # target rows verified, all generations together
    drafted: list[int]  # draft tokens each generation verified (its K this round), in order


def run_round_together(generations: Sequence["Generation"], row_budget: int | None = None,
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
    caps = draft_caps(rates, wanted, row_budget, cost)
    prepared = [generation.prepare_round(cap) for generation, cap in zip(generations, caps)]
    outcomes: list[CommitOutcome | None] = [None] * len(generations)
    groups: dict[tuple, list[int]] = {}  # generations asking for the same hidden layers share one pass
    for index, generation in enumerate(generations):
        groups.setdefault(generation.hidden_layers, []).append(index)
    for hidden_layers, members in groups.items():
        target = generations[members[0]].target
        started = time.perf_counter()
        outs = target.forward_batch([prepared[i].request for i in members], hidden_layers)
        if outs and outs[0].logits.device.type == "cuda":
            torch.cuda.synchronize(outs[0].logits.device)
        ended = time.perf_counter()
        if pass_cost is not None:
            pass_cost.observe(sum(prepared[i].request.tokens.shape[1] for i in members), ended - started)
        for index, out in zip(members, outs):
            outcomes[index] = generations[index].finish_round(prepared[index], out, started, ended)
    return BatchedRound(outcomes, sum(p.request.tokens.shape[1] for p in prepared), [len(p.draft) for p in prepared])


class Generation:
    """The state of one generation: caches, committed tokens, its seed's random numbers, stats.

    Driven alone by `chunks()` (prefill, then rounds until finished), or by a batch runner that calls
    `prefill_step` and runs rounds of several generations together (`run_round_together`, which uses
    `plan_k`, `prepare_round` and `finish_round`), then `result()`."""

    def __init__(self, engine: SpeculativeEngine, prompt_ids: list[int], params: SamplingParams,
                 criteria: StopCriteria, tokenizer, seed: int | None, prompt_cache=None,
                 constraint: Constraint | None = None, logprobs: int | None = None):
        if not prompt_ids:
            raise ContextLengthError("the prompt is empty: at least one token is needed")
        check_seed(seed)
        target = engine.target
        if len(prompt_ids) >= target.max_context:
            raise ContextLengthError(
                f"prompt is {len(prompt_ids)} tokens; the model's context is {target.max_context} tokens"
            )
        room = target.max_context - len(prompt_ids)
        if criteria.max_new_tokens > room:  # generation ends at the context limit, reported as "length"
            criteria = StopCriteria(room, criteria.eos_token_ids, criteria.stop_strings)
        self.engine, self.target, self.drafter = engine, target, engine.drafter
        # Feature drafters (EAGLE, EAGLE-3, Medusa) read these hidden layers of every target forward.
        self.hidden_layers = () if self.drafter is None else tuple(self.drafter.feature_layers)
        self.params = params
        self.constraint = constraint
        self.logprobs = logprobs
        self.token_logprobs: list = []  # rounds.TokenLogprob of each committed token, when recorded
        self.prompt_ids = prompt_ids
        self.context = list(prompt_ids)  # prompt + committed tokens
        self.committer = Committer(tokenizer, criteria)
        self.noise = PositionalNoise(seed if seed is not None else random_seed())
        # Under the match rule a sampling drafter draws with the target's own uniforms (coupled: its token
        # agrees with the target's as often as their CDFs allow); under the rejection rule with its own.
        self.draft_noise = self.noise.stream(Purpose.TOKEN if engine.acceptance == "match" else Purpose.DRAFT)
        # Drafters with side inputs (lookahead) need that many more slots in each verify forward.
        self.side_capacity = 0 if self.drafter is None else self.drafter.side_capacity
        capacity = min(target.max_context,
                       len(prompt_ids) + criteria.max_new_tokens + engine.speculation.max_k + 1 + self.side_capacity)
        self.cache = target.new_cache(1, capacity)
        # A target cache whose first `length` slots hold prompt_ids[:length] (a cached prefix; at most the
        # prompt's head), copied instead of computed at the prefill's start.
        self.prompt_cache = prompt_cache
        self.reused_prompt_tokens = 0
        self._planned_k: int | None = None  # K chosen ahead of the round (plan_k), used by its _draft
        self._forced = False  # this round's draft is the grammar's forced tokens
        self._prefill_done = False
        self._prompt_features: list[torch.Tensor] = []  # feature drafters: each prefill chunk's (n, C x layers)
        self.rounds: list[RoundStats] = []
        self.started = time.perf_counter()
        self.prefill_seconds = 0.0
        self.seconds: float | None = None  # wall time, set when the generation ends

    def chunks(self) -> Iterator[StreamChunk]:
        self.begin()
        while self.committer.finish_reason is None:
            chunk = self.round().stream_chunk()
            if chunk is not None:
                yield chunk
        self.seconds = time.perf_counter() - self.started

    @property
    def finished(self) -> bool:
        return self.committer.finish_reason is not None

    def begin(self) -> None:
        """Prefill, for a driver that runs the rounds itself (run_round_together) instead of chunks()."""
        while not self.prefilled:
            self.prefill_step()

    @property
    def prefilled(self) -> bool:
        return self._prefill_done

    @property
    def prompt_tokens_left(self) -> int:
        """Prompt tokens the prefill has still to compute (a prefix cache's hit not yet counted)."""
        return 0 if self._prefill_done else len(self.prompt_ids) - 1 - self.cache.length

    def prefill_step(self, max_tokens: int | None = None) -> int:
        """Prefill up to about max_tokens more prompt tokens (None: the rest); the tokens prefilled. A scheduler
        spreads a long prompt over several steps this way, so that it does not stall the running streams.
        Chunks end where the target's prefill can stop without changing its keys and values
        (`reusable_prefix`), so a chunked prompt decodes exactly as one prefilled at once; where the target
        has no such points (a GPU, a sliding window), the whole prompt goes at once."""
        head = self.prompt_ids[:-1]
        start = self.cache.length
        if start == 0 and self.prompt_cache is not None:
            start = self._reuse_prompt_cache(head)
        stop = len(head)
        if max_tokens is not None and stop - start > max_tokens:
            step = max(1, max_tokens)
            point = self.target.reusable_prefix(start + step)
            while point <= start and start + step < stop:  # the next stopping point lies further on
                step *= 2
                point = self.target.reusable_prefix(start + step)
            stop = point if start < point < stop else stop
        if stop > start:
            tokens = torch.tensor([head[start:stop]], device=self.target.device)  # (1, n)
            out = self.target.forward(tokens, positions_after(start, stop - start, 1, tokens.device), self.cache,
                                      hidden_layers=self.hidden_layers, last_logits_only=True)
            if self.hidden_layers:
                self._prompt_features.append(self._features_of(out))  # (n, C x layers)
        if stop == len(head):
            self._finish_prefill()
        return stop - start

    def result(self) -> GenerationResult:
        memory = 0 if self.drafter is None else self.drafter.memory_bytes()
        seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.started
        stats = GenerationStats.from_rounds(
            self.engine.drafter_name, len(self.prompt_ids), self.rounds, seconds, self.prefill_seconds, memory
        )
        c = self.committer
        return GenerationResult(c.text, list(c.token_ids), c.finish_reason or "length", stats,
                                None if self.logprobs is None else self.token_logprobs[:len(c.token_ids)])

    # -- the phases -------------------------------------------------------------------------
    def use_prompt_cache(self, cache) -> None:
        """Before the prefill: copy the first `cache.length` slots of `cache` (keys and values of the prompt's
        first tokens, a prefix cache's hit) instead of computing them. None: compute them all."""
        if self.cache.length or self._prefill_done:
            raise RuntimeError("a prompt cache is taken before the prefill starts")
        self.prompt_cache = cache

    def _reuse_prompt_cache(self, head: list[int]) -> int:
        """Copy the given prompt cache's slots (keys and values of head's first tokens, `prompt_cache.length`
        of them) instead of computing them; the tokens reused. Feature drafters need the prompt's features,
        which a cache does not hold: they prefill it all."""
        given, self.prompt_cache = self.prompt_cache, None
        length = min(given.length, len(head))
        if self.hidden_layers or length == 0 or not self.cache.can_copy_from(given):
            return 0
        if length < len(head) and self.target.reusable_prefix(length) != length:
            return 0  # the rest of the prompt, computed after it, would not be what one prefill computes
        self.cache.copy_prefix_from(given, length)
        self.reused_prompt_tokens = length
        return length

    def _finish_prefill(self) -> None:
        """The prompt is in the target's cache (every token but the last): let the drafter prepare."""
        self._prefill_done = True
        if self.drafter is not None:
            self.drafter.take_prompt_cache(self.cache)  # self-drafts of the target's layout reuse its prefill
            self.drafter.begin(self.prompt_ids, self.params, self.cache.max_length)
            if self._prompt_features:
                self.drafter.take_features(torch.cat(self._prompt_features))  # (P-1, C x layers)
        self._prompt_features = []
        self.prefill_seconds = time.perf_counter() - self.started

    def round(self) -> CommitOutcome:
        prepared = self.prepare_round()
        t1 = time.perf_counter()
        request = prepared.request
        out = self.target.forward(request.tokens, request.positions, request.cache, request.attn_mask,
                                  hidden_layers=self.hidden_layers)
        return self.finish_round(prepared, out, t1)

    def prepare_round(self, max_draft: int | None = None) -> "PreparedRound":
        """Draft (at most max_draft tokens), and the verify forward's inputs (which a batched round runs
        together with others')."""
        t0 = time.perf_counter()
        draft = self._draft(max_draft)
        tree = None if draft.is_chain else TokenTree.from_draft(draft.tokens, draft.parents)
        catch_up = self.drafter.catch_up_seconds if self._drafted else 0.0
        return PreparedRound(draft, tree, self._verify_request(draft, tree), time.perf_counter() - t0, catch_up)

    def finish_round(self, prepared: "PreparedRound", out, verify_started: float,
                      verify_ended: float | None = None) -> CommitOutcome:
        """Accept and commit from the verify forward's output `out` (run from verify_started to verify_ended;
        None: until now)."""
        draft, tree = prepared.draft, prepared.tree
        logits = self._verify_outputs(out, draft)
        if logits.device.type == "cuda":  # kernels run asynchronously: let verify time be the GPU's verify time
            torch.cuda.synchronize(logits.device)
        t2 = time.perf_counter()
        result = self._accept(logits, draft, tree)
        outcome = self._commit(draft, result, tree)
        t3 = time.perf_counter()
        verify_seconds = (verify_ended or t2) - verify_started
        if not self._forced:  # a forced draft says nothing of the drafter or of K
            # a catch-up is paid once, not per drafted token: left out of the cost K is chosen by
            self.engine.speculation.observe(len(draft), result.num_accepted,
                                            prepared.draft_seconds - prepared.catch_up_seconds, verify_seconds,
                                            draft.source)
        asked = self._k if draft.asked is None else draft.asked  # a combined drafter's source's own K
        self.rounds.append(RoundStats(asked, len(draft), result.num_accepted, len(outcome.tokens),
                                      prepared.draft_seconds, verify_seconds, t3 - t2))
        return outcome

    def plan_k(self) -> int:
        """The K this round asks of the drafter (its speculation length's choice, once per round), for a
        batched round's planner; 0 without a drafter."""
        if self._planned_k is None:
            self._planned_k = self.engine.speculation.next_k()
        return self._planned_k if self.drafter is not None else 0

    def _draft(self, max_draft: int | None = None) -> Draft:
        # Never draft past what may still be committed or what the cache can hold.
        remaining = self.committer.criteria.max_new_tokens - len(self.committer.token_ids)
        room = self.cache.max_length - self.cache.length - 1 - self.side_capacity
        planned = self._planned_k if self._planned_k is not None else self.engine.speculation.next_k()
        self._planned_k = None
        # The K this round asks of the drafter (stats.k_chosen): the plan, within what the generation and a
        # batch's row budget leave.
        self._k = k = min(planned, remaining - 1, room, planned if max_draft is None else max_draft)
        if self.constraint is not None and self.drafter is not None:
            # Forced tokens are certain under the masked target: drafted whatever K, within the budgets.
            limit = min(MAX_FORCED, remaining - 1, room, MAX_FORCED if max_draft is None else max_draft)
            forced = self.constraint.forced(limit)
            if forced:
                self._drafted, self._forced = False, True  # not the drafter's draft: nothing to tell it
                return Draft.chain(forced)
        self._forced = False
        self._drafted = self.drafter is not None and k > 0
        if not self._drafted:
            return Draft.empty()
        draft = self.drafter.propose(self.context, k, self.params, self.draft_noise)
        return draft if self.constraint is None else self._allowed_part(draft)

    def _allowed_part(self, draft: Draft) -> Draft:
        """The draft up to the first token the grammar forbids after its own prefix, that token included (it
        is rejected; core/constraint.py says why it stays): a chain ends there, a tree loses the nodes
        below it (parents come before their children)."""
        if draft.is_chain:
            keep = min(len(draft), self.constraint.allowed_prefix(draft.tokens) + 1)
            return draft if keep == len(draft) else draft.prefix(keep)
        kept: list[int] = []  # indices of the nodes kept: their ancestors are all allowed
        for node, parent in enumerate(draft.parents):
            if (parent == -1 or parent in kept) and draft.side is None:
                above = [draft.tokens[n] for n in _path(draft.parents, node)[:-1]]
                if self.constraint.allowed_prefix(above) == len(above):
                    kept.append(node)
        if draft.side is not None or len(kept) == len(draft):
            return draft  # side inputs (lookahead) are not verified: the rows they feed stay as they are
        position = {node: index for index, node in enumerate(kept)}
        probs = None if draft.draft_probs is None else draft.draft_probs[kept]
        return Draft([draft.tokens[n] for n in kept],
                     [-1 if draft.parents[n] == -1 else position[draft.parents[n]] for n in kept], probs)

    def _verify_request(self, draft: Draft, tree: TokenTree | None) -> ForwardRequest:
        """The target forward over [last committed] + draft (a tree: one row per node, plus side inputs)."""
        device = self.target.device
        if tree is None:
            tokens = torch.tensor([[self.context[-1], *draft.tokens]], device=device)  # (1, K+1)
            return ForwardRequest(tokens, positions_after(self.cache.length, tokens.shape[1], 1, device), self.cache)
        tokens, positions, mask = tree.verify_inputs(self.context[-1], self.cache.length, device)
        if draft.side is not None:
            tokens, positions, mask = with_side_inputs(draft.side, tokens, positions, mask)
        attn_mask = tree_attention_mask(self.cache.length, mask)  # (1, T+1(+S), cache + T+1(+S))
        return ForwardRequest(tokens, positions, self.cache, attn_mask)

    def _verify_outputs(self, out, draft: Draft) -> torch.Tensor:
        """(K+1, V) logits of the verify forward (a tree: one row per node); keeps the drafter's features."""
        if self.hidden_layers:
            self._features = self._features_of(out)  # (K+1 or T+1, C x layers)
        logits = out.logits[0]
        if draft.side is not None:
            draft.side.outputs = logits[len(draft) + 1:].argmax(-1).tolist()
            logits = logits[: len(draft) + 1]
        return logits

    def _features_of(self, out) -> torch.Tensor:
        """(T, C x layers): the drafter's hidden layers of one forward's rows, side by side in its order."""
        states = [out.hidden_states[layer][0] for layer in self.hidden_layers]
        return states[0] if len(states) == 1 else torch.cat(states, dim=-1)

    def _accept(self, logits: torch.Tensor, draft: Draft, tree: TokenTree | None) -> VerifyResult:
        if self.constraint is not None:  # each row: the target's law masked to what the grammar allows there
            paths = [[]] + [[draft.tokens[n] for n in _path(draft.parents, node)] for node in range(len(draft))]
            logits = masked_logits(logits, self.constraint.masks(paths))  # (K+1 or T+1, V)
        self._round_logits = logits
        if self.params.greedy and self.params.repetition_penalty == 1.0:
            return verify_chain_greedy(logits, draft) if tree is None else verify_tree_greedy(logits, tree)
        history = torch.tensor(self.context, device=logits.device)
        first = len(self.context)  # the absolute position of the first token this round decides
        match = self.engine.acceptance == "match"
        if tree is None:
            target_probs = processed_probs(logits, self.params, history, draft.tokens)  # (K+1, V)
            if match:
                return verify_chain_match(target_probs, draft, self.noise, first)
            return verify_chain_rejection(target_probs, draft, self.noise, first)
        target_probs = tree_processed_probs(logits, self.params, history, tree)  # (T+1, V)
        if match:
            return verify_tree_match(target_probs, tree, self.noise, first)
        return verify_tree_rejection(target_probs, tree, draft.draft_probs, self.noise, first)

    def _commit(self, draft: Draft, result: VerifyResult, tree: TokenTree | None) -> CommitOutcome:
        before = len(self.context)
        outcome = self.committer.commit(result.tokens)
        if self.logprobs is not None and outcome.tokens:  # the rows that decided the kept tokens
            rows = ([0] + [1 + node for node in result.accepted_path])[:len(outcome.tokens)]
            outcome.logprobs = token_logprobs(self._round_logits[rows], outcome.tokens, self.params,
                                              self.context[:before], self.logprobs)
            self.token_logprobs.extend(outcome.logprobs)
        # The cache keeps [last committed] + accepted drafts; the new last token is the next input.
        root_slot = self.cache.length - len(draft) - draft.num_side - 1
        if tree is None:
            self.cache.truncate(root_slot + 1 + result.num_accepted)
        else:  # the accepted path's slots move up behind the root
            self.cache.compact(root_slot + 1, [root_slot + 1 + node for node in result.accepted_path])
        self.context.extend(result.tokens)
        if self.constraint is not None and outcome.finish_reason is None:
            self.constraint.commit(result.tokens)
            if self.constraint.complete:  # the grammar allows nothing more (an end-of-sequence token included)
                end = self.committer.finish("stop")
                outcome = CommitOutcome(outcome.tokens, outcome.text_chunk + end.text_chunk, end.finish_reason,
                                        outcome.logprobs)
        if self.hidden_layers and outcome.finish_reason is None:
            rows = [0] + [1 + node for node in result.accepted_path]  # root, then the accepted drafts
            self.drafter.take_features(self._features[rows])  # (1 + accepted, C)
        if self._drafted and outcome.finish_reason is None:
            self.drafter.on_verified(self.context, draft, result)
        return outcome


# The most grammar-forced tokens drafted in one round (all are accepted; each costs a verify row).
MAX_FORCED = 32


def _path(parents: Sequence[int], node: int) -> list[int]:
    """A draft node's ancestors and itself, root first (indices into the draft)."""
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def with_side_inputs(side: SideInputs, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append a draft's side inputs (lookahead's Jacobi branch) after root + nodes: (1, T+1+S) tokens and
    positions, (T+1+S, T+1+S) mask in which side tokens see the root and their own side mask only."""
    device = tokens.device
    size = len(side)
    root_position = int(positions[0, 0])
    tokens = torch.cat([tokens, torch.tensor([side.tokens], device=device)], dim=1)
    positions = torch.cat([positions, torch.tensor([[root_position + d for d in side.positions]],
                                                   device=device)], dim=1)
    full = torch.zeros(mask.shape[0] + size, mask.shape[0] + size, dtype=torch.bool, device=device)
    full[: mask.shape[0], : mask.shape[0]] = mask
    full[mask.shape[0]:, 0] = True  # the root
    full[mask.shape[0]:, mask.shape[0]:] = side.mask.to(device)
    return tokens, positions, full
