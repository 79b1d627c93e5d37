"""Preallocated KV cache written by position (gpt-fast style).

Slots [0, length) hold the keys/values of committed (or being-verified) tokens.
A forward writes its T new tokens at [length, length + T) and advances length.
Rolling back rejected tokens is moving `length` back; keeping the accepted path
of a token tree is copying its slots down (`compact`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.models.base import ModelCache


class KVCache(ModelCache):
    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_layers, batch_size, num_kv_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H_kv, S_max, D)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H_kv, S_max, D)
        self.length = 0
        self.max_length = max_length

    @classmethod
    def over(cls, keys: torch.Tensor, values: torch.Tensor, max_length: int) -> "KVCache":
        """An empty cache over existing (L, B, H_kv, S, D) storage, S >= max_length (CUDA graphs reuse
        the storage their kernels were captured on; slots past max_length are theirs)."""
        if keys.shape != values.shape or keys.shape[3] < max_length:
            raise ValueError(f"storage of {keys.shape[3]} slots cannot hold a cache of {max_length}")
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.length, cache.max_length = keys, values, 0, max_length
        return cache

    @property
    def nbytes(self) -> int:
        """Bytes of the keys' and values' storage (all max_length slots, filled or not)."""
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys/values (B, H_kv, T, D) at [length, length+T); return the views [0, length+T).

        `length` is advanced once per forward by `advance`, after all layers wrote.
        """
        start, stop = self.length, self.length + keys.shape[2]
        self.keys[layer, :, :, start:stop] = keys
        self.values[layer, :, :, start:stop] = values
        return self.filled(layer, stop)

    def filled(self, layer: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of slots [0, stop) of one layer: (B, H_kv, stop, D) keys and values."""
        return self.keys[layer, :, :, :stop], self.values[layer, :, :, :stop]

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens

    def check_room(self, num_tokens: int) -> None:
        if self.length + num_tokens > self.max_length:
            raise ValueError(
                f"KV cache full: {self.length} cached + {num_tokens} new > capacity {self.max_length}"
            )

    def can_copy_from(self, other: object) -> bool:
        """Whether `other` is a cache of the same layout (layers, heads, head size, dtype, device)."""
        return (isinstance(other, KVCache) and other.keys.shape[:3] == self.keys.shape[:3]
                and other.keys.shape[4] == self.keys.shape[4] and other.keys.dtype == self.keys.dtype
                and other.keys.device == self.keys.device)

    def copy_prefix_from(self, other: "KVCache", length: int) -> None:
        """Slots [0, length) of `other` become this cache's whole content (a self-draft taking the target's
        prompt keys and values instead of computing its own)."""
        if not self.can_copy_from(other) or not 0 <= length <= min(other.length, self.max_length):
            raise ValueError(f"cannot copy {length} slots from a cache of another layout or length {other.length}")
        self.keys[:, :, :, :length] = other.keys[:, :, :, :length]
        self.values[:, :, :, :length] = other.values[:, :, :, :length]
        self.length = length

    def truncate(self, length: int) -> None:
        """Forget every slot at or after `length` (rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self.length = length

    def compact(self, prefix_length: int, keep: Sequence[int]) -> None:
        """Keep slots [0, prefix_length) and then the slots `keep` (in that order), contiguously.

        Used after tree verification: `keep` are the slots of the accepted path.
        """
        keep_list = list(keep)
        if any(k < prefix_length or k >= self.length for k in keep_list):
            raise ValueError(f"compact: slots {keep_list} outside [{prefix_length}, {self.length})")
        if keep_list != list(range(prefix_length, prefix_length + len(keep_list))):
            index = torch.tensor(keep_list, device=self.keys.device)
            dest = slice(prefix_length, prefix_length + len(keep_list))
            # index_select copies first, so overlapping source/destination slots are safe.
            self.keys[:, :, :, dest] = self.keys.index_select(3, index)
            self.values[:, :, :, dest] = self.values.index_select(3, index)
        self.length = prefix_length + len(keep_list)
