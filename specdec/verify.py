"""Verification: which draft tokens the target keeps, and the token that follows.

Vocabulary (after vLLM's rejection sampler):
  accepted token  - a draft token kept;
  recovered token - sampled at the first rejection from normalize(max(0, target_probs - draft_probs));
  bonus token     - sampled from the target's distribution after the last draft
                    token when every draft token was accepted.
Draft token x is accepted with probability min(1, target_probs[x] / draft_probs[x]).
This makes the committed tokens follow the target's distribution exactly
(Leviathan et al. 2023, Chen et al. 2023). Greedy decoding is the special case of
one-hot distributions: accept while the draft equals the target's argmax.

The sampling functions are batched over a leading N so the statistical tests can
draw 10^6 rounds in one call; the engine calls them with N = 1.
"""

from __future__ import annotations

import torch

from specdec.rounds import Draft, VerifyResult
from specdec.sampling import sample
from specdec.tree import ROOT, TokenTree


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
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted (N,), next_token (N,)) for a chain; next is recovered or bonus."""
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if draft_probs is None:
        draft_probs = one_hot_probs(draft_tokens, vocab)
    target_at_draft = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # (N, K)
    draft_at_draft = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # (N, K)
    uniform = torch.rand(batch, k, generator=generator, device=target_probs.device)  # (N, K)
    # u < t/d written without the division: exact for d = 0 and never accepts t = 0.
    accepted = uniform * draft_at_draft < target_at_draft  # (N, K)
    num_accepted = accepted.to(torch.int64).cumprod(-1).sum(-1)  # (N,)
    rows = torch.arange(batch, device=target_probs.device)
    no_draft = torch.zeros(batch, 1, vocab, dtype=draft_probs.dtype, device=draft_probs.device)
    padded_draft = torch.cat([draft_probs, no_draft], dim=1)  # (N, K+1, V)
    # At the first rejection the residual; after all K accepted, draft row K is zero -> the target itself.
    residual = residual_distribution(target_probs[rows, num_accepted], padded_draft[rows, num_accepted])  # (N, V)
    total = residual.sum(-1, keepdim=True)
    # Rounding can empty the residual when target == draft; the target is then the right law.
    residual = torch.where(total > 0, residual, target_probs[rows, num_accepted])
    next_token = sample(residual, generator)  # (N,)
    return num_accepted, next_token


def verify_chain_sampling(
    target_probs: torch.Tensor,  # (K+1, V)
    draft: Draft,
    generator: torch.Generator | None,
) -> VerifyResult:
    tokens = torch.tensor(draft.tokens, dtype=torch.int64, device=target_probs.device).unsqueeze(0)  # (1, K)
    draft_probs = None if draft.draft_probs is None else draft.draft_probs.unsqueeze(0)
    num_accepted, next_token = rejection_sample(target_probs.unsqueeze(0), draft_probs, tokens, generator)
    count = int(num_accepted[0])
    return VerifyResult(len(draft), list(range(count)), draft.tokens[:count] + [int(next_token[0])])


def verify_chain_greedy(target_logits: torch.Tensor, draft: Draft) -> VerifyResult:
    """target_logits (K+1, V): accept while the draft equals the target's argmax, then its argmax."""
    choice = target_logits.argmax(-1).tolist()  # K+1 ints: one host sync per round
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
    choice = target_logits.argmax(-1).tolist()  # T+1 ints: one host sync per round
    path: list[int] = []
    node = ROOT
    while True:
        matching = [child for child in tree.children[node] if tree.tokens[child] == choice[node + 1]]
        if not matching:
            break
        node = matching[0]
        path.append(node)
    return VerifyResult(len(tree), path, [tree.tokens[n] for n in path] + [choice[node + 1]])


def verify_tree_sampling(
    target_probs: torch.Tensor,  # (T+1, V) processed target distributions: root, then each node
    tree: TokenTree,
    draft_probs: torch.Tensor | None,  # (T, V): the distribution node n was drawn from; None = one-hot
    generator: torch.Generator | None,
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
        residual = target_probs[node + 1]  # (V,) sums to 1
        accepted = None
        for child in tree.children[node]:
            token = tree.tokens[child]
            q = draft_probs[child] if draft_probs is not None else one_hot_probs(
                torch.tensor(token, device=residual.device), residual.shape[-1])  # (V,)
            uniform = torch.rand((), generator=generator, device=residual.device)
            if uniform * q[token] < residual[token]:
                accepted = child
                break
            reduced = residual_distribution(residual, q)
            total = reduced.sum()
            if total > 0:  # rounding can empty it when r == q; r is then still the right law
                residual = reduced / total
        if accepted is None:
            next_token = int(sample(residual.unsqueeze(0), generator)[0])
            return VerifyResult(len(tree), path, [tree.tokens[n] for n in path] + [next_token])
        path.append(accepted)
        node = accepted
