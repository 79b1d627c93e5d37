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

from specdec.drafters.base import Draft, VerifyResult
from specdec.sampling import sample


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
