"""Anthropic Messages replies: the `message` object, and its stream (message_start, content blocks opened,
filled by deltas and closed, message_delta with the stop reason, message_stop), written from the one
answer split (server/answer.py)."""

from __future__ import annotations

import json
from typing import Callable, Sequence

from specdec.api.reasoning import Reasoning
from specdec.core.rounds import GenerationResult, StreamChunk
from specdec.server.answer import AnswerPart, AnswerStream, whole_answer
from specdec.server.protocol import new_id
from specdec.server.replies import named_sse, speculative_stats
from specdec.server.tools import ToolCall

# HTTP status -> Anthropic's error type.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def stop_reason(result: GenerationResult, stops: Sequence[str], called: bool,
                detokenize: Callable[[list[int]], str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a tool call, the token limit, a stop sequence (the text its last tokens
    spell past the answer starts with it), or the end of the turn."""
    if called:
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    if stops:
        tail = detokenize(result.token_ids)[len(result.text):]
        for stop in stops:
            if tail.startswith(stop):
                return "stop_sequence", stop
    return "end_turn", None


def tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments or "{}")}


def input_usage(prompt_tokens: int, cached_tokens: int) -> dict:
    """Anthropic's count of a prompt: input_tokens are those computed, cache_read_input_tokens those a prefix
    cache held (the stream's message_start, sent before the cache is consulted, reports none read)."""
    return {"input_tokens": prompt_tokens - cached_tokens, "cache_read_input_tokens": cached_tokens}


class AnthropicReply:
    """The reply to one Messages request. `tools` are the chat request's (OpenAI-style) definitions."""

    media_type = "text/event-stream"

    def __init__(self, model: str, tools: Sequence[dict], reasoning: Reasoning | None, stops: Sequence[str],
                 detokenize: Callable[[list[int]], str]):
        self.model, self.tools, self.reasoning, self.stops, self.detokenize = model, tools, reasoning, stops, detokenize
        self.id = new_id("msg")
        self.answer = AnswerStream(tools, reasoning)
        self.block: str | None = None  # the kind of the content block open in the stream
        self.blocks = 0  # blocks started so far

    def _message(self, content: list[dict], prompt_tokens: int, output_tokens: int,
                 reason: tuple[str | None, str | None], cached_tokens: int = 0) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason[0], "stop_sequence": reason[1],
                "usage": input_usage(prompt_tokens, cached_tokens) | {"output_tokens": output_tokens}}

    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        thought, text, calls = whole_answer(result.text, self.tools, self.reasoning)
        content = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
        content += [{"type": "text", "text": text}] if text else []
        content += [tool_use(call) for call in calls]
        reason = stop_reason(result, self.stops, bool(calls), self.detokenize)
        return self._message(content, prompt_tokens, len(result.token_ids), reason,
                             result.stats.cached_prompt_tokens) | {
            "specdec": speculative_stats(result)}

    # -- the stream ------------------------------------------------------------------------------------
    def stream_start(self, prompt_tokens: int) -> list[str]:
        opening = {"type": "message_start", "message": self._message([], prompt_tokens, 0, (None, None))}
        return [named_sse(opening), named_sse({"type": "ping"})]

    def keep_alive(self) -> list[str]:
        return [named_sse({"type": "ping"})]  # Anthropic's own keep-alive event

    def stream_text(self, index: int, chunk: StreamChunk) -> list[str]:
        return self._blocks_of(self.answer.feed(chunk.text))

    def stream_done(self, index: int, result: GenerationResult) -> list[str]:
        frames = self._blocks_of(self.answer.finish()) + self._close_block()
        reason, sequence = stop_reason(result, self.stops, self.answer.call_count > 0, self.detokenize)
        return frames + [named_sse({"type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                    "usage": input_usage(result.stats.prompt_tokens, result.stats.cached_prompt_tokens)
                                    | {"output_tokens": len(result.token_ids)},
                                    "specdec": speculative_stats(result)}),
                         named_sse({"type": "message_stop"})]

    def stream_failed(self, message: str, kind: str) -> list[str]:
        return [named_sse(anthropic_error(400 if kind == "invalid_request_error" else 500, message))]

    def stream_end(self, results: list[GenerationResult | None], prompt_tokens: int) -> list[str]:
        return []

    def _blocks_of(self, parts: list[AnswerPart]) -> list[str]:
        frames: list[str] = []
        for part in parts:
            if part.kind == "call":
                frames += self._close_block() + self._open_block("tool_use", {**tool_use(part.call), "input": {}})
                frames.append(self._delta({"type": "input_json_delta", "partial_json": part.call.arguments}))
                frames += self._close_block()
                continue
            if self.block != part.kind:
                frames += self._close_block()
                frames += self._open_block(part.kind, {"type": "thinking", "thinking": "", "signature": ""}
                                           if part.kind == "reasoning" else {"type": "text", "text": ""})
            frames.append(self._delta({"type": "thinking_delta", "thinking": part.text} if part.kind == "reasoning"
                                      else {"type": "text_delta", "text": part.text}))
        return frames

    def _open_block(self, kind: str, block: dict) -> list[str]:
        self.block = kind
        self.blocks += 1
        return [named_sse({"type": "content_block_start", "index": self.blocks - 1, "content_block": block})]

    def _delta(self, delta: dict) -> str:
        return named_sse({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

    def _close_block(self) -> list[str]:
        if self.block is None:
            return []
        self.block = None
        return [named_sse({"type": "content_block_stop", "index": self.blocks - 1})]
