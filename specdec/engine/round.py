"""One round as values, one per phase: the draft phase makes a `Round` (what it drafted, what the target is
asked), verification and acceptance make a `Verified` (the rows that judged the draft, what was accepted),
the commit consumes it; nothing of them outlives its round.

The functions here are the parts of a round that depend on nothing but its values: the verify forward's
inputs (a chain, a tree, a tree with side inputs), the rows of the target's output that judge the draft,
the acceptance rule applied to them, and the cache kept afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.core.randomness import PositionalNoise
from specdec.core.rounds import Draft, RoundProvenance, SideInputs, VerifyResult
from specdec.core.sampling import SamplingParams, processed_probs, tree_processed_probs
from specdec.core.stats import RoundStats
from specdec.core.tree import TokenTree
from specdec.core.verify import (Acceptance, verify_chain_greedy, verify_chain_match, verify_chain_rejection, verify_tree_greedy,
                                 verify_tree_match, verify_tree_rejection)
from specdec.models.base import ForwardRequest, positions_after, tree_attention_mask


@dataclass(frozen=True)
class Round:
    """The draft phase's value: what was drafted and what the verify forward is asked. Complete when made."""

    k: int  # the K asked of the drafter (stats.k_chosen), within the generation's and the batch's budgets
    draft: Draft
    tree: TokenTree | None  # None: the draft is a chain
    request: ForwardRequest  # the verify forward: [last committed] + draft (+ side inputs)
    position: int  # the absolute position of the first token this round decides (the context's length)
    proposed: bool  # the drafter proposed the draft (it hears of the outcome); not a forced or an empty one
    forced: bool  # the grammar's forced tokens: they say nothing of the drafter or of K
    draft_seconds: float
    catch_up_seconds: float = 0.0  # of draft_seconds, the drafter catching up with the context (a prefill)
    source: str | None = None  # what proposed the draft: the drafter's source, "grammar" when forced

    @property
    def drafting_seconds(self) -> float:
        """What drafting cost this round's K: a catch-up is paid once, not per drafted token."""
        return self.draft_seconds - self.catch_up_seconds


@dataclass(frozen=True)
class Verified:
    """The verify phase's value: the round, the rows that judged its draft (grammar-masked) and what the
    acceptance rule decided. The commit consumes it."""

    round: Round
    logits: torch.Tensor  # (K+1 or T+1, V)
    result: VerifyResult
    verify_seconds: float  # the target forward
    experts_per_layer: float | None = None  # the verify pass's, on a mixture-of-experts target

    @property
    def kept_rows(self) -> list[int]:
        """The verify rows that decided the committed tokens: the root's, then each accepted draft's."""
        return [0] + [1 + node for node in self.result.accepted_path]

    def stats(self, committed: int, other_seconds: float) -> RoundStats:
        round = self.round
        asked = round.k if round.draft.asked is None else round.draft.asked  # a combined drafter's source's own K
        return RoundStats(asked, len(round.draft), self.result.num_accepted, committed, round.draft_seconds,
                          self.verify_seconds, other_seconds, self.experts_per_layer)

    def provenance(self, committed: int, stats: RoundStats) -> RoundProvenance:
        """How each of the `committed` tokens (the accepted drafts, then the target's own) was made."""
        draft = self.round.draft
        accepted, drafted = self.result.num_accepted, len(draft)
        last = self.result.accepted_path[-1] if self.result.accepted_path else -1
        if drafted == 0:
            own = "target"
        else:  # a rejected child of the last accepted node (or of the root): the target recovered
            own = "recovered" if last in draft.parents else "bonus"
        origins = ("forced" if self.round.forced else "drafted",) * accepted + (own,)
        return RoundProvenance(origins[:committed], self.round.source if drafted else None, stats.k, drafted,
                               accepted, stats.draft_seconds * 1000, stats.verify_seconds * 1000)

    def keep_accepted_in_cache(self) -> None:
        """The cache keeps [last committed] + the accepted drafts; the new last token is the next input."""
        cache, draft, result = self.round.request.cache, self.round.draft, self.result
        root_slot = cache.length - len(draft) - draft.num_side - 1
        if self.round.tree is None:
            cache.truncate(root_slot + 1 + result.num_accepted)
        else:  # the accepted path's slots move up behind the root
            cache.compact(root_slot + 1, [root_slot + 1 + node for node in result.accepted_path])


def verify_request(draft: Draft, tree: TokenTree | None, last_token: int, cache, device) -> ForwardRequest:
    """The target forward over [last committed] + draft (a tree: one row per node, plus side inputs)."""
    if tree is None:
        tokens = torch.tensor([[last_token, *draft.tokens]], device=device)  # (1, K+1)
        return ForwardRequest(tokens, positions_after(cache.length, tokens.shape[1], 1, device), cache)
    tokens, positions, mask = tree.verify_inputs(last_token, cache.length, device)
    if draft.side is not None:
        tokens, positions, mask = with_side_inputs(draft.side, tokens, positions, mask)
    attn_mask = tree_attention_mask(cache.length, mask)  # (1, T+1(+S), cache + T+1(+S))
    return ForwardRequest(tokens, positions, cache, attn_mask)


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


def judging_logits(out, draft: Draft) -> torch.Tensor:
    """(K+1 or T+1, V): the verify forward's rows that judge the draft. Side inputs' rows are not verified:
    their argmax goes back to the draft's side inputs (what lookahead learns from)."""
    logits = out.logits[0]
    if draft.side is not None:
        draft.side.outputs = logits[len(draft) + 1:].argmax(-1).tolist()
        logits = logits[: len(draft) + 1]
    return logits


def accept(round: Round, logits: torch.Tensor, params: SamplingParams, acceptance: Acceptance,
           context: Sequence[int], noise: PositionalNoise) -> VerifyResult:
    """The acceptance rule on the rows that judge the round's draft (logits (K+1 or T+1, V)): greedy where
    sampling is greedy, else `acceptance`'s rule (core/verify.py) on the processed target distribution of
    each row."""
    draft, tree = round.draft, round.tree
    if params.greedy and not params.penalizes:
        return verify_chain_greedy(logits, draft) if tree is None else verify_tree_greedy(logits, tree)
    history = torch.tensor(list(context), device=logits.device)
    match = acceptance is Acceptance.MATCH
    if tree is None:
        target_probs = processed_probs(logits, params, history, draft.tokens)  # (K+1, V)
        rule = verify_chain_match if match else verify_chain_rejection
        return rule(target_probs, draft, noise, round.position)
    target_probs = tree_processed_probs(logits, params, history, tree)  # (T+1, V)
    if match:
        return verify_tree_match(target_probs, tree, noise, round.position)
    return verify_tree_rejection(target_probs, tree, draft.draft_probs, noise, round.position)


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """A draft node's ancestors and itself, root first (indices into the draft)."""
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]
