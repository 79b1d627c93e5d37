"""Tiny prefix-dependent mock language models for whole-loop distribution tests.

The next-token logits are a fixed pseudo-random function of the entire prefix,
so every rollback mistake (a stale cache entry, a wrong position) changes the
output distribution. Cheap enough for 10^5 generations.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

from specdec.models.base import CausalLM, ForwardOutput, ModelCache
from specdec.models.sources.loading import LoadedModel


class MockCache(ModelCache):
    def __init__(self, max_length: int):
        self.tokens: list[int] = []
        self.max_length = max_length

    @property
    def length(self) -> int:
        return len(self.tokens)

    def truncate(self, length: int) -> None:
        assert 0 <= length <= self.length
        del self.tokens[length:]

    def compact(self, prefix_length: int, keep: Sequence[int]) -> None:
        self.tokens = self.tokens[:prefix_length] + [self.tokens[i] for i in keep]


class MockLM(CausalLM):
    def __init__(self, vocab_size: int = 4, salt: int = 0, sharpness: float = 1.5, max_context: int = 64):
        self.vocab_size, self.salt, self.sharpness, self.max_context = vocab_size, salt, sharpness, max_context
        self.num_layers, self.hidden_size = 1, 1
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.forwards: list[int] = []  # tokens per forward, to check costs and caches

    def new_cache(self, batch_size: int = 1, max_length: int | None = None) -> MockCache:
        return MockCache(max_length or self.max_context)

    def logits_after(self, prefix: tuple[int, ...]) -> torch.Tensor:
        return _logits(prefix, self.salt, self.vocab_size, self.sharpness)

    def forward(self, tokens, positions, cache, attn_mask=None, hidden_layers=(), last_logits_only=False):
        new = tokens[0].tolist()
        assert cache.length + len(new) <= cache.max_length
        past = cache.length
        cache.tokens.extend(new)
        self.forwards.append(len(new))
        rows = range(len(new) - 1, len(new)) if last_logits_only else range(len(new))
        if attn_mask is None:  # a chain: each new token sees everything before it
            assert positions[0].tolist() == list(range(past, past + len(new))), "positions out of step"
            prefixes = [tuple(cache.tokens[: past + i + 1]) for i in rows]
        else:  # a tree: each row sees exactly the slots its mask allows, and sits at their count - 1
            visible = attn_mask[0]  # (T, past + T)
            prefixes = []
            for i in rows:
                prefix = tuple(t for t, seen in zip(cache.tokens, visible[i].tolist()) if seen)
                assert visible[i, past + i] and positions[0, i] == len(prefix) - 1, "tree mask/positions disagree"
                prefixes.append(prefix)
        logits = torch.stack([self.logits_after(prefix) for prefix in prefixes])
        return ForwardOutput(logits=logits.unsqueeze(0), hidden_states={})


@lru_cache(maxsize=None)
def _logits(prefix: tuple[int, ...], salt: int, vocab: int, sharpness: float) -> torch.Tensor:
    rng = np.random.default_rng(abs(hash((prefix, salt))) % (2**63))
    return torch.tensor(rng.normal(size=vocab) * sharpness, dtype=torch.float32)


class MockTokenizer:
    """Token i is the letter 'a' + i."""

    chat_template = None

    def decode(self, ids, **kwargs) -> str:
        return "".join(chr(ord("a") + i) for i in ids)

    def get_vocab(self) -> dict[str, int]:
        return {chr(ord("a") + i): i for i in range(26)}


def mock_loaded(model: MockLM, name: str) -> LoadedModel:
    return LoadedModel(name, None, model, MockTokenizer(), (), "mock")
