"""Ollama's replies to /api/chat and /api/generate: one JSON object, or a stream of them, one a line
(application/x-ndjson), the last with `done: true`, `done_reason` and the timings in nanoseconds; written from
the one answer split (server/answer.py). Speculation's own figures ride along as fields a client can ignore:
`draft_n` and `draft_n_accepted` (llama-server's names) and `specdec`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Literal, Sequence

from specdec.api.reasoning import Reasoning
from specdec.core.rounds import GenerationResult, StreamChunk, TokenLogprob
from specdec.server.answer import AnswerPart, AnswerStream, whole_answer
from specdec.server.replies import chat_logprobs, speculative_stats
from specdec.server.tools import ToolCall


def line(payload: dict) -> str:
    return json.dumps(payload, ensure_ascii=False) + "\n"


def created_at() -> str:
    """RFC 3339 in UTC, as Ollama writes its timestamps."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def nanoseconds(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def tool_call(call: ToolCall, index: int) -> dict:
    """A call as Ollama writes it: its arguments an object, not JSON text."""
    return {"id": call.id, "function": {"index": index, "name": call.name,
                                        "arguments": json.loads(call.arguments or "{}")}}


@dataclass(frozen=True)
class ReplyTiming:
    """When the request arrived (time.perf_counter) and how long loading its model took."""

    arrived: float
    load_seconds: float = 0.0


class OllamaReply:
    """The reply to one /api/chat (`kind` "chat": a `message`) or /api/generate ("generate": `response`, and
    `context`, the conversation's token ids, when `prompt_ids` are known) request."""

    media_type = "application/x-ndjson"

    def __init__(self, kind: Literal["chat", "generate"], model: str, timing: ReplyTiming,
                 token_text: Callable[[int], str], tools: Sequence[dict] = (), reasoning: Reasoning | None = None,
                 prompt_ids: list[int] | None = None):
        self.kind, self.model, self.timing, self.token_text = kind, model, timing, token_text
        self.tools, self.reasoning, self.prompt_ids = tools, reasoning, prompt_ids
        self.answer = AnswerStream(tools, reasoning)

    def _object(self, thought: str | None, text: str | None, calls: list[dict], done: bool) -> dict:
        body: dict = {"model": self.model, "created_at": created_at()}
        if self.kind == "chat":
            message = {"role": "assistant", "content": text or ""}
            message |= {"thinking": thought} if thought else {}
            body["message"] = message | ({"tool_calls": calls} if calls else {})
        else:
            body["response"] = text or ""
            body |= {"thinking": thought} if thought else {}
        return body | {"done": done}

    def _final(self, body: dict, result: GenerationResult) -> dict:
        s = result.stats
        body["done_reason"] = "length" if result.finish_reason == "length" else "stop"
        if self.kind == "generate" and self.prompt_ids is not None:
            body["context"] = [*self.prompt_ids, *result.token_ids]
        return body | {
            "total_duration": nanoseconds(time.perf_counter() - self.timing.arrived),
            "load_duration": nanoseconds(self.timing.load_seconds),
            "prompt_eval_count": s.prompt_tokens, "prompt_eval_duration": nanoseconds(s.prefill_seconds),
            "eval_count": len(result.token_ids), "eval_duration": nanoseconds(s.seconds - s.prefill_seconds),
            "draft_n": s.drafted, "draft_n_accepted": s.accepted,
            "specdec": speculative_stats(result) | {"cached_prompt_tokens": s.cached_prompt_tokens}}

    def _logprobs(self, entries: list[TokenLogprob] | None) -> dict:
        return {} if entries is None else {"logprobs": chat_logprobs(entries, self.token_text)}

    # -- whole -----------------------------------------------------------------------------------
    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        thought, text, calls = whole_answer(result.text, self.tools, self.reasoning)
        body = self._object(thought, text, [tool_call(call, i) for i, call in enumerate(calls)], True)
        return self._final(body | self._logprobs(result.logprobs), result)

    # -- the stream: one object a line -----------------------------------------------------------
    def stream_start(self, prompt_tokens: int) -> list[str]:
        return []

    def keep_alive(self) -> list[str]:
        return []  # every line of an NDJSON stream is an object its clients read: nothing to send

    def stream_text(self, index: int, chunk: StreamChunk) -> list[str]:
        parts = self.answer.feed(chunk.text)
        if not parts and not chunk.logprobs:
            return []
        return [line(self._parts_object(parts, False) | self._logprobs(chunk.logprobs))]

    def stream_done(self, index: int, result: GenerationResult) -> list[str]:
        held = self.answer.finish()
        frames = [line(self._parts_object(held, False))] if held else []
        return frames + [line(self._final(self._object(None, "", [], True), result))]

    def stream_failed(self, message: str, kind: str) -> list[str]:
        return [line({"error": message})]  # what Ollama's clients read mid-stream

    def stream_end(self, results: list[GenerationResult | None], prompt_tokens: int) -> list[str]:
        return []

    def _parts_object(self, parts: list[AnswerPart], done: bool) -> dict:
        calls_before = self.answer.call_count - sum(part.kind == "call" for part in parts)
        thought = "".join(part.text for part in parts if part.kind == "reasoning")
        text = "".join(part.text for part in parts if part.kind == "text")
        calls = [tool_call(part.call, calls_before + i) for i, part in
                 enumerate(part for part in parts if part.kind == "call")]
        return self._object(thought, text, calls, done)


def load_reply(kind: Literal["chat", "generate"], model: str, reason: Literal["load", "unload"],
               timing: ReplyTiming) -> dict:
    """The answer to a request with nothing to generate (no messages, no prompt): the model is loaded (or
    unloaded, with keep_alive 0), as Ollama answers its preload."""
    body: dict = {"model": model, "created_at": created_at()}
    body |= {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
    return body | {"done": True, "done_reason": reason,
                   "total_duration": nanoseconds(time.perf_counter() - timing.arrived),
                   "load_duration": nanoseconds(timing.load_seconds)}
