"""The chain verifier's output follows the target distribution exactly (10^6 batched rounds).

Also checks the accepted-count law [1 - a0, a0 (1 - a1), ...] with a_j = sum_x min(t_j, d_j),
and that deliberately broken verifiers fail the same checks.
"""

import numpy as np
import pytest
import torch

from specdec.core import verify
from specdec.core.verify import one_hot_probs, rejection_sample
from stats_checks import assert_distribution

N = 1_000_000


def heavy_tailed(vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=gen) * 2.5  # a few large entries, a long tail
    return logits.softmax(-1)


def disjoint_pair(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    target = torch.zeros(vocab)
    draft = torch.zeros(vocab)
    target[: vocab // 2] = torch.arange(1, vocab // 2 + 1, dtype=torch.float32)
    draft[vocab // 2:] = 1.0
    return target / target.sum(), draft / draft.sum()


def cases():
    # (name, target rows (K+1, V), draft rows (K, V) or None for a deterministic draft)
    out = []
    for vocab, k in [(8, 1), (16, 3), (32, 2)]:
        target = torch.stack([heavy_tailed(vocab, 10 * k + i) for i in range(k + 1)])
        draft = torch.stack([heavy_tailed(vocab, 100 + 10 * k + i) for i in range(k)])
        out.append((f"heavy-tails-V{vocab}-K{k}", target, draft))
    target = torch.stack([heavy_tailed(12, i) for i in range(3)])
    out.append(("one-hot-draft-V12-K2", target, None))
    t, d = disjoint_pair(16)
    out.append(("disjoint-support-V16-K2", torch.stack([t, t, t]), torch.stack([d, d])))
    t = heavy_tailed(10, 7)
    out.append(("draft-equals-target-V10-K3", torch.stack([t] * 4), torch.stack([t] * 3)))
    return out


CASES = cases()


def round_uniforms(gen: torch.Generator, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """N rounds' accept (N, K) and residual (N, K+1) uniforms."""
    return (torch.rand(N, k, generator=gen, device=device), torch.rand(N, k + 1, generator=gen, device=device))


def run_verifier(target: torch.Tensor, draft: torch.Tensor | None, seed: int = 0, fixed_tokens=None,
                 device: str = "cpu"):
    """N independent rounds: draft tokens sampled from the draft rows, verified in one batched call."""
    target = target.to(device)
    draft = None if draft is None else draft.to(device)
    gen = torch.Generator(device).manual_seed(seed)
    k, vocab = target.shape[0] - 1, target.shape[1]
    if draft is None:  # deterministic drafter: fixed tokens, one-hot draft probabilities
        tokens = torch.tensor(fixed_tokens or [int(target[i].argmin()) for i in range(k)], device=device).expand(N, k)
        draft_probs = None
        draft_rows = one_hot_probs(tokens[0], vocab)
    else:
        tokens = torch.multinomial(draft, N, replacement=True, generator=gen).T.contiguous()  # (N, K)
        draft_probs = draft.expand(N, k, vocab)
        draft_rows = draft
    num_accepted, next_token = rejection_sample(target.expand(N, k + 1, vocab), draft_probs, tokens,
                                                *round_uniforms(gen, k, device))
    first = torch.where(num_accepted > 0, tokens[:, 0], next_token)
    return first.cpu().numpy(), num_accepted.cpu().numpy(), draft_rows.cpu()


def accepted_count_law(target: torch.Tensor, draft_rows: torch.Tensor) -> np.ndarray:
    rates = torch.minimum(target[:-1], draft_rows).sum(-1).numpy()  # a_j
    k = len(rates)
    law = [np.prod(rates[:i]) * (1 - rates[i]) for i in range(k)] + [np.prod(rates)]
    return np.array(law)


@pytest.mark.parametrize("name,target,draft", CASES, ids=[c[0] for c in CASES])
def test_first_token_follows_target(name, target, draft):
    first, num_accepted, draft_rows = run_verifier(target, draft)
    vocab = target.shape[1]
    assert_distribution(np.bincount(first, minlength=vocab), target[0].numpy(), what=f"{name}: first token")
    assert_distribution(np.bincount(num_accepted, minlength=target.shape[0]), accepted_count_law(target, draft_rows),
                        what=f"{name}: accepted count")


def test_draft_equal_to_target_accepts_everything():
    t = heavy_tailed(10, 7)
    _, num_accepted, _ = run_verifier(torch.stack([t] * 4), torch.stack([t] * 3))
    assert (num_accepted == 3).all()


def test_deterministic_draft_of_target_argmax_is_accepted_at_target_rate():
    target = torch.stack([heavy_tailed(12, i) for i in range(3)])
    best = [int(target[i].argmax()) for i in range(2)]
    first, num_accepted, _ = run_verifier(target, None, fixed_tokens=best)
    assert_distribution(np.bincount(first, minlength=12), target[0].numpy(), what="argmax draft: first token")


# -- the tests must catch a broken verifier -------------------------------------------------
def broken_residual_is_target(monkeypatch):
    monkeypatch.setattr(verify, "residual_distribution", lambda target, draft: target)


# (not the disjoint case: there max(0, t - d) is t itself, so that "bug" is harmless)
@pytest.mark.parametrize("name,target,draft", [CASES[0], CASES[2]], ids=[CASES[0][0], CASES[2][0]])
def test_broken_residual_is_caught(monkeypatch, name, target, draft):
    broken_residual_is_target(monkeypatch)
    first, _, _ = run_verifier(target, draft)
    with pytest.raises(AssertionError):
        assert_distribution(np.bincount(first, minlength=target.shape[1]), target[0].numpy())


def test_unprocessed_draft_probs_are_caught():
    """The drafter samples at temperature 0.5 but reports its raw (temperature 1) probabilities."""
    gen = torch.Generator().manual_seed(3)
    vocab, k = 16, 2
    target = torch.stack([heavy_tailed(vocab, 40 + i) for i in range(k + 1)])
    draft_logits = torch.randn(k, vocab, generator=gen) * 2.5
    sampled_from = (draft_logits / 0.5).softmax(-1)
    reported = draft_logits.softmax(-1)
    tokens = torch.multinomial(sampled_from, N, replacement=True, generator=gen).T.contiguous()
    num_accepted, next_token = rejection_sample(target.expand(N, k + 1, vocab), reported.expand(N, k, vocab), tokens,
                                                *round_uniforms(gen, k, "cpu"))
    first = torch.where(num_accepted > 0, tokens[:, 0], next_token).numpy()
    with pytest.raises(AssertionError):
        assert_distribution(np.bincount(first, minlength=vocab), target[0].numpy())
