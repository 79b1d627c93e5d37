"""Anthropic's Messages API request (`POST /v1/messages`, `/v1/messages/count_tokens`), read into the one
chat request the server runs (ChatCompletionRequest), so that sampling, tools and their grammars, stop
strings and the bounds are exactly chat's.

Blocks: text, tool_use, tool_result and thinking (an earlier answer's reasoning, which chat templates drop
from history) are read; image and document blocks are refused with a 400 naming the block. Fields
Anthropic defines that have no meaning here (metadata, service_tier, cache_control on blocks) are ignored.
Sampling: the SDK no longer sends temperature / top_p / top_k (today's models fix them); a request without
them samples at temperature 1 as Anthropic's API did, and a client may still send them (e.g. `extra_body`).
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specdec.server.protocol import MAX_STOP_CHARS, ChatCompletionRequest
from specdec.server.request_body import BadRequest

SUPPORTED_BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
# Chat fields whose errors name the Anthropic field the client sent.
ANTHROPIC_NAMES = {"stop": "stop_sequences", "parallel_tool_calls": "tool_choice", "response_format": "output_config"}


class _Block(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(block.text for block in self.content)


class ThinkingBlock(_Block):
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock], Field(discriminator="type")]


def _known_blocks(content):
    if isinstance(content, list):
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in SUPPORTED_BLOCKS:
                raise ValueError(f"{kind!r} blocks are not supported (only {', '.join(SUPPORTED_BLOCKS)})")
    return content


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    # "system" mid-conversation: Claude Code sends one (a beta) and falls back without it when refused
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _supported(cls, content):
        return _known_blocks(content)

    def chat_messages(self) -> list[dict]:
        """This turn as chat messages: an assistant's text and tool calls; a user's tool results (each a
        `tool` message, first, as the calls were made) and then its text."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        text = "".join(block.text for block in self.content if isinstance(block, TextBlock))
        if self.role == "system":
            if any(not isinstance(block, TextBlock) for block in self.content):
                raise ValueError("a system message holds text blocks only")
            return [{"role": "system", "content": text}]
        if self.role == "assistant":
            if any(isinstance(block, ToolResultBlock) for block in self.content):
                raise ValueError("tool_result blocks belong in a user message")
            calls = [{"id": block.id, "type": "function",
                      "function": {"name": block.name, "arguments": json.dumps(block.input)}}
                     for block in self.content if isinstance(block, ToolUseBlock)]
            return [{"role": "assistant", "content": text or (None if calls else ""),
                     **({"tool_calls": calls} if calls else {})}]
        if any(isinstance(block, ToolUseBlock) for block in self.content):
            raise ValueError("tool_use blocks belong in an assistant message")
        results = [{"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text}
                   for block in self.content if isinstance(block, ToolResultBlock)]
        return results + ([{"role": "user", "content": text}] if text or not results else [])


class AnthropicTool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: str
    description: str | None = None
    input_schema: dict

    def as_chat_tool(self) -> dict:
        function = {"name": self.name, "parameters": self.input_schema}
        return {"type": "function", "function": function | ({"description": self.description}
                                                            if self.description is not None else {})}


class AnthropicToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self):
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('a tool_choice of type "tool" names the tool (name), and only that type does')
        return self

    def as_chat_choice(self):
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class OutputFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(BaseModel):
    """`output_config`: the answer's JSON schema (constrained exactly, as chat's response_format); `effort` is
    accepted and has no effect (the model reasons as its chat template makes it)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    format: OutputFormat | None = None
    effort: str | None = None


class MessagesInput(BaseModel):
    """What count_tokens reads: the prompt (system, messages, tools)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict | None = None  # accepted: a model reasons as its chat template makes it

    def chat_fields(self) -> dict:
        messages = [message for turn in self.messages for message in turn.chat_messages()]
        system = self.system if isinstance(self.system, str) or self.system is None else \
            "".join(block.text for block in self.system)
        fields: dict = {"model": self.model,
                        "messages": ([{"role": "system", "content": system}] if system else []) + messages}
        if self.messages[-1].role == "assistant":  # a prefill: the answer begun, to be continued
            fields["continue_final_message"] = True
        if self.tools:
            fields["tools"] = [tool.as_chat_tool() for tool in self.tools]
        if self.tool_choice is not None and (self.tools or self.tool_choice.type != "auto"):
            fields["tool_choice"] = self.tool_choice.as_chat_choice()
            fields["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        return fields

    def chat_request(self, **more) -> ChatCompletionRequest:
        """The chat request this body means (BadRequest naming the Anthropic field at fault)."""
        try:
            fields = self.chat_fields()
        except ValueError as exc:
            raise BadRequest(f"messages: {exc}", "messages") from None
        try:
            return ChatCompletionRequest.model_validate(fields | more)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else None
            message = error["msg"].removeprefix("Value error, ")
            raise BadRequest(f"{ANTHROPIC_NAMES.get(field, field)}: {message}" if field else message,
                             ANTHROPIC_NAMES.get(field, field)) from None


class MessagesRequest(MessagesInput):
    """`POST /v1/messages`."""

    max_tokens: int = Field(gt=0)
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] | None = \
        Field(default=None, max_length=4)
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    output_config: OutputConfig | None = None
    seed: int | None = None  # extension, as in chat
    speculative: dict | None = None  # extension, read as chat reads it

    def chat_request(self) -> ChatCompletionRequest:
        more = {"max_tokens": self.max_tokens, "stop": self.stop_sequences, "stream": self.stream,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        if self.speculative is not None:
            more["speculative"] = self.speculative
        if self.output_config is not None and self.output_config.format is not None:
            more["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": self.output_config.format.schema_}}
        return super().chat_request(**more)
