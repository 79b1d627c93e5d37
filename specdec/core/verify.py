"""Verification: which draft tokens the target keeps, and the token that follows.

Vocabulary (after vLLM's rejection sampler):
  accepted token  - a draft token kept;
  recovered token - the token committed at the first rejection;
  bonus token     - the token after the last draft token when every draft token was accepted.

Two exact rules for sampling (greedy decoding is one-hot distributions under either):
  match     - the target's own token at each position is drawn by inverse CDF from the uniform keyed by that
              position (`randomness.Purpose.TOKEN`), exactly as plain sampling draws it; a draft token is
              accepted while it equals that token. The committed text is the plain-sampling text of the same
              seed, whatever was drafted; a deterministic drafter's token x is accepted with probability
              target_probs[x], as under the rejection rule.
  rejection - draft token x, drawn from draft_probs, is accepted with probability
              min(1, target_probs[x] / draft_probs[x]); at the first rejection the next token is drawn from
              normalize(max(0, target_probs - draft_probs)) (Leviathan et al. 2023, Chen et al. 2023). The
              most acceptance a sampled draft can get; exact in distribution, but the text of a seed depends
              on where rounds end.

The rejection sampler is batched over a leading N so the statistical tests can draw 10^6 rounds in one
call; the engine calls it with N = 1.
"""

from __future__ import annotations

from enum import StrEnum

import torch

from specdec.core.rounds import Draft, VerifyResult
from specdec.errors import InvalidParameterError
from specdec.core.randomness import PositionalNoise, Purpose
from specdec.core.sampling import inverse_cdf
from specdec.core.tree import ROOT, TokenTree

class Acceptance(StrEnum):
    """The sampling rule that judges drafts (the module's docstring): parsed once at the edge (`parse`)."""

    MATCH = "match"
    REJECTION = "rejection"

    @classmethod
    def parse(cls, rule: "str | Acceptance") -> "Acceptance":
        """The rule named `rule`, else InvalidParameterError (before anything loads)."""
        try:
            return cls(rule)
        except ValueError:
            raise InvalidParameterError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, "
                                        f"not {rule!r}") from None


ACCEPTANCE_RULES = tuple(rule.value for rule in Acceptance)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """max(0, target - draft), unnormalized. The only place this rule lives (tests break it on purpose)."""
    return (target_probs - draft_probs).clamp_min(0.0)


def one_hot_probs(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., V) one-hot distributions of a deterministic drafter."""
    return torch.nn.functional.one_hot(tokens, vocab_size).to(torch.float32)


def rejection_sample(
    target_probs: torch.Tensor,  # (N, K+1, V) processed target distributions at each draft position + bonus
    draft_probs: torch.Tensor | None,  # (N, K, V), None = deterministic (one-hot at draft_tokens)
    draft_tokens: torch.Tensor,  # (N, K)
    accept_uniforms: torch.Tensor,  # (N, K) the accept test of each draft token
    residual_uniforms: torch.Tensor,  # (N, K+1) the draw at each position, used where the round ends
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted (N,), next_token (N,)) for a chain; next is recovered or bonus."""
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if draft_probs is None:
        draft_probs = one_hot_probs(draft_tokens, vocab)
    target_at_draft = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # (N, K)
    draft_at_draft = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # (N, K)
    # u < t/d written without the division: exact for d = 0 and never accepts t = 0.
    accepted = accept_uniforms * draft_at_draft < target_at_draft  # (N, K)
    num_accepted = accepted.to(torch.int64).cumprod(-1).sum(-1)  # (N,)
    rows = torch.arange(batch, device=target_probs.device)
    no_draft = torch.zeros(batch, 1, vocab, dtype=draft_probs.dtype, device=draft_probs.device)
    padded_draft = torch.cat([draft_probs, no_draft], dim=1)  # (N, K+1, V)
    # At the first rejection the residual; after all K accepted, draft row K is zero -> the target itself.
    residual = residual_distribution(target_probs[rows, num_accepted], padded_draft[rows, num_accepted])  # (N, V)
    total = residual.sum(-1, keepdim=True)
    # Rounding can empty the residual when target == draft; the target is then the right law.
    residual = torch.where(total > 0, residual, target_probs[rows, num_accepted])
    next_token = inverse_cdf(residual, residual_uniforms[rows, num_accepted])  # (N,)
    return num_accepted, next_token


def verify_chain_rejection(
    target_probs: torch.Tensor,  # (K+1, V)
    draft: Draft,
    noise: PositionalNoise,
    first_position: int,  # absolute position of the first draft token
) -> VerifyResult:
    device = target_probs.device
    k = len(draft)
    tokens = torch.tensor(draft.tokens, dtype=torch.int64, device=device).unsqueeze(0)  # (1, K)
    draft_probs = None if draft.draft_probs is None else draft.draft_probs.unsqueeze(0)
    accept = noise.uniforms(first_position, k, Purpose.ACCEPT, device).unsqueeze(0)  # (1, K)
    residual = noise.uniforms(first_position, k + 1, Purpose.RESIDUAL, device).unsqueeze(0)  # (1, K+1)
    num_accepted, next_token = rejection_sample(target_probs.unsqueeze(0), draft_probs, tokens, accept, residual)
    count = int(num_accepted[0])
    return VerifyResult(len(draft), list(range(count)), draft.tokens[:count] + [int(next_token[0])])


def verify_chain_match(
    target_probs: torch.Tensor,  # (K+1, V)
    draft: Draft,
    noise: PositionalNoise,
    first_position: int,
) -> VerifyResult:
    """The match rule on a chain: the target's token at each position is the plain-sampling one."""
    uniforms = noise.uniforms(first_position, len(draft) + 1, Purpose.TOKEN, target_probs.device)  # (K+1,)
    return follow_chain(inverse_cdf(target_probs, uniforms).tolist(), draft)


def verify_chain_greedy(target_logits: torch.Tensor, draft: Draft) -> VerifyResult:
    """target_logits (K+1, V): accept while the draft equals the target's argmax, then its argmax."""
    return follow_chain(target_logits.argmax(-1).tolist(), draft)  # one host sync per round


def follow_chain(choice: list[int], draft: Draft) -> VerifyResult:
    """choice[j]: the target's token after draft token j - 1 (after the root for j = 0). Accept drafts while
    they equal it, then commit the target's token where they part (or after the last)."""
    count = 0
    while count < len(draft) and draft.tokens[count] == choice[count]:
        count += 1
    return VerifyResult(len(draft), list(range(count)), draft.tokens[:count] + [choice[count]])


# -- trees -----------------------------------------------------------------------------------
# Row 0 of the target's output is its distribution after the root (the last committed token), row
# n + 1 its distribution after node n's path. Verification walks down from the root.


def verify_tree_greedy(target_logits: torch.Tensor, tree: TokenTree) -> VerifyResult:
    """target_logits (T+1, V): follow the child whose token is the target's argmax, as deep as the
    tree allows; then the argmax after the last accepted node."""
    return follow_tree(target_logits.argmax(-1).tolist(), tree)  # one host sync per round


def verify_tree_match(
    target_probs: torch.Tensor,  # (T+1, V) processed target distributions: root, then each node
    tree: TokenTree,
    noise: PositionalNoise,
    first_position: int,  # absolute position of the root's children
) -> VerifyResult:
    """The match rule on a tree: every row draws the target's token at its position (root's row: the first
    position; node n's row: first + depth(n)) with that position's uniform; the first child in proposal
    order that equals it is followed."""
    depth = max(tree.depths, default=0)
    by_depth = noise.uniforms(first_position, depth + 1, Purpose.TOKEN, target_probs.device)  # (D+1,)
    row_depth = torch.tensor([0, *tree.depths], device=target_probs.device)  # (T+1,)
    return follow_tree(inverse_cdf(target_probs, by_depth[row_depth]).tolist(), tree)


def follow_tree(choice: list[int], tree: TokenTree) -> VerifyResult:
    """choice[0]: the target's token after the root, choice[n + 1] after node n. Follow the child that
    equals it, as deep as the tree allows, then commit the target's token after the last followed node."""
    path: list[int] = []
    node = ROOT
    while True:
        matching = [child for child in tree.children[node] if tree.tokens[child] == choice[node + 1]]
        if not matching:
            break
        node = matching[0]
        path.append(node)
    return VerifyResult(len(tree), path, [tree.tokens[n] for n in path] + [choice[node + 1]])


def verify_tree_rejection(
    target_probs: torch.Tensor,  # (T+1, V) processed target distributions: root, then each node
    tree: TokenTree,
    draft_probs: torch.Tensor | None,  # (T, V): the distribution node n was drawn from; None = one-hot
    noise: PositionalNoise,
    first_position: int,  # absolute position of the root's children
) -> VerifyResult:
    """Multi-draft rejection sampling (SpecInfer; EAGLE): at each node try its children in order;
    child x (drawn from q, independently of its siblings, or proposed deterministically: q one-hot)
    is accepted with probability min(1, r(x) / q(x)) where r starts as the target's distribution;
    after a rejection r becomes normalize(max(0, r - q)). The first accepted child is descended into;
    when none is, the next token is drawn from r (at a leaf r is the target's: the bonus token).
    Each step is a single-draft speculative step against r, so the committed tokens follow the
    target's distribution exactly."""
    path: list[int] = []
    node = ROOT
    while True:
        position = first_position + len(path)
        residual = target_probs[node + 1]  # (V,) sums to 1
        accepted = None
        for sibling, child in enumerate(tree.children[node]):
            token = tree.tokens[child]
            q = draft_probs[child] if draft_probs is not None else one_hot_probs(
                torch.tensor(token, device=residual.device), residual.shape[-1])  # (V,)
            if noise.uniform(position, Purpose.ACCEPT, sibling) * q[token] < residual[token]:
                accepted = child
                break
            reduced = residual_distribution(residual, q)
            total = reduced.sum()
            if total > 0:  # rounding can empty it when r == q; r is then still the right law
                residual = reduced / total
        if accepted is None:
            uniform = torch.tensor(noise.uniform(position, Purpose.RESIDUAL), device=residual.device)
            next_token = int(inverse_cdf(residual, uniform))
            return VerifyResult(len(tree), path, [tree.tokens[n] for n in path] + [next_token])
        path.append(accepted)
        node = accepted
