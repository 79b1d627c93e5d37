"""A request's or a drafter's part in each round, as steps the generation calls at every phase.

A generation keeps a list of `RoundStep`s, one per feature switched on: a grammar the output must match,
log-probabilities recorded, target features a drafter reads. Each hook is a no-op by default, so the
phases call every step and none of them carries a feature's branch:

    prefill   prefill_output(out) per chunk, prefill_done() once the drafter has begun
    draft     forced_draft(limit) (tokens certain without drafting), filter_draft(draft)
    verify    verify_output(round, out), mask(round, logits)
    commit    committed(round, outcome, context) -> the outcome, possibly ended
"""

from __future__ import annotations

import torch

from specdec.core.commit import CommitOutcome, Committer
from specdec.core.constraint import Constraint, masked_logits
from specdec.core.rounds import Draft, TokenLogprob
from specdec.core.sampling import SamplingParams, token_logprobs
from specdec.engine.round import Round, Verified, path_to


# The most grammar-forced tokens drafted in one round (all are accepted; each costs a verify row).
MAX_FORCED = 32


def round_steps(drafter, hidden_layers: tuple[int, ...], params: SamplingParams, committer: Committer,
                constraint: Constraint | None, logprobs: int | None, recorded: list[TokenLogprob] | None
                ) -> list["RoundStep"]:
    """The steps a request (its grammar, its logprobs: `top` alternatives, recorded into `recorded`) and a
    drafter (the hidden layers it reads) switch on, in the order their commits must run: log-probabilities
    of the tokens as committed, then the grammar that may end the generation, then the features of what
    goes on."""
    steps: list[RoundStep] = []
    if logprobs is not None:
        steps.append(Logprobs(logprobs, params, recorded))
    if constraint is not None:
        steps.append(Grammar(constraint, committer, forces_drafts=drafter is not None))
    if hidden_layers:
        steps.append(TargetFeatures(drafter, hidden_layers))
    if drafter is not None and drafter.reads_logits:
        steps.append(TargetCandidates(drafter))
    return steps


class RoundStep:
    def prefill_output(self, out) -> None:
        """A prefill chunk's forward output."""

    def prefill_done(self) -> None:
        """The prompt is in the cache and the drafter has begun."""

    def forced_draft(self, limit: int) -> list[int]:
        """Up to `limit` tokens certain to be accepted, drafted instead of the drafter's (none: draft)."""
        return []

    def filter_draft(self, draft: Draft) -> Draft:
        """The drafter's draft, cut to what may be verified."""
        return draft

    def verify_output(self, round: Round, out) -> None:
        """The verify forward's output, before acceptance."""

    def mask(self, round: Round, logits: torch.Tensor) -> torch.Tensor:
        """(K+1 or T+1, V) logits the acceptance rule reads."""
        return logits

    def committed(self, verified: Verified, outcome: CommitOutcome, context: list[int]) -> CommitOutcome:
        """After the commit (`context` holds the committed tokens): the outcome, ended if this step ends it."""
        return outcome


class Grammar(RoundStep):
    """The output matches a grammar: the target's law masked to what it allows at each row; tokens it forces
    drafted whatever K (when there is a drafter to replace); the generation ends where it allows nothing."""

    def __init__(self, constraint: Constraint, committer: Committer, forces_drafts: bool):
        self.constraint, self.committer, self.forces_drafts = constraint, committer, forces_drafts

    def forced_draft(self, limit: int) -> list[int]:
        return self.constraint.forced(min(MAX_FORCED, limit)) if self.forces_drafts else []

    def filter_draft(self, draft: Draft) -> Draft:
        """The draft up to the first token the grammar forbids after its own prefix, that token included (it
        is rejected; core/constraint.py says why it stays): a chain ends there, a tree loses the nodes
        below it (parents come before their children)."""
        if draft.is_chain:
            keep = min(len(draft), self.constraint.allowed_prefix(draft.tokens) + 1)
            return draft if keep == len(draft) else draft.prefix(keep)
        if draft.side is not None:
            return draft  # side inputs (lookahead) are not verified: the rows they feed stay as they are
        kept: list[int] = []  # indices of the nodes kept: their ancestors are all allowed
        for node, parent in enumerate(draft.parents):
            if parent == -1 or parent in kept:
                above = [draft.tokens[n] for n in path_to(draft.parents, node)[:-1]]
                if self.constraint.allowed_prefix(above) == len(above):
                    kept.append(node)
        if len(kept) == len(draft):
            return draft
        position = {node: index for index, node in enumerate(kept)}
        probs = None if draft.draft_probs is None else draft.draft_probs[kept]
        return Draft([draft.tokens[n] for n in kept],
                     [-1 if draft.parents[n] == -1 else position[draft.parents[n]] for n in kept], probs)

    def mask(self, round: Round, logits: torch.Tensor) -> torch.Tensor:
        draft = round.draft
        paths = [[]] + [[draft.tokens[n] for n in path_to(draft.parents, node)] for node in range(len(draft))]
        return masked_logits(logits, self.constraint.masks(paths))  # (K+1 or T+1, V)

    def committed(self, verified: Verified, outcome: CommitOutcome, context: list[int]) -> CommitOutcome:
        if outcome.finish_reason is not None:
            return outcome
        self.constraint.commit(verified.result.tokens)
        if not self.constraint.complete:
            return outcome
        end = self.committer.finish("stop")  # the grammar allows nothing more (an end-of-sequence token included)
        return CommitOutcome(outcome.tokens, outcome.text_chunk + end.text_chunk, end.finish_reason, outcome.logprobs)


class Logprobs(RoundStep):
    """Each committed token's log-probability and `top` alternatives', from the row that decided it."""

    def __init__(self, top: int, params: SamplingParams, recorded: list[TokenLogprob]):
        self.top, self.params, self.recorded = top, params, recorded

    def committed(self, verified: Verified, outcome: CommitOutcome, context: list[int]) -> CommitOutcome:
        if outcome.tokens:
            rows = verified.kept_rows[:len(outcome.tokens)]
            outcome.logprobs = token_logprobs(verified.logits[rows], outcome.tokens, self.params,
                                              context[:verified.round.position], self.top)
            self.recorded.extend(outcome.logprobs)
        return outcome


class TargetCandidates(RoundStep):
    """A drafter that recycles the target's candidates reads every verify row (masked as acceptance read it),
    each with the token it was computed after: the root's row after the last committed token, a draft
    node's row after that node's token."""

    def __init__(self, drafter):
        self.drafter = drafter

    def committed(self, verified: Verified, outcome: CommitOutcome, context: list[int]) -> CommitOutcome:
        draft = verified.round.draft
        if draft.side is None:
            inputs = [context[verified.round.position - 1], *draft.tokens]
            self.drafter.take_logits(inputs, verified.logits[:len(inputs)])  # (1 + nodes, V)
        return outcome


class TargetFeatures(RoundStep):
    """Feature drafters (EAGLE, EAGLE-3, Medusa) read these hidden layers of every target forward: the
    prompt's after the prefill, then each round's rows of the committed tokens."""

    def __init__(self, drafter, layers: tuple[int, ...]):
        self.drafter, self.layers = drafter, layers
        self.prompt_features: list[torch.Tensor] = []  # each prefill chunk's (n, C x layers)
        self.round_features: torch.Tensor | None = None  # this round's verify rows' (K+1 or T+1, C x layers)

    def features_of(self, out) -> torch.Tensor:
        """(T, C x layers): the layers' states of one forward's rows, side by side in the drafter's order."""
        states = [out.hidden_states[layer][0] for layer in self.layers]
        return states[0] if len(states) == 1 else torch.cat(states, dim=-1)

    def prefill_output(self, out) -> None:
        self.prompt_features.append(self.features_of(out))

    def prefill_done(self) -> None:
        if self.prompt_features:
            self.drafter.take_features(torch.cat(self.prompt_features))  # (P-1, C x layers)
        self.prompt_features = []

    def verify_output(self, round: Round, out) -> None:
        self.round_features = self.features_of(out)

    def committed(self, verified: Verified, outcome: CommitOutcome, context: list[int]) -> CommitOutcome:
        features, self.round_features = self.round_features, None
        if outcome.finish_reason is None:
            self.drafter.take_features(features[verified.kept_rows])  # (1 + accepted, C x layers)
        return outcome
