"""Continuations remembered across generations: the idea of SuffixDecoding (Oliaro et al., 2024) and
SAM-decoding, kept to n-gram counts.

A server answers many requests with the same structure (tool-call JSON, successive edits of one file, the
same boilerplate) that no single prompt holds. This memory keeps the tokens earlier generations produced,
up to a bound, and counts for every n-gram (n = 2..order) the tokens that followed it. A draft walks it:
the longest suffix of the context (and of the draft so far) that the memory holds, then the continuation
seen most often after it, again and again. Exactness needs nothing: what it proposes is verified like
any draft.

Each generation is recorded with the last tokens of its prompt as a lead-in: they are counted as the
n-grams that came before the answer, never as tokens that followed, so a request ending like an earlier
one (the same chat template, the same tool schema) gets that answer's first tokens as its first draft.

One memory belongs to one drafter and the copies `fresh()` makes of it for concurrent requests, so it is
scoped to the model that drafter was built for. Memory is bounded by `max_tokens`: when a new token
would exceed it, the oldest generation's tokens are forgotten and their counts taken back, so the counts
always describe exactly the generations held (a generation that alone fills the memory stops being
recorded there).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Sequence


class ContinuationMemory:
    def __init__(self, max_tokens: int, order: int = 4):
        if max_tokens < 1 or order < 2:
            raise ValueError("a continuation memory needs max_tokens >= 1 and order >= 2")
        self.max_tokens, self.order = max_tokens, order
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()  # generation id -> its tokens, oldest first
        self.lead_ins: dict[int, int] = {}  # generation id -> how many of its first tokens are prompt lead-in
        self.held = 0  # tokens over all sequences
        self.counts: dict[tuple[int, ...], Counter] = {}  # n-gram -> Counter of the token that followed it
        self.next_id = 0
        self.lock = threading.Lock()  # the server's generations run on several threads

    def start(self, prompt_ids: Sequence[int] = ()) -> int:
        """A new generation's id, to `extend` as its tokens are committed; the prompt's last `order` tokens
        are its lead-in (held and bounded like the rest, but never counted as a continuation)."""
        with self.lock:
            self.next_id += 1
            lead_in = list(prompt_ids[-self.order:])
            while self.held + len(lead_in) > self.max_tokens and self._forget_oldest(keep=self.next_id):
                pass
            if self.held + len(lead_in) > self.max_tokens:
                lead_in = []  # a memory too small for it records the answer alone
            self.sequences[self.next_id] = lead_in
            self.lead_ins[self.next_id] = len(lead_in)
            self.held += len(lead_in)
            return self.next_id

    def extend(self, sequence: int, tokens: Sequence[int]) -> None:
        """Append committed tokens to a generation (one that was forgotten meanwhile starts again)."""
        with self.lock:
            if sequence not in self.sequences:
                self.sequences[sequence], self.lead_ins[sequence] = [], 0
            held = self.sequences[sequence]
            for token in tokens:
                if self.held >= self.max_tokens and not self._forget_oldest(keep=sequence):
                    return  # this generation alone fills the memory: its later tokens are not kept
                held.append(token)
                self.held += 1
                self._count(held, len(held) - 1, +1)

    def _forget_oldest(self, keep: int) -> bool:
        oldest = next((key for key in self.sequences if key != keep), None)
        if oldest is None:
            return False
        tokens = self.sequences.pop(oldest)
        lead_in = self.lead_ins.pop(oldest)
        for end in range(lead_in, len(tokens)):
            self._count(tokens, end, -1)
        self.held -= len(tokens)
        return True

    def _count(self, tokens: list[int], end: int, change: int) -> None:
        """Add (or take back) the n-grams that token `end` follows."""
        for n in range(2, self.order + 1):
            if end - n >= 0:
                self._change(tuple(tokens[end - n:end]), tokens[end], change)

    def _change(self, gram: tuple[int, ...], token: int, change: int) -> None:
        following = self.counts.setdefault(gram, Counter())
        following[token] += change
        if following[token] <= 0:
            del following[token]
            if not following:
                del self.counts[gram]

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """(tokens, n): up to max_tokens continuation tokens by the most frequent-next walk, and the length of
        the suffix the first of them was found after (0: nothing)."""
        with self.lock:
            tail = list(context[-self.order:])
            tokens: list[int] = []
            first_match = 0
            while len(tokens) < max_tokens:
                found = None
                for n in range(min(self.order, len(tail)), 1, -1):
                    following = self.counts.get(tuple(tail[-n:]))
                    if following:
                        found = (following.most_common(1)[0][0], n)
                        break
                if found is None:
                    break
                token, n = found
                first_match = first_match or n
                tokens.append(token)
                tail = (tail + [token])[-self.order:]
            return tokens, first_match

    def memory_bytes(self) -> int:
        """An estimate: 8 bytes per held token and ~120 per n-gram entry (dict slot, tuple, counter)."""
        return 8 * self.held + 120 * sum(len(following) for following in self.counts.values())
