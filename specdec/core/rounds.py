"""The round's types: what a drafter proposes, what verification decides, what a generation returns.

These live in the core, below both the engine/verifier and the drafters: drafters import them, the
core never imports a drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Hashable, Sequence

import torch

from specdec.core.stats import GenerationStats


@dataclass
class SideInputs:
    """Tokens the target also runs in the verify forward but that are never verified nor kept in the cache
    (lookahead decoding's Jacobi branch).

    positions are offsets from the root's position; mask[i, j] says whether side token i attends to side
    token j (all see the committed prefix and the root, none sees the draft nodes, and no draft node sees
    them). The engine fills `outputs` with the target's argmax after each side token.
    """

    tokens: list[int]
    positions: list[int]
    mask: torch.Tensor  # (S, S) bool
    outputs: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Draft:
    """Proposed tokens after the last committed token.

    tokens[i]'s parent is parents[i] (an index into tokens, or -1 for the last
    committed token), so trees fit the same type; a chain has parents [-1, 0, 1, ...].
    draft_probs[i] is the processed distribution tokens[i] was sampled from, or
    None for a deterministic drafter (then it is one-hot at tokens[i]).
    """

    tokens: list[int]
    parents: list[int]
    draft_probs: torch.Tensor | None = None  # (N, V) float32
    side: SideInputs | None = None
    # A drafter that combines sources says which one proposed, and the length that source was asked for:
    # K is then measured per source (speculation_length.SourceLengths). None: the drafter is one source.
    source: Hashable | None = None
    asked: int | None = None

    @classmethod
    def chain(cls, tokens: Sequence[int], draft_probs: torch.Tensor | None = None) -> "Draft":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    def prefix(self, n: int) -> "Draft":
        """A chain's first n tokens, with their distributions and where they came from."""
        assert self.is_chain, "only a chain has a prefix"
        probs = None if self.draft_probs is None else self.draft_probs[:n]
        return replace(self, tokens=self.tokens[:n], parents=self.parents[:n], draft_probs=probs)

    @classmethod
    def empty(cls) -> "Draft":
        return cls([], [], None)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_side(self) -> int:
        return 0 if self.side is None else len(self.side)

    @property
    def is_chain(self) -> bool:
        return self.side is None and self.parents == list(range(-1, len(self.tokens) - 1))


@dataclass
class VerifyResult:
    """What verification decided for one round.

    accepted_path: indices into Draft.tokens of the accepted draft tokens, root first.
    tokens: the committed tokens: the accepted draft tokens, then one more token
    (recovered at the first rejection, or the bonus token when all were accepted).
    """

    num_drafted: int
    accepted_path: list[int]
    tokens: list[int]

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_path)


@dataclass
class TokenLogprob:
    """A committed token's log-probability under the distribution it was drawn from (core/sampling.py's
    `token_logprobs`), and the likeliest tokens there with theirs."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token, logprob), likeliest first


# How a committed token was made: a draft token the target accepted ("drafted", proposed by the round's
# `source`; "forced" when the grammar allowed only it), or the target's own token: "recovered" where it
# rejected a draft token, "bonus" after the whole draft was accepted, "target" in a round with no draft.
ORIGINS = ("drafted", "forced", "recovered", "bonus", "target")


@dataclass(frozen=True)
class RoundProvenance:
    """One round's committed tokens and how each was made, with the round's figures."""

    origins: tuple[str, ...]  # one per committed token, from ORIGINS
    source: str | None  # what proposed the draft: the drafter (or its source), "grammar"; None: no draft
    k: int  # the speculation length asked
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float

    @property
    def accepted_committed(self) -> int:
        """Draft tokens among the committed ones (a stop or the length limit may cut accepted ones)."""
        return sum(origin in ("drafted", "forced") for origin in self.origins)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" or "length"
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for


@dataclass
class StreamChunk:
    text: str  # new text (may be empty while a multi-byte character or stop string is pending)
    token_ids: list[int]  # tokens committed this round
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for
    provenance: RoundProvenance | None = None  # how this round's tokens were made
