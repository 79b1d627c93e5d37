"""The interface every target and draft model offers the engine.

A model runs a forward over new tokens given their positions, appending their
keys/values to a cache it created; the engine rolls that cache back
(`truncate`) or keeps a tree's accepted path (`compact`). The native decoder and
the transformers adapter both implement it, so the engine never knows which it
runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (B, T, V), or (B, 1, V) when only the last position was asked for
    hidden_states: dict[int, torch.Tensor]  # layer index -> (B, T, C); index num_layers = final normed state
    experts_per_layer: float | None = None  # a mixture of experts: the distinct experts the pass ran, a layer


@dataclass
class ForwardRequest:
    """One request's new rows in a batched forward (`forward_batch`): what `forward` takes for it alone."""
    tokens: torch.Tensor  # (1, T)
    positions: torch.Tensor  # (1, T)
    cache: "ModelCache"
    attn_mask: torch.Tensor | None = None  # (1, T, cache.length + T) bool; None = causal


def forward_each(model, requests: Sequence[ForwardRequest], hidden_layers: Sequence[int] = ()) -> list[ForwardOutput]:
    """Requests' forwards one after another: what forward_batch computes, where nothing is batched."""
    return [model.forward(r.tokens, r.positions, r.cache, r.attn_mask, hidden_layers=hidden_layers)
            for r in requests]


class ModelCache:
    """Every model's cache: what the engine, the drafters, the prefix cache and the server ask of it.
    Optional abilities default to "not offered" here, so callers call methods and never probe a cache."""

    length: int  # slots filled
    max_length: int  # slots it can hold

    @property
    def nbytes(self) -> int:
        """Bytes its keys and values occupy (all max_length slots)."""
        return 0

    def truncate(self, length: int) -> None:
        raise NotImplementedError

    def compact(self, prefix_length: int, keep: Sequence[int]) -> None:
        raise NotImplementedError

    def can_copy_from(self, other: "ModelCache") -> bool:
        """Whether `copy_prefix_from(other, ...)` works (a cache of the same layout)."""
        return False

    def copy_prefix_from(self, other: "ModelCache", length: int) -> None:
        """Slots [0, length) of `other` become this cache's whole content."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy another cache's slots")


class CausalLM:
    """Every target and draft model: what the engine, the drafters, the bench and the server ask of it.
    Optional abilities have their "not offered" defaults here, so callers never probe a model."""

    vocab_size: int
    num_layers: int
    hidden_size: int
    max_context: int
    device: torch.device
    dtype: torch.dtype
    weight_format: str = "float32"  # the format its layers' matrices are held in (packed_linear's names)
    graphs = None  # CUDA graphs it replays its forwards with (models/cuda_graphs.py), if any

    def new_cache(self, batch_size: int = 1, max_length: int | None = None) -> ModelCache:
        raise NotImplementedError

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T) token ids
        positions: torch.Tensor,  # (B, T) absolute positions (a tree node's position is prefix + depth)
        cache: ModelCache,
        attn_mask: torch.Tensor | None = None,  # (B or 1, T, cache.length + T) bool, True = may attend
        hidden_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> ForwardOutput:
        raise NotImplementedError

    def forward_batch(self, requests: Sequence[ForwardRequest], hidden_layers: Sequence[int] = ()) -> list[ForwardOutput]:
        """Each request's forward (its own cache), in one pass where the model can (forward_each where not):
        outputs identical to calling forward per request."""
        return forward_each(self, requests, hidden_layers)

    def weights_module(self) -> "torch.nn.Module | None":
        """The module holding its weights (for counting and sharing bytes); None where there is none."""
        return self if isinstance(self, torch.nn.Module) else None

    @property
    def nbytes(self) -> int:
        """Bytes of its weights as held (in their format)."""
        module = self.weights_module()
        if module is None:
            return 0
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in [*module.parameters(), *module.buffers()]}
        return sum(storages.values())

    def layers_are_packed(self) -> bool:
        """Whether its layers run on the CPU kernels' packed weights."""
        return False

    def reusable_prefix(self, length: int, prefilled: int | None = None) -> int:
        """The longest prefix of a cache's `length` slots (the first `prefilled` of them from a prefill, None:
        all) that a prefill may stop at and go on from with the same keys and values as one prefill (chunked
        prefill, cached prefixes); 0 for models without such points."""
        return 0

    def prompt_row_cost(self, depth: int) -> float:
        """What a prompt row at context `depth` costs in a prefill, relative to a row at depth 0 (its
        attention reads every earlier key): sizes a chunked prefill's steps. 1 where not known."""
        return 1.0


def causal_attention_mask(past_length: int, num_new: int, device: torch.device | str) -> torch.Tensor:
    """(1, T, past + T) bool: every new token sees the whole prefix and the new tokens up to itself."""
    new = torch.ones(num_new, num_new, dtype=torch.bool, device=device).tril()
    prefix = torch.ones(num_new, past_length, dtype=torch.bool, device=device)
    return torch.cat([prefix, new], dim=1).unsqueeze(0)


def sliding_window_mask(attn_mask: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
    """attn_mask (B or 1, T, S) restricted to a sliding window: a token at position p sees no key at a
    position <= p - window. Committed keys sit at their position's slot (prefixes are compacted) and draft
    keys (the last T slots) always lie within a window longer than the draft, so slots stand for positions."""
    first_key = (positions - window + 1).clamp(min=0)  # (B, T)
    in_window = torch.arange(attn_mask.shape[-1], device=attn_mask.device) >= first_key.unsqueeze(-1)  # (B, T, S)
    return attn_mask & in_window


def tree_attention_mask(past_length: int, tree_mask: torch.Tensor) -> torch.Tensor:
    """(1, T, past + T) bool from a (T, T) ancestor-or-self mask of the new tokens.

    Each node sees the whole committed prefix and its own ancestors only, so one
    forward scores every branch of a token tree.
    """
    num_new = tree_mask.shape[0]
    prefix = torch.ones(num_new, past_length, dtype=torch.bool, device=tree_mask.device)
    return torch.cat([prefix, tree_mask.to(torch.bool)], dim=1).unsqueeze(0)


def positions_after(past_length: int, num_new: int, batch_size: int, device: torch.device | str) -> torch.Tensor:
    """(B, T) positions of a chain of T tokens appended after `past_length` cached ones."""
    return torch.arange(past_length, past_length + num_new, device=device).expand(batch_size, num_new)
