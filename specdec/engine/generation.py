"""One generation: its caches, committed tokens, random numbers and stats, driven round by round."""

from __future__ import annotations

import time
from functools import partial
import torch

from specdec.core.commit import Committer, CommitOutcome, StopCriteria
from specdec.core.constraint import Constraint
from specdec.core.randomness import PositionalNoise, Purpose, random_seed
from specdec.core.rounds import Draft, GenerationResult, TokenLogprob
from specdec.core.sampling import SamplingParams
from specdec.core.stats import GenerationStats, RoundStats
from specdec.core.tree import TokenTree
from specdec.core.verify import Acceptance
from specdec.engine.prefill import PromptPrefill, criteria_within_context
from specdec.engine.round import Round, Verified, accept, judging_logits, verify_request
from specdec.engine.round_steps import round_steps


class Generation:
    """Prefilled (`begin`, or `prefill_step` in chunks), then driven round by round by
    `run_round_together` (engine/batched.py: `plan_k`, `prepare_round`, the verify forwards, `finish_round`),
    alone (`run_alone`) or with others (a batch runner), then `result()`."""

    def __init__(self, engine, prompt_ids: list[int], params: SamplingParams, criteria: StopCriteria, tokenizer,
                 seed: int | None, prompt_cache=None, constraint: Constraint | None = None,
                 logprobs: int | None = None):
        target = engine.target
        criteria = criteria_within_context(prompt_ids, criteria, target.max_context, seed)
        self.engine, self.target, self.drafter, self.params = engine, target, engine.drafter, params
        self.prompt_ids = prompt_ids
        self.context = list(prompt_ids)  # prompt + committed tokens
        self.committer = Committer(tokenizer, criteria)
        self.noise = PositionalNoise(seed if seed is not None else random_seed())
        # Under the match rule a sampling drafter draws with the target's own uniforms (coupled: its token
        # agrees with the target's as often as their CDFs allow); under the rejection rule with its own.
        self.draft_noise = self.noise.stream(Purpose.TOKEN if engine.acceptance is Acceptance.MATCH else Purpose.DRAFT)
        self.hidden_layers = () if self.drafter is None else tuple(self.drafter.feature_layers)
        # Drafters with side inputs (lookahead) need that many more slots in each verify forward.
        self.side_capacity = 0 if self.drafter is None else self.drafter.side_capacity
        capacity = min(target.max_context,
                       len(prompt_ids) + criteria.max_new_tokens + engine.speculation.max_k + 1 + self.side_capacity)
        self.cache = target.new_cache(1, capacity)
        self.token_logprobs: list[TokenLogprob] | None = None if logprobs is None else []
        self.steps = round_steps(self.drafter, self.hidden_layers, self.params, self.committer, constraint,
                                 logprobs, self.token_logprobs)
        # The prefill's callback reaches the steps, not this generation: a bound method here would make a
        # reference cycle, and the KV cache would outlive the generation until the cyclic collector ran.
        self.prefill = PromptPrefill(target, self.cache, prompt_ids, self.hidden_layers,
                                     partial(prefill_output, self.steps), prompt_cache)
        self.rounds: list[RoundStats] = []
        self.started = time.perf_counter()
        self.prefill_seconds = 0.0
        self.seconds: float | None = None  # wall time, set when the generation ends

    # -- driving it (engine/batched.py: run_alone, or a batch runner) ------------------------------
    @property
    def finished(self) -> bool:
        return self.committer.finish_reason is not None

    def result(self) -> GenerationResult:
        memory = 0 if self.drafter is None else self.drafter.memory_bytes()
        seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.started
        stats = GenerationStats.from_rounds(
            self.engine.drafter_name, len(self.prompt_ids), self.rounds, seconds, self.prefill_seconds, memory,
            cached_prompt_tokens=self.prefill.reused_tokens)
        c = self.committer
        logprobs = None if self.token_logprobs is None else self.token_logprobs[:len(c.token_ids)]
        return GenerationResult(c.text, list(c.token_ids), c.finish_reason or "length", stats, logprobs)

    # -- prefill ---------------------------------------------------------------------------------
    def begin(self) -> None:
        """Prefill the whole prompt (what is left of it)."""
        while not self.prefilled:
            self.prefill_step()

    @property
    def prefilled(self) -> bool:
        return self.prefill.done

    def prefill_step(self, max_tokens: int | None = None) -> int:
        """Prefill up to about max_tokens more prompt tokens (None: the rest): a scheduler spreads a long
        prompt over several steps this way, so that it does not stall the running streams (PromptPrefill)."""
        done = self.prefill.step(max_tokens)
        if self.prefill.done:  # the prompt is in the target's cache (every token but the last)
            if self.drafter is not None:
                self.drafter.take_prompt_cache(self.cache)  # self-drafts of the target's layout reuse its prefill
                self.drafter.begin(self.prompt_ids, self.params, self.cache.max_length)
            for step in self.steps:
                step.prefill_done()
            self.prefill_seconds = time.perf_counter() - self.started
        return done

    # -- a round: draft -> verify -> accept -> commit ---------------------------------------------
    def plan_k(self) -> int:
        """The K this round asks of the drafter (its speculation length's choice, once per round); 0 without
        a drafter."""
        return self.engine.speculation.next_k() if self.drafter is not None else 0

    def prepare_round(self, max_draft: int | None = None, planned_k: int | None = None) -> Round:
        """Draft (at most max_draft tokens; K as planned, None: planned now) and the verify forward's inputs,
        which a batched round runs together with others'. Never past what may still be committed or what
        the cache can hold."""
        started = time.perf_counter()
        remaining = self.committer.criteria.max_new_tokens - len(self.committer.token_ids)
        room = self.cache.max_length - self.cache.length - 1 - self.side_capacity
        budget = min(remaining - 1, room, remaining if max_draft is None else max_draft)
        k = min(self.plan_k() if planned_k is None else planned_k, budget)
        forced = next((tokens for tokens in (step.forced_draft(budget) for step in self.steps) if tokens), [])
        proposed = not forced and self.drafter is not None and k > 0
        draft = Draft.chain(forced) if forced else Draft.empty()
        if proposed:
            draft = self.drafter.propose(self.context, k, self.params, self.draft_noise)
            for step in self.steps:
                draft = step.filter_draft(draft)
        tree = None if draft.is_chain else TokenTree.from_draft(draft.tokens, draft.parents)
        request = verify_request(draft, tree, self.context[-1], self.cache, self.target.device)
        source = self.drafter.proposal_source() if proposed else ("grammar" if forced else None)
        return Round(k, draft, tree, request, len(self.context), proposed, bool(forced),
                     time.perf_counter() - started, self.drafter.catch_up_seconds if proposed else 0.0,
                     source=source)

    def finish_round(self, round: Round, out, verify_started: float, verify_ended: float | None = None
                     ) -> CommitOutcome:
        """Accept and commit from the verify forward's output `out` (run from verify_started to verify_ended;
        None: until now)."""
        logits = judging_logits(out, round.draft)
        for step in self.steps:
            step.verify_output(round, out)
        if logits.device.type == "cuda":  # kernels run asynchronously: let verify time be the GPU's verify time
            torch.cuda.synchronize(logits.device)
        accepting = time.perf_counter()
        for step in self.steps:
            logits = step.mask(round, logits)
        result = accept(round, logits, self.params, self.engine.acceptance, self.context, self.noise)
        verified = Verified(round, logits, result, (verify_ended or accepting) - verify_started, out.experts_per_layer)
        outcome = self._commit(verified)
        if not round.forced:
            self.engine.speculation.observe(len(round.draft), result.num_accepted, round.drafting_seconds,
                                            verified.verify_seconds, round.draft.source)
        self.rounds.append(verified.stats(len(outcome.tokens), time.perf_counter() - accepting))
        outcome.provenance = verified.provenance(len(outcome.tokens), self.rounds[-1])
        return outcome

    def _commit(self, verified: Verified) -> CommitOutcome:
        round, result = verified.round, verified.result
        outcome = self.committer.commit(result.tokens)
        verified.keep_accepted_in_cache()
        self.context.extend(result.tokens)
        for step in self.steps:
            outcome = step.committed(verified, outcome, self.context)
        if round.proposed and outcome.finish_reason is None:
            self.drafter.on_verified(self.context, round.draft, result)
        return outcome

def prefill_output(steps, out) -> None:
    """Each round step sees each prefill chunk's forward output (features for the drafters that read them)."""
    for step in steps:
        step.prefill_output(out)
