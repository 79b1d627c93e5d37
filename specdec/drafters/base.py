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

import sys
from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

import torch
from torch import nn

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

    def memory_bytes(self) -> int:
        """Bytes this drafter holds beyond the target: its own weights (not those it shares with the
        target), caches and indexes, at their current size. Reported as stats.drafter_memory_bytes."""


def tensor_bytes(tensors: Iterable[torch.Tensor | None], shared_with: nn.Module | None = None) -> int:
    """Bytes of distinct tensors (by storage), leaving out those that live in `shared_with`."""
    shared = set()
    if shared_with is not None:
        shared = {t.untyped_storage().data_ptr() for t in [*shared_with.parameters(), *shared_with.buffers()]}
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None and tensor.untyped_storage().data_ptr() not in shared:
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def module_bytes(module, shared_with: nn.Module | None = None) -> int:
    """Bytes of a module's own tensors (0 for what is not an nn.Module, e.g. a transformers adapter)."""
    if not isinstance(module, nn.Module):
        return 0
    return tensor_bytes([*module.parameters(), *module.buffers()], shared_with)


def container_bytes(value) -> int:
    """Bytes of a Python index (dicts, lists, tuples, sets of ints), as sys.getsizeof counts its objects."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(container_bytes(k) + container_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return size + sum(container_bytes(item) for item in value)
    return size


class FeatureDrafter(Drafter, Protocol):
    """A drafter that reads the target's hidden states (EAGLE, Medusa).

    The engine asks the target for hidden layer `feature_layer` in every forward and hands the drafter
    the rows of committed tokens: after prefill those of prompt[:-1], after each round those of the
    round's root and accepted drafts. So when `propose` runs, the drafter has had the feature of every
    context token but the last (which the target has not processed yet)."""

    feature_layer: int

    def take_features(self, features: torch.Tensor) -> None:
        """features (n, C): the target's hidden states of the next n committed tokens, in order."""
