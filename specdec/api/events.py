"""What happens to a request in a batch, as typed events: the batch runner's step returns them, the
server's scheduler passes them to the request's reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from specdec.core.rounds import GenerationResult, StreamChunk
from specdec.errors import SpecdecError


@dataclass(frozen=True)
class Started:
    """The prompt is prefilled: the request's rounds begin."""
    prompt_tokens: int


@dataclass(frozen=True)
class Chunk:
    """A round's committed tokens and the text they release (logprobs included when asked for)."""
    chunk: StreamChunk


@dataclass(frozen=True)
class Done:
    result: GenerationResult


@dataclass(frozen=True)
class Refused:
    """Bad input found only once the request started (a prompt too long for the model): the client's fault."""
    error: SpecdecError


@dataclass(frozen=True)
class Failed:
    """A bug, not bad input: this request fails, the others go on."""
    error: Exception


@dataclass(frozen=True)
class Cancelled:
    reason: str


Event = Union[Started, Chunk, Done, Refused, Failed, Cancelled]
FINAL_EVENTS = (Done, Refused, Failed, Cancelled)  # the last event of a request
