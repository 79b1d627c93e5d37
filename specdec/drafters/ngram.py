"""N-gram / prompt-lookup drafting: no model, almost no cost.

Match the last n tokens of the context (several n, longest first) against the
prompt and the generated text, and propose what followed the most recent
earlier occurrence. Pays off where the answer repeats its input: code edits,
summaries that quote, retrieval-augmented answers.

The index maps every n-gram to the position after its latest occurrence and is
updated incrementally with committed tokens only, so a round costs a few dict
look-ups. Proposals are deterministic (draft_probs None = one-hot), which the
verifier handles exactly under sampling too.

Two things keep lookup from proposing what the target will not say: a proposal
stops before a control token (a chat prompt's suffix matched in the template
continues with <|im_start|>, which an answer never contains), and a match whose
first token was rejected is not proposed again until the index moves on to a
newer occurrence of its n-gram (a shorter n-gram may still match).

With `@memory=TOKENS`, where the context has no match the drafter asks a memory of what earlier
generations produced (continuation_memory.py), shared by the requests a server runs with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specdec.drafters.base import Drafter, container_bytes
from specdec.drafters.combined import LookupSource
from specdec.drafters.continuation_memory import ContinuationMemory
from specdec.core.randomness import NoiseStream
from specdec.core.rounds import Draft, VerifyResult
from specdec.errors import InvalidParameterError
from specdec.core.sampling import SamplingParams


# A match of this many tokens or more is a verbatim copy (code being edited, a passage quoted): rarely wrong.
VERBATIM_MATCH = 3


class NgramDrafter(Drafter, LookupSource):
    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, never_propose: frozenset[int] = frozenset(),
                 memory: ContinuationMemory | None = None, name: str = "ngram"):
        """memory: continuations of earlier generations, shared by this drafter's `fresh` copies, asked
        where the context itself has no match (None: this generation's context only)."""
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError("ngram sizes need 1 <= min_ngram <= max_ngram")
        self.name = name
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.never_propose = never_propose
        self.memory = memory
        self.sizes = list(range(max_ngram, min_ngram - 1, -1))  # longest first
        self.begin([], SamplingParams(), 0)

    def fresh(self) -> "NgramDrafter":
        return NgramDrafter(self.max_ngram, self.min_ngram, self.never_propose, self.memory, self.name)

    def memory_bytes(self) -> int:
        return container_bytes(self.index) + (self.memory.memory_bytes() if self.memory is not None else 0)

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int = 0) -> None:
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.indexed = 0  # context positions whose n-grams (ending there) are indexed
        self.refuted: set[int] = set()  # continuation starts whose first token the target rejected
        self.proposed_start: int | None = None
        self.matched = 0  # length of the n-gram the last proposal matched (0: none)
        self.remembered = len(prompt_ids)  # context positions handed to the memory (generated tokens only)
        self.sequence = self.memory.start(prompt_ids) if self.memory is not None and prompt_ids else None

    def _remember(self, context: Sequence[int]) -> None:
        if self.sequence is not None and len(context) > self.remembered:
            self.memory.extend(self.sequence, context[self.remembered:])
            self.remembered = len(context)

    def _catch_up(self, context: Sequence[int]) -> None:
        # Index n-grams ending before the last token: only those have a known continuation.
        for end in range(max(self.indexed, 1), len(context)):
            for n in self.sizes:
                if end >= n:
                    self.index[n][tuple(context[end - n:end])] = end
        self.indexed = max(self.indexed, len(context))

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                noise: NoiseStream | None) -> Draft:
        self._catch_up(context)
        self._remember(context)
        self.proposed_start, self.matched = None, 0
        for n in self.sizes:
            if len(context) <= n:
                continue
            start = self.index[n].get(tuple(context[-n:]))
            if start is None or start in self.refuted:
                continue
            tokens = self._proposable(context[start:start + max_tokens])
            if tokens:
                self.proposed_start, self.matched = start, n
                return Draft.chain(tokens)
        if self.memory is not None:
            tokens, matched = self.memory.propose(context, max_tokens)
            tokens = self._proposable(tokens)
            if tokens:
                self.matched = matched
                return Draft.chain(tokens)
        return Draft.empty()

    def _proposable(self, tokens: Sequence[int]) -> list[int]:
        """The tokens before the first control token (an answer never contains the template's markers)."""
        for i, token in enumerate(tokens):
            if token in self.never_propose:
                return list(tokens[:i])
        return list(tokens)

    def proposal_is_verbatim(self) -> bool:
        return self.matched >= VERBATIM_MATCH

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        # The index holds committed tokens only; new ones are indexed at the next propose.
        self._remember(context)
        if self.proposed_start is not None and result.num_accepted == 0:
            self.refuted.add(self.proposed_start)


@dataclass(frozen=True)
class NgramOptions:
    """ngram@memory=TOKENS: remember earlier generations' outputs, up to TOKENS tokens (None: none)."""

    memory: int | None = None

    def __post_init__(self):
        if self.memory is not None and self.memory < 1:
            raise InvalidParameterError("memory=TOKENS takes a positive number of tokens")


def check(spec) -> None:
    """`ngram[:MAX_N][@memory=TOKENS]`'s values, before anything loads."""
    if spec.argument and not (spec.argument.isdigit() and int(spec.argument) >= 1):
        raise InvalidParameterError(f"ngram drafter: {spec.argument!r} is not a maximum n-gram size")


def build(spec, target, device: str, dtype: str) -> NgramDrafter:
    """`ngram[:MAX_N][@memory=TOKENS]` (a spec.DrafterSpec)."""
    check(spec)
    memory = ContinuationMemory(spec.options.memory) if spec.options.memory is not None else None
    return NgramDrafter(max_ngram=int(spec.argument) if spec.argument else 4,
                        never_propose=target.control_token_ids(), memory=memory, name=spec.text or "ngram")
