"""The drafter protocol: what the engine asks of every drafter.

A drafter proposes a `Draft` for the tokens after the committed context, is
told the `VerifyResult` so it can roll back its own state and adapt, and is
reset by `begin` for each new generation. The engine never knows which drafter
it runs.

Cache contract (invariant 2): after `on_verified`, whatever state a drafter
keeps (a KV cache, an index) describes committed tokens only. It may lag behind
the committed context; the next `propose` catches up first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from specdec.sampling import SamplingParams


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
    # per-token cost figures the drafter wants reported; filled by drafters that measure them
    info: dict[str, float] = field(default_factory=dict)
    # Side inputs (lookahead decoding's Jacobi branch): tokens the target also runs in the verify forward
    # but that are never verified or kept. side_positions are offsets from the root's position;
    # side_mask[i, j] says whether side token i attends to side token j (all see the committed prefix and
    # the root, none sees the draft nodes, and no draft node sees them). The engine fills side_outputs
    # with the target's argmax after each side token.
    side_tokens: list[int] = field(default_factory=list)
    side_positions: list[int] = field(default_factory=list)
    side_mask: torch.Tensor | None = None  # (S, S) bool
    side_outputs: list[int] | None = None

    @classmethod
    def chain(cls, tokens: Sequence[int], draft_probs: torch.Tensor | None = None) -> "Draft":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    @classmethod
    def empty(cls) -> "Draft":
        return cls([], [], None)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1)) and not self.side_tokens


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


class Drafter(Protocol):
    name: str

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams, max_length: int) -> None:
        """Forget the previous generation and get ready for this prompt.

        max_length bounds prompt + committed + drafted tokens of this generation (size caches by it).
        """

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        """Up to max_tokens draft tokens that follow `context` (prompt + committed tokens)."""

    def on_verified(self, context: Sequence[int], draft: Draft, result: VerifyResult) -> None:
        """Roll own state back to committed tokens; `context` already includes result.tokens."""

    def fresh(self) -> "Drafter":
        """A drafter with this one's settings and shared weights but its own per-generation state,
        for generations that run interleaved (the server)."""


class FeatureDrafter(Drafter, Protocol):
    """A drafter that reads the target's hidden states (EAGLE, Medusa).

    The engine asks the target for hidden layer `feature_layer` in every forward and hands the drafter
    the rows of committed tokens: after prefill those of prompt[:-1], after each round those of the
    round's root and accepted drafts. So when `propose` runs, the drafter has had the feature of every
    context token but the last (which the target has not processed yet)."""

    feature_layer: int

    def take_features(self, features: torch.Tensor) -> None:
        """features (n, C): the target's hidden states of the next n committed tokens, in order."""
