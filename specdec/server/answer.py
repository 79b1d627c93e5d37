"""A chat answer as every API dialect writes it: reasoning, text and tool calls, in order, whole or as it
streams. The dialects (OpenAI chat, Responses, Anthropic Messages) differ only in how they spell these
parts; how the parts are found (the reasoning block, tool-call markers, a call written as text) is here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from specdec.api.reasoning import Reasoning, ReasoningStream, split_reasoning
from specdec.server.tools import CallStream, ToolCall, parse_calls


@dataclass(frozen=True)
class AnswerPart:
    kind: Literal["reasoning", "text", "call"]
    text: str = ""  # reasoning or text
    call: ToolCall | None = None


class AnswerStream:
    """One answer's text, fed as its rounds commit it, split into parts (a tool call only once it is whole).
    `tools` are OpenAI-style definitions ({"type": "function", "function": {...}}); none: no calls are read."""

    def __init__(self, tools: Sequence[dict] = (), reasoning: Reasoning | None = None):
        self.calls = CallStream(tools) if tools else None
        self.thoughts = ReasoningStream(reasoning) if reasoning else None

    @property
    def call_count(self) -> int:
        return self.calls.calls if self.calls else 0

    def feed(self, text: str) -> list[AnswerPart]:
        thought = ""
        if self.thoughts:
            thought, text = self.thoughts.feed(text)
        return self._parts(thought, text, last=False)

    def finish(self) -> list[AnswerPart]:
        """What was held back (a tag cut in two, a call not yet closed) once the answer has ended."""
        thought, text = self.thoughts.finish() if self.thoughts else ("", "")
        return self._parts(thought, text, last=True)

    def _parts(self, thought: str, text: str, last: bool) -> list[AnswerPart]:
        calls: list[ToolCall] = []
        if self.calls:
            text, calls = self.calls.feed(text)
            if last:
                rest, written = self.calls.finish()
                text, calls = text + rest, calls + written
        parts = [AnswerPart("reasoning", thought)] if thought else []
        parts += [AnswerPart("text", text)] if text else []
        return parts + [AnswerPart("call", call=call) for call in calls]


def whole_answer(text: str, tools: Sequence[dict] = (), reasoning: Reasoning | None = None
                 ) -> tuple[str | None, str | None, list[ToolCall]]:
    """(reasoning or None, content or None, tool calls) of a finished answer."""
    thought, text = split_reasoning(text, reasoning) if reasoning else (None, text)
    content, calls = parse_calls(text, tools) if tools else (text, [])
    return thought, content, calls
