"""The one commit step: tokens accepted in a round become output.

A round may accept several tokens at once, so EOS, a stop string or
max_new_tokens can fall inside the block. `Committer.commit` trims the block at
the first of them, and keeps the token ids, the text and the streamed chunks in
agreement:
  - text == decode(token_ids) cut before the first stop string (the ids keep
    the tokens that spell the stop string, as transformers and vLLM do);
  - the concatenation of all streamed chunks == text;
  - EOS ends generation and is not part of token_ids or text.
Text that could still turn out to start a stop string is held back from the
stream until it is known not to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from specdec.core.rounds import RoundProvenance, StreamChunk
from specdec.core.text_decoding import decode_text, kept_markers
from specdec.errors import InvalidParameterError


@dataclass(frozen=True)
class StopCriteria:
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidParameterError("max_new_tokens must be an integer >= 1")
        if any(not s for s in self.stop_strings):
            raise InvalidParameterError("stop strings must be non-empty")


@dataclass
class CommitOutcome:
    tokens: list[int]  # the part of the offered block that was kept
    text_chunk: str  # new text safe to stream
    finish_reason: str | None  # "stop" (EOS or stop string), "length", or None to go on
    logprobs: list | None = None  # the kept tokens' rounds.TokenLogprob, when the generation records them
    provenance: RoundProvenance | None = None  # how the kept tokens were made (set after the round's steps)

    def stream_chunk(self) -> StreamChunk | None:
        """What a stream shows of this round (None: it committed nothing and released no text)."""
        if not self.tokens and not self.text_chunk:
            return None
        return StreamChunk(self.text_chunk, self.tokens, self.logprobs, self.provenance)


@dataclass
class Committer:
    tokenizer: object
    criteria: StopCriteria
    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # decode(token_ids), cut at a stop string once one is found
    streamed: str = ""  # what has been handed out as chunks
    finish_reason: str | None = None

    def __post_init__(self):
        self.markers = kept_markers(self.tokenizer)  # special tokens the text keeps (harmony's channels)

    def commit(self, block: Sequence[int]) -> CommitOutcome:
        """Append an accepted block, trimmed at EOS / stop string / max_new_tokens."""
        if self.finish_reason is not None:
            raise RuntimeError("commit after generation finished")
        start = len(self.token_ids)
        kept: list[int] = []
        for token in block:
            if token in self.criteria.eos_token_ids:
                self.finish_reason = "stop"
                break
            kept.append(token)
            if start + len(kept) == self.criteria.max_new_tokens:
                self.finish_reason = "length"
                break
        self.token_ids.extend(kept)
        self.text = self._decode(self.token_ids)
        cut = self._find_stop(self.text)
        if cut is not None:
            self._trim_to_stop(start, cut)
            kept = self.token_ids[start:]
            self.finish_reason = "stop"
        return CommitOutcome(kept, self._release(), self.finish_reason)

    def finish(self, reason: str) -> CommitOutcome:
        """End the generation here (a grammar that allows nothing more): the text held back is released."""
        self.finish_reason = reason
        return CommitOutcome([], self._release(), reason)

    def _decode(self, ids: Sequence[int]) -> str:
        return decode_text(self.tokenizer, ids, self.markers)

    def _find_stop(self, text: str) -> int | None:
        """Index in text where the earliest stop string starts, if one appeared."""
        if not self.criteria.stop_strings:
            return None
        longest = max(len(s) for s in self.criteria.stop_strings)
        # Only text that changed can hold a new match; look back far enough for a
        # stop string that started in earlier text.
        search_from = max(0, len(self.streamed) - longest)
        hits = [i for s in self.criteria.stop_strings if (i := text.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _trim_to_stop(self, first_new_token: int, cut: int) -> None:
        # Keep tokens up to the one that completes the stop string: the same ids
        # however the tokens were split into rounds (earlier rounds held no match).
        for count in range(first_new_token + 1, len(self.token_ids) + 1):
            if self._find_stop(self._decode(self.token_ids[:count])) is not None:
                del self.token_ids[count:]
                break
        self.text = self.text[:cut]

    def _release(self) -> str:
        """The new stream chunk: all text when finished, else all but a possible stop-string start."""
        ready = self.text
        if self.finish_reason is None:
            if ready.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
                ready = ready.rstrip("\ufffd")
            if self.criteria.stop_strings:
                hold = max(len(s) for s in self.criteria.stop_strings) - 1
                ready = ready[: max(len(self.streamed), len(ready) - hold)]
        if not ready.startswith(self.streamed):
            # decoding revised earlier text (rare with byte-level BPE); never retract streamed text
            ready = self.streamed
        chunk = ready[len(self.streamed):]
        self.streamed = ready
        return chunk
