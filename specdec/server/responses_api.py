"""OpenAI's Responses API request (`POST /v1/responses`: what Codex CLI and the Agents SDK speak), read into
the one chat request the server runs (ChatCompletionRequest), so that sampling, tools and their grammars
and the bounds are exactly chat's.

Input items read: messages (text parts: input_text / output_text), function_call and function_call_output;
reasoning items are skipped (chat templates drop earlier reasoning). Function tools and namespace tools (their
functions listed as "namespace.name", called back with `namespace` set); hosted tools (web_search,
file_search, ...) are left out of what the model sees; custom free-form tools and image or file inputs are a
400 naming them. OpenAI fields this server
does not implement are accepted at their neutral value only, as in chat.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specdec.server.protocol import ChatCompletionRequest
from specdec.server.request_body import BadRequest, refuse_unless_neutral

NEUTRAL_ONLY: dict[str, tuple] = {"background": (None, False), "conversation": (None,), "prompt": (None,),
                                  "max_tool_calls": (None,), "top_logprobs": (None, 0)}
# Chat fields whose errors name the Responses field the client sent.
RESPONSES_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}
TEXT_PARTS = ("input_text", "output_text")


class _Item(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict]

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content):
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS + ("refusal",) \
                        or not isinstance(part.get("text", part.get("refusal")), str):
                    kind = part.get("type") if isinstance(part, dict) else None
                    raise ValueError(f"{kind!r} content parts are not supported (only text: {', '.join(TEXT_PARTS)})")
            return "".join(part.get("text", part.get("refusal")) for part in content)
        return content


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None

    @property
    def listed_name(self) -> str:
        return f"{self.namespace}.{self.name}" if self.namespace else self.name


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict]

    @field_validator("output")
    @classmethod
    def _text_parts(cls, output):
        """A list output holds text parts (input_text / output_text with text); images and files are refused."""
        for index, part in enumerate(output if isinstance(output, list) else []):
            if part.get("type") not in ("input_text", "output_text", None) or not isinstance(part.get("text"), str):
                raise ValueError(f"output[{index}]: only text parts ({{\"type\": \"input_text\", \"text\": "
                                 "...}) are supported")
        return output

    @property
    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part["text"] for part in self.output)


class ReasoningItem(_Item):
    type: Literal["reasoning"]


InputItem = Annotated[Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem],
                      Field(discriminator="type")]
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def _typed(item):
    """An easy input message ({"role", "content"} without "type") is a message item."""
    if isinstance(item, dict) and "type" not in item and "role" in item:
        return {"type": "message", **item}
    if isinstance(item, dict) and item.get("type") not in ITEM_TYPES:
        raise ValueError(f"{item.get('type')!r} input items are not supported (only {', '.join(ITEM_TYPES)})")
    return item


def chat_messages(items: list) -> list[dict]:
    """Input items as chat messages: calls made in a row join one assistant message (after its text)."""
    messages: list[dict] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.content})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.listed_name,
                                                                        "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return messages


class FunctionTool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None
    namespace: str | None = None  # set for a function of a `namespace` tool

    @property
    def listed_name(self) -> str:
        """The name the model sees and calls: a namespace's functions as "namespace.name"."""
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    def as_chat_tool(self) -> dict:
        function = {"name": self.listed_name} | {key: value for key, value in
                                                  [("description", self.description),
                                                   ("parameters", self.parameters)] if value is not None}
        return {"type": "function", "function": function}


# Tools OpenAI runs on its side; a client that lists them (Codex CLI lists web_search) still works here, with
# the model not told of them.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
                "image_generation", "mcp", "local_shell", "tool_search")


def _function_tools(tools):
    """Function tools, those of `namespace` tools among them (flattened, each knowing its namespace); hosted
    tools left out; any other kind (custom free-form tools) refused."""
    if not isinstance(tools, list):
        return tools  # not a list: pydantic says so
    functions = []
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            inner = _function_tools(tool.get("tools") or [])
            if not isinstance(inner, list) or not all(isinstance(function, dict) for function in inner):
                raise ValueError("a namespace tool's tools must be a list of function tools")
            functions += [{**function, "namespace": tool.get("name")} for function in inner]
        elif kind == "function":
            functions.append(tool)
        elif kind not in HOSTED_TOOLS:
            raise ValueError(f"{kind!r} tools are not supported (function and namespace tools are; hosted tools "
                             "are left out)")
    return functions


class TextFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError('a format of type "json_schema" needs its schema')
        return self

    def as_response_format(self) -> dict:
        if self.type == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": self.name or "output", "schema": self.schema_}}
        return {"type": self.type}


class TextConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    reasoning: dict | None = None  # accepted: a model reasons as its chat template makes it
    metadata: dict[str, str] | None = None
    top_k: int = 0  # extensions, as in chat
    seed: int | None = None
    speculative: dict | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, given):
        if isinstance(given, list):
            return [_typed(item) for item in given]
        if given == "":
            raise ValueError("must not be empty")
        return given

    @field_validator("tools", mode="before")
    @classmethod
    def _functions_only(cls, tools):
        return _function_tools(tools)

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, metadata):
        """OpenAI's bounds: at most 16 pairs, keys up to 64 characters, values up to 512."""
        if metadata and (len(metadata) > 16 or any(len(key) > 64 or len(value) > 512 for key, value in metadata.items())):
            raise ValueError("at most 16 pairs, each key at most 64 characters and each value at most 512")
        return metadata

    @model_validator(mode="after")
    def _neutral_only(self):
        refuse_unless_neutral(self.model_extra, NEUTRAL_ONLY)
        return self

    def input_messages(self) -> list[dict]:
        """This request's own input as chat messages (what a later response continues from)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return chat_messages(self.input)

    def namespaces(self) -> dict[str, tuple[str, str]]:
        """Listed name -> (namespace, name) of the namespaced functions."""
        return {tool.listed_name: (tool.namespace, tool.name) for tool in self.tools or [] if tool.namespace}

    def chat_request(self, history: tuple[dict, ...] = ()) -> ChatCompletionRequest:
        """The chat request this body means after `history` (a previous response's conversation); BadRequest
        naming the Responses field at fault."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        fields = {"model": self.model, "messages": system + list(history) + self.input_messages(),
                  "max_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": self.top_k, "seed": self.seed, "stream": self.stream,
                  "parallel_tool_calls": self.parallel_tool_calls}
        if self.tools:
            fields["tools"] = [tool.as_chat_tool() for tool in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.format is not None and self.text.format.type != "text":
            fields["response_format"] = self.text.format.as_response_format()
        if self.speculative is not None:
            fields["speculative"] = self.speculative
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else None
            name = RESPONSES_NAMES.get(field, field)
            message = error["msg"].removeprefix("Value error, ")
            raise BadRequest(f"{name}: {message}" if name else message, name) from None


def chat_tool_choice(choice):
    """Responses' tool_choice ({"type": "function", "name": ...} for one function) as chat's."""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict):
        raise BadRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                         "tool_choice")
    return choice
