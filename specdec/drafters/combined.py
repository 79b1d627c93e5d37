"""Several chain drafters joined by '+': each round takes what pays of what they propose.

`ngram+draft:MODEL` drafts for free wherever the text repeats the prompt or itself (code edits, quoted
passages) and asks the model elsewhere. Which source drafts a round is the speculation policy's call
(policy.py: a pure function of the round's state, its rules derived from the cost model); this module gathers
that state each round and keeps what it is made of:
- each source's rate: with `k="auto"` (the default) predicted by the source's own AdaptiveK
  (speculation_length.SourceLengths) at its best K from its fitted acceptance per position and its measured
  draft and verify costs, which judges a model by how well it agrees whatever K its recent rounds drafted;
  with a fixed K measured as committed tokens over seconds of its recent rounds (`Throughput`);
- each model's last start (the prefill of its window at its first proposal of an answer) and how long recent
  answers ran (`AnswerLengths`), both shared by this drafter's `fresh` copies, so a served request's drafter
  learns from the requests before it;
- a model's acceptance, carried into each new answer as at most `MODEL_MEMORY_ROUNDS` rounds of evidence, so a
  run of answers of a new kind (translations after answers to questions) soon judges it by themselves.

With `k="auto"` each source drafts to its own length: a lookup's verbatim copies, its weaker guesses and the
model each have an AdaptiveK fitted to their own acceptance, so a copy that runs on is drafted long while the
model's guesses stay short.

Exactness needs nothing new: whichever source proposed, its draft is verified by the same rule.

The sources that did not propose this round keep lagging state (a draft model's cache holds committed
tokens only and catches up at its next proposal), which the drafter contract allows; only the source
that proposed is told the round's result.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Sequence

from specdec.drafters.base import Drafter
from specdec.errors import InvalidParameterError
from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import SourceLengths
from specdec.drafters.policy import MODEL_AFTER_TOKENS, RETRY_EVERY, Choice, ModelState, RoundState, choose

__all__ = ["MODEL_AFTER_TOKENS", "RETRY_EVERY", "AnswerLengths", "CombinedDrafter", "LookupSource", "Throughput"]


RATE_DECAY = 0.8  # weight of the past in each source's rate, per round it drafts
RATED_AFTER = 3  # rounds measured before a rate judges
RECENT_ANSWERS = 16  # answers whose lengths say how much longer the next one is expected to run
# A model's acceptance evidence carried into a new answer, in rounds: a run of answers may change kind (questions,
# translations, code), and whether the model starts is judged by its fit before the new answer has said anything;
# held at this, the last answer outweighs older ones within a few rounds, while the fit within an answer still
# decays slowly, steady over a long one.
MODEL_MEMORY_ROUNDS = 8


@dataclass
class Throughput:
    """Committed tokens per second over a source's recent rounds: the decayed sums of both, so each round
    weighs by its time."""

    tokens: float = 0.0
    seconds: float = 0.0
    rounds: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = RATE_DECAY * self.tokens + tokens
        self.seconds = RATE_DECAY * self.seconds + seconds
        self.rounds += 1

    @property
    def rate(self) -> float | None:
        """Tokens per second, once enough rounds are measured to judge by."""
        return self.tokens / max(self.seconds, 1e-9) if self.rounds >= RATED_AFTER else None


@dataclass
class Answer:
    committed: int = 0  # tokens committed before its latest round (the last round's own are not counted)


class AnswerLengths:
    """How long recent answers ran, shared by a combined drafter's `fresh` copies (a served request's drafter
    learns from the requests before it): whether an answer some tokens in is expected to run long enough for a
    model's start to pay."""

    def __init__(self):
        self.recent: deque[Answer] = deque(maxlen=RECENT_ANSWERS)

    def begin(self) -> Answer:
        """A new answer, its length kept up to date by its drafter."""
        answer = Answer()
        self.recent.append(answer)
        return answer

    def expected_remaining(self, answer: Answer) -> float | None:
        """The tokens `answer` is expected to add: the mean of what the recent answers that ran at least as long
        added after its length (an answer's last round is not counted, so one that ended here counts as
        adding nothing); None while fewer than two ran as long (nothing to go by: a new kind of answer)."""
        longer = [other.committed - answer.committed for other in self.recent
                  if other is not answer and other.committed >= answer.committed]
        return sum(longer) / len(longer) if len(longer) >= 2 else None


class LookupSource:
    """What a combined drafter asks of a source beyond the Drafter interface, declared by the sources that
    are lookups (n-gram): proposing costs next to nothing, so it is asked every round, and its proposal says
    whether it copies a long run of the context verbatim, which the combined drafter takes first; its weaker
    guesses are taken only in rounds no model drafts. Other sources (a draft model) are asked only while they
    pay."""

    def proposal_is_verbatim(self) -> bool:
        return False


class CombinedDrafter(Drafter):
    drafts_per_source = True

    def __init__(self, sources: Sequence[Drafter], model_after_tokens: int = MODEL_AFTER_TOKENS,
                 start_seconds: list[float | None] | None = None, answers: AnswerLengths | None = None):
        """start_seconds: each model's last measured start (the prefill of its first proposal of an answer),
        and answers: how long recent answers ran, both shared by this drafter's `fresh` copies: what a served
        request's model costs to start, and whether it will pay, is known from the requests before it."""
        if len(sources) < 2:
            raise InvalidParameterError("a combined drafter needs at least two drafters joined by '+'")
        for source in sources:
            if source.feature_layers or source.tree_node_budget is not None or source.side_capacity:
                raise InvalidParameterError(f"drafter {source.name!r} drafts trees or reads the target's features; "
                                            "only chain drafters (ngram, draft:, quant:, layerskip) combine with '+'")
        self.sources = list(sources)
        self.name = "+".join(source.name for source in self.sources)
        # without a lookup to draft the first tokens, waiting for the model would only decode them plainly
        self.model_after_tokens = model_after_tokens if any(isinstance(s, LookupSource) for s in sources) else 0
        self.prompt_length = self.max_length = 0
        self.answers = AnswerLengths() if answers is None else answers
        self.answer = Answer()
        self.reads_logits = any(source.reads_logits for source in self.sources)
        self.proposer: int | None = None
        self.verbatim = False  # the proposer's draft copied a long run of the context
        self.started = 0.0
        self.lengths: SourceLengths | None = None  # each source's K, when K is auto
        self.start_seconds = [None] * len(self.sources) if start_seconds is None else start_seconds
        self.models = [index for index in range(len(self.sources)) if not self._is_lookup(index)]  # cheapest first
        self.begin_rates()

    def begin_rates(self) -> None:
        self.throughputs = [Throughput() for _ in self.sources]  # of the rounds each model drafted
        self.modelless = Throughput()  # of the rounds no model drafted (a weak guess or none)
        self.passed = [0] * len(self.sources)
        self.proposals = [0] * len(self.sources)

    def fresh(self) -> "CombinedDrafter":
        return CombinedDrafter([source.fresh() for source in self.sources], self.model_after_tokens,
                               self.start_seconds, self.answers)

    def memory_bytes(self) -> int:
        return sum(source.memory_bytes() for source in self.sources)

    def take_prompt_cache(self, target_cache) -> None:
        for source in self.sources:
            source.take_prompt_cache(target_cache)

    def take_logits(self, inputs: Sequence[int], logits) -> None:
        for source in self.sources:  # every round's rows, whichever source proposed
            if source.reads_logits:
                source.take_logits(inputs, logits)

    def proposal_source(self) -> str:
        return self.name if self.proposer is None else self.sources[self.proposer].proposal_source()

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        for source in self.sources:
            source.begin(prompt_ids, params, max_length)
        self.prompt_length, self.max_length = len(prompt_ids), max_length
        self.answer = self.answers.begin()
        self.begin_rates()
        if self.lengths is not None:
            for index in range(len(self.sources)):
                if not self._is_lookup(index):
                    self.lengths.keep_at_most((index, "draft"), MODEL_MEMORY_ROUNDS)

    def use_source_lengths(self, lengths: SourceLengths) -> None:
        self.lengths = lengths

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        self.proposer = None
        self.started = time.perf_counter()
        committed = self.answer.committed = len(context) - self.prompt_length
        verbatim, guess = self._ask_lookups(context, max_tokens, params, noise)
        state = self._round_state(committed, verbatim is not None, guess)
        decision = choose(state)
        if decision.choice is Choice.VERBATIM:
            index, draft, k = verbatim
            return self._chosen(index, (index, "verbatim"), draft.prefix(k), k, verbatim=True)
        while True:
            for model in decision.passed_over:
                self.passed[self.models[model]] += 1
            if decision.choice is not Choice.MODEL:
                break
            index = self.models[decision.model]
            key = (index, "draft")
            k = self._length(key, max_tokens)
            draft = self.sources[index].propose(context, k, params, noise) if k else Draft.empty()
            if len(draft):
                return self._chosen(index, key, draft, k, verbatim=False)
            decision = choose(state, after=decision.model)  # it proposed nothing: the models after it
        if decision.fallback is Choice.GUESS:
            key = (guess[0], "guess")
            k = self._length(key, max_tokens)
            if k:
                return self._chosen(guess[0], key, guess[1].prefix(k), k, verbatim=False)
        self.catch_up_seconds = 0.0
        return Draft.empty() if self.lengths is None else replace(Draft.empty(), asked=0)

    def _ask_lookups(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                     noise: NoiseStream | None) -> tuple[tuple[int, Draft, int] | None, tuple[int, Draft] | None]:
        """(a lookup's verbatim copy with the K its kind drafts, if one copies; the first weaker guess): a
        lookup costs nothing to ask, and its proposal says which kind it is."""
        guess = None
        for index, source in enumerate(self.sources):
            if not isinstance(source, LookupSource):
                continue
            draft = source.propose(context, max_tokens, params, noise)
            if len(draft) and source.proposal_is_verbatim():
                k = self._length((index, "verbatim"), max_tokens)
                if k:
                    return (index, draft, k), guess
            elif len(draft) and guess is None:
                guess = (index, draft)
        return None, guess

    def _round_state(self, committed: int, verbatim: bool, guess: tuple[int, Draft] | None) -> RoundState:
        models = tuple(ModelState(self._model_rate(index), self.start_seconds[index], self.proposals[index] > 0,
                                  self.passed[index]) for index in self.models)
        return RoundState(committed, self.answers.expected_remaining(self.answer),
                          self.max_length - self.prompt_length - committed, verbatim, guess is not None,
                          self._modelless_rate(guess), models, self.model_after_tokens)

    def _chosen(self, index: int, key: tuple[int, str], draft: Draft, k: int, verbatim: bool) -> Draft:
        """Source `index`'s draft (of its kind `key`, asked for `k` tokens) as this round's proposal."""
        self.proposer, self.verbatim = index, verbatim
        self.catch_up_seconds = self.sources[index].catch_up_seconds
        if not self._is_lookup(index) and self.proposals[index] == 0:
            self.start_seconds[index] = self.catch_up_seconds  # its first proposal: a prefill of its start
        return draft if self.lengths is None else replace(draft, source=key, asked=k)

    def _length(self, key: tuple[int, str], max_tokens: int) -> int:
        """How many tokens source kind `key` drafts this round: its own K when K is auto, else max_tokens.
        A model's K is at least 1: whether it drafts at all is the policy's call, which retries it every few
        rounds; a K of 0 was a second switch, which a first round or two of rejections left off for most of an
        answer (a longer K is probed only every 16 rounds)."""
        if self.lengths is None:
            return max_tokens
        return min(max_tokens, self.lengths.next_k_for(key, min_k=int(key[1] == "draft")))

    def _model_rate(self, index: int) -> float | None:
        """Model `index`'s tokens per second: predicted at its best K when K is auto, else measured."""
        if self.lengths is None:
            return self.throughputs[index].rate
        return self.lengths.predicted_rate((index, "draft"), min_k=1)

    def _modelless_rate(self, guess: tuple[int, Draft] | None) -> float | None:
        """Tokens per second of this round without a model: lookup's weak guess (`guess`, its predicted rate
        at its best K, which may be a plain step) or else a plain step, when K is auto; else the measured rate
        of the rounds no model drafted."""
        if self.lengths is None:
            return self.modelless.rate
        guessed = self.lengths.predicted_rate((guess[0], "guess")) if guess is not None else None
        rates = [rate for rate in (guessed, self.lengths.plain_rate()) if rate is not None]
        return max(rates) if rates else None

    def _is_lookup(self, index: int) -> bool:
        return isinstance(self.sources[index], LookupSource)

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        # A draft model's catch-up on what other sources committed is the price of the rounds it sat out,
        # not of this one: counted here it made a model tried now and then look slower than a plain step,
        # so it sat out more and caught up on more at its next try.
        seconds = time.perf_counter() - self.started - self.catch_up_seconds
        if self.proposer is not None:
            self.sources[self.proposer].on_verified(context, draft, result)
            self.proposals[self.proposer] += 1
        if self.lengths is not None:
            return  # with K auto the rates are predicted from SourceLengths' measurements, not measured here
        if self.proposer is None or (self._is_lookup(self.proposer) and not self.verbatim):
            # what the rounds without a model commit: the alternative the last model is measured against
            self.modelless.add(len(result.tokens), seconds)
            return
        if self.proposals[self.proposer] == 1 or self.verbatim:
            # A model's first round is cold (it prefills the prompt in it). A verbatim copy is taken whatever
            # the rates say, and its high yield must not count for the rounds without a model.
            return
        self.throughputs[self.proposer].add(len(result.tokens), seconds)
