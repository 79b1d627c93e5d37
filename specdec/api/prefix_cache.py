"""Prompt prefixes' keys and values kept across requests, so a shared prefix is computed once.

A served model sees the same prefixes again and again: a system prompt, a few-shot header, a chat history
resent with one more turn. Each finished prefill (and each finished generation: its answer is the next
turn's history) leaves a copy of its cache here; a new prompt takes the slots of its longest common prefix
with any entry and prefills only the rest. The copies are exact: the target computes a prompt's keys and
values the same whether its prefill starts at 0 or at a reused prefix, as long as the prefix stops at a
point the target allows (`reusable_prefix`; the native CPU runtime allows them, a GPU or a sliding window
does not, and then nothing is cached). Entries are private copies, so evicting one never touches a
running request's cache. Memory is bounded by `budget_bytes`; the least recently used entries go first, and a
prompt larger than the whole budget keeps its longest prefix that fits (an agent's turns share their first
thousands of tokens: that part is what the next turn reads).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

from specdec.drafters.cross_tokenizer import common_prefix_length
from specdec.models.kv_cache import KVCache

# Shorter common prefixes are not worth a lookup's copy (and a chat template's first few tokens are shared
# by every prompt).
MIN_REUSED_TOKENS = 16


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0  # prompt tokens whose keys and values were copied instead of computed
    entries: int = 0
    bytes: int = 0


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: KVCache  # exactly len(tokens) slots
    last_used: int


class PrefixCache:
    def __init__(self, model, budget_bytes: int):
        """model: the target (its `reusable_prefix` decides what may be cached); budget_bytes: the entries'
        keys and values together, at most."""
        self.model = model
        self.budget_bytes = max(0, int(budget_bytes))
        self.entries: list[_Entry] = []
        self.stats = PrefixCacheStats()
        self._clock = 0
        self._lock = threading.Lock()  # /metrics reads the stats from the server's event loop

    def tokens_held(self) -> int:
        """About how many tokens' keys and values the budget holds (a new cache of this model, measured)."""
        probe = self.model.new_cache(1, 16)
        return self.budget_bytes * 16 // max(probe.nbytes, 1)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0 and self.model.reusable_prefix(1) == 1

    def lookup(self, head: Sequence[int]) -> KVCache | None:
        """A cache whose first `length` slots hold head[:length] (the longest reusable common prefix with an
        entry, at least MIN_REUSED_TOKENS), for `PromptPrefill.use_prompt_cache`; None when nothing is shared.
        The cache is the entry's own storage, to be copied from, not written."""
        if not self.enabled:
            return None
        with self._lock:
            self.stats.lookups += 1
            best, best_length = None, 0
            for entry in self.entries:
                length = common_prefix_length(entry.tokens, head)
                if length > best_length:
                    best, best_length = entry, length
            best_length = self.model.reusable_prefix(best_length)
            if best is None or best_length < MIN_REUSED_TOKENS:
                return None
            self._clock += 1
            best.last_used = self._clock
            self.stats.hits += 1
            self.stats.reused_tokens += best_length
            view = KVCache.over(best.cache.keys, best.cache.values, best.cache.max_length)
            view.length = best_length
            return view

    def store(self, tokens: Sequence[int], cache: KVCache, prefilled: int | None = None) -> None:
        """Keep a copy of the keys and values of `tokens` (cache's first len(tokens) slots hold them, the first
        `prefilled` computed by a prefill, None: all), cut to the longest reusable prefix. Entries this one
        extends are dropped: any hit on them hits it too."""
        if not self.enabled or not isinstance(cache, KVCache):
            return
        length = self.model.reusable_prefix(min(len(tokens), cache.length), prefilled)
        if length < MIN_REUSED_TOKENS:
            return
        fits = self.budget_bytes * cache.keys.shape[3] // max(cache.nbytes, 1)  # slots the whole budget holds
        if length > fits:  # an agent's prompt past the budget: its longest prefix that fits, never nothing
            length = self.model.reusable_prefix(fits, prefilled)
            if length < MIN_REUSED_TOKENS:
                return
        key = tuple(tokens[:length])
        with self._lock:
            self._clock += 1
            for entry in self.entries:
                if len(entry.tokens) >= length and entry.tokens[:length] == key:
                    entry.last_used = self._clock  # already held, as this prefix or a longer one
                    return
            self.entries = [entry for entry in self.entries if key[:len(entry.tokens)] != entry.tokens]
            copy = KVCache.over(cache.keys[:, :, :, :length].clone(), cache.values[:, :, :, :length].clone(), length)
            copy.length = length
            self.entries.append(_Entry(key, copy, self._clock))
            self._evict_to(self.budget_bytes)
            self._count()

    def clear(self) -> None:
        with self._lock:
            self.entries = []
            self._count()

    def _evict_to(self, budget: int) -> None:
        self.entries.sort(key=lambda entry: entry.last_used)
        while self.entries and sum(_bytes_of(entry.cache, len(entry.tokens)) for entry in self.entries) > budget:
            self.entries.pop(0)  # the least recently used

    def _count(self) -> None:
        self.stats.entries = len(self.entries)
        self.stats.bytes = sum(_bytes_of(entry.cache, len(entry.tokens)) for entry in self.entries)


def _bytes_of(cache: KVCache, length: int) -> int:
    """Bytes of `length` slots' keys and values."""
    return cache.nbytes * length // cache.keys.shape[3]
