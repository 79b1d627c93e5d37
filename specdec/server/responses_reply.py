"""Responses API replies: the `response` object (output items: reasoning, an assistant message, function
calls) and its stream of named events (response.created ... response.completed, each with its
sequence_number), written from the one answer split (server/answer.py). A finished response is kept for
`previous_response_id` when its request asked to store it."""

from __future__ import annotations

import time
import uuid
from typing import Sequence

from specdec.api.reasoning import Reasoning
from specdec.core.rounds import GenerationResult, StreamChunk
from specdec.server.answer import AnswerPart, AnswerStream, whole_answer
from specdec.server.replies import KEEP_ALIVE, named_sse, speculative_stats
from specdec.server.response_store import ResponseStore
from specdec.server.responses_api import ResponsesRequest
from specdec.server.tools import ToolCall


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(text: str, status: str = "completed", identifier: str | None = None) -> dict:
    return {"id": identifier or item_id("msg"), "type": "message", "status": status, "role": "assistant",
            "content": [output_text(text)] if status == "completed" else []}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(text: str, status: str = "completed", identifier: str | None = None) -> dict:
    return {"id": identifier or item_id("rs"), "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}


def call_item(call: ToolCall, status: str = "completed", identifier: str | None = None,
              namespaces: dict[str, tuple[str, str]] | None = None) -> dict:
    """A function_call item; a namespaced function's call names its namespace and its own name."""
    namespace, name = (namespaces or {}).get(call.name, (None, call.name))
    item = {"id": identifier or item_id("fc"), "type": "function_call", "status": status, "call_id": call.id,
            "name": name, "arguments": call.arguments if status == "completed" else ""}
    return item | ({"namespace": namespace} if namespace else {})


class ResponsesReply:
    """The reply to one Responses request. `tools`: the chat request's definitions (none: no calls read);
    `history`: the conversation before this request's input (a previous response's), for the store."""

    media_type = "text/event-stream"

    def __init__(self, model: str, body: ResponsesRequest, tools: Sequence[dict], reasoning: Reasoning | None,
                 store: ResponseStore, history: tuple[dict, ...] = ()):
        self.model, self.body, self.tools, self.reasoning = model, body, tools, reasoning
        self.store, self.history = store, history
        self.id = item_id("resp")
        self.created = time.time()
        self.answer = AnswerStream(tools, reasoning)
        self.namespaces = body.namespaces()
        self.items: list[dict] = []  # output items finished so far (the stream's)
        self.open: dict | None = None  # the item being streamed: reasoning or message
        self.open_text = ""
        self.sequence = 0
        self.prompt_tokens = 0

    # -- the response object -------------------------------------------------------------------------
    def response(self, status: str, output: list[dict], usage: dict | None = None,
                 result: GenerationResult | None = None) -> dict:
        body = self.body
        text_format = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format \
            else {"type": "text"}
        response = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id, "reasoning": body.reasoning, "store": body.store,
            "temperature": body.temperature, "top_p": body.top_p, "text": {"format": text_format},
            "tool_choice": body.tool_choice or "auto", "truncation": "disabled", "usage": usage,
            "tools": [{"strict": True, **tool.model_dump(exclude_none=True)} for tool in body.tools or []]}
        if result is not None:
            response["specdec"] = speculative_stats(result)
        return response

    def finished(self, result: GenerationResult, prompt_tokens: int, output: list[dict]) -> dict:
        """The completed (or, cut by max_output_tokens, incomplete) response, kept when asked to be."""
        output_tokens = len(result.token_ids)
        cached = result.stats.cached_prompt_tokens
        usage = {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": prompt_tokens + output_tokens}
        called = any(item["type"] == "function_call" for item in output)
        status = "incomplete" if result.finish_reason == "length" and not called else "completed"
        response = self.response(status, output, usage, result)
        if self.body.store:
            self.store.put(response, self.conversation(output))
        return response

    def conversation(self, output: list[dict]) -> list[dict]:
        """The history, this request's input and its answer, as chat messages (what a later request continues)."""
        text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
        calls = [{"id": item["call_id"], "type": "function", "function": {
                  "name": f"{item['namespace']}.{item['name']}" if item.get("namespace") else item["name"],
                  "arguments": item["arguments"]}}
                 for item in output if item["type"] == "function_call"]
        answer = {"role": "assistant", "content": text or (None if calls else "")} | (
            {"tool_calls": calls} if calls else {})
        return list(self.history) + self.body.input_messages() + [answer]

    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        thought, text, calls = whole_answer(result.text, self.tools, self.reasoning)
        output = [reasoning_item(thought)] if thought else []
        output += [message_item(text)] if text else []
        output += [call_item(call, namespaces=self.namespaces) for call in calls]
        return self.finished(result, prompt_tokens, output)

    # -- the stream ------------------------------------------------------------------------------------
    def _event(self, kind: str, **fields) -> str:
        self.sequence += 1
        return named_sse({"type": kind, "sequence_number": self.sequence - 1, **fields})

    def stream_start(self, prompt_tokens: int) -> list[str]:
        self.prompt_tokens = prompt_tokens
        started = self.response("in_progress", [])
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started)]

    def keep_alive(self) -> list[str]:
        return [KEEP_ALIVE]

    def stream_text(self, index: int, chunk: StreamChunk) -> list[str]:
        return self._events_of(self.answer.feed(chunk.text))

    def stream_done(self, index: int, result: GenerationResult) -> list[str]:
        frames = self._events_of(self.answer.finish()) + self._close_item()
        response = self.finished(result, self.prompt_tokens, self.items)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return frames + [self._event(kind, response=response)]

    def stream_failed(self, message: str, kind: str) -> list[str]:
        return [self._event("error", code=kind, message=message, param=None)]

    def stream_end(self, results: list[GenerationResult | None], prompt_tokens: int) -> list[str]:
        return []

    def _events_of(self, parts: list[AnswerPart]) -> list[str]:
        frames: list[str] = []
        for part in parts:
            if part.kind == "call":
                frames += self._close_item() + self._call_events(part.call)
                continue
            kind = "reasoning" if part.kind == "reasoning" else "message"
            if self.open is None or self.open["type"] != kind:
                frames += self._close_item() + self._open_item(kind)
            self.open_text += part.text
            delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            frames.append(self._event(delta, item_id=self.open["id"], output_index=len(self.items), content_index=0,
                                      delta=part.text, **({} if kind == "reasoning" else {"logprobs": []})))
        return frames

    def _open_item(self, kind: str) -> list[str]:
        self.open = message_item("", "in_progress") if kind == "message" else reasoning_item("", "in_progress")
        self.open_text = ""
        frames = [self._event("response.output_item.added", output_index=len(self.items), item=self.open)]
        if kind == "message":
            frames.append(self._event("response.content_part.added", item_id=self.open["id"],
                                      output_index=len(self.items), content_index=0, part=output_text("")))
        return frames

    def _close_item(self) -> list[str]:
        if self.open is None:
            return []
        item, text, index = self.open, self.open_text, len(self.items)
        self.open = None
        if item["type"] == "message":
            done = message_item(text, identifier=item["id"])
            frames = [self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=text, logprobs=[]),
                      self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=output_text(text))]
        else:
            done = reasoning_item(text, identifier=item["id"])
            frames = [self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=text)]
        self.items.append(done)
        return frames + [self._event("response.output_item.done", output_index=index, item=done)]

    def _call_events(self, call: ToolCall) -> list[str]:
        index, started = len(self.items), call_item(call, "in_progress", namespaces=self.namespaces)
        done = call_item(call, identifier=started["id"], namespaces=self.namespaces)
        self.items.append(done)
        return [self._event("response.output_item.added", output_index=index, item=started),
                self._event("response.function_call_arguments.delta", item_id=started["id"], output_index=index,
                            delta=call.arguments),
                self._event("response.function_call_arguments.done", item_id=started["id"], output_index=index,
                            name=call.name, arguments=call.arguments),
                self._event("response.output_item.done", output_index=index, item=done)]
