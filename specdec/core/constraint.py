"""Constrained generation: what the round asks of a grammar, and how a mask changes the target's law.

A constraint (a JSON schema, a regex, a grammar) allows, after each prefix, a set of next tokens. The
output law of constrained generation is the target's distribution masked to that set and renormalized:
what plain constrained decoding samples. Speculation keeps it exactly:
  - the verify forward's rows are masked, each with the set allowed after its own prefix (the committed
    text plus the drafts before it), before greedy choice or sampling: the acceptance rules then compare
    drafts with the masked target;
  - a drafted token the grammar forbids ends the draft: it stays as the draft's last token (the masked
    target gives it probability 0, so it is rejected; under the rejection rule the token then drawn is
    the residual's, max(0, masked target - draft), whose identity needs the forbidden token's draft mass
    counted: cutting the draft before it and drawing from the masked target would not be exact), and
    nothing after it is verified;
  - tokens the grammar forces (one allowed continuation) are drafted for free: the masked target puts
    all its mass on them, so each is accepted, and the target still computes its row (jump-forward as
    drafting, never as skipping the target).
Rows are masked after the sampling settings' own processing would see them: the logits of forbidden
tokens become -inf, so temperature, top-k, top-p and min-p act on the allowed tokens only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch


class Constraint(ABC):
    """One generation's grammar state. The engine calls it each round: `forced` and `allowed_prefix` while
    drafting, `masks` for the verify rows, `commit` with the tokens the round committed."""

    @abstractmethod
    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces from the committed state (none where it allows a choice)."""

    @abstractmethod
    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order from the committed state, the grammar allows."""

    @abstractmethod
    def masks(self, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """(len(paths), V) bool: the tokens allowed after the committed state followed by each path. A chain's
        rows: paths [], [d1], [d1, d2], ... A path the grammar does not allow (it ends in a forbidden draft
        token) gets a row allowing every token: that row is never used, its path's last token being
        rejected."""

    @abstractmethod
    def commit(self, tokens: Sequence[int]) -> None:
        """Advance the committed state by tokens the round committed (an end-of-sequence token included)."""

    @property
    @abstractmethod
    def complete(self) -> bool:
        """Whether the grammar allows nothing more: the generation ends here."""


def masked_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits (T, V') with every token not allowed (T, V) at -inf; columns past V (padding rows of an LM head
    wider than the tokenizer) are never allowed."""
    out = torch.full_like(logits, float("-inf"))
    width = min(logits.shape[-1], allowed.shape[-1])
    out[:, :width] = logits[:, :width].masked_fill(~allowed[:, :width].to(logits.device), float("-inf"))
    return out
