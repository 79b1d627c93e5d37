"""OpenAI request bodies: parsing, validation and the response/chunk shapes.

Policy for fields (docs/server.md has the table of every field):
- fields we implement are validated strictly: a wrong type or an out-of-range value is a 400;
- OpenAI fields we do not implement are accepted at their neutral value (e.g. `presence_penalty: 0`,
  `logprobs: false`, `n: 1`) and rejected with a 400 otherwise, so a client never silently gets
  something other than what it asked for;
- fields OpenAI does not define are ignored (clients add their own, e.g. `user`), as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specdec.api.request import MAX_TOP_LOGPROBS, GenerationRequest
from specdec.api.structured import GrammarSpec
from specdec.core.sampling import SamplingParams, check_seed
from specdec.core.speculation_length import KSetting
from specdec.errors import InvalidParameterError
from specdec.server.request_body import BadRequest, load_json, refuse_unless_neutral
from specdec.server.tools import auto_grammar, call_grammar

# OpenAI fields we accept only at their neutral value: field -> values that mean "off".
NEUTRAL_ONLY: dict[str, tuple] = {
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
    "functions": (None, []),  # the deprecated form of `tools`
    "function_call": (None, "none", "auto"),
    "best_of": (None, 1),
    "echo": (False, None),
}
MAX_CHOICES = 16  # `n`: choices per request (each a generation of its own, run together)
# tools per request, OpenAI's own bound: each tool's schema joins the call grammar a request compiles, and
# hundreds of them held the worker for minutes
MAX_TOOLS = 128


MAX_STOP_CHARS = 256  # each stop string is searched for after every round: keep that cheap


class SpeculativeOptions(BaseModel):
    """The `speculative` extension: turn the drafter off, or fix K, for one request."""

    model_config = ConfigDict(strict=True, extra="forbid")
    enabled: bool = True
    k: int | str | None = Field(default=None)  # N, "auto" or "auto:N" (K chosen up to N), as --k

    @field_validator("k")
    @classmethod
    def _k_grammar(cls, k) -> KSetting | None:
        try:  # a number comes as a JSON number
            return None if k is None else KSetting.parse(k, numbers_as_text=False)
        except InvalidParameterError as error:
            raise ValueError(str(error)) from None


class ToolFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    function: ToolFunction


class CalledFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: str
    arguments: str  # JSON text


class CalledTool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[CalledTool] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool's result: which call it answers

    @field_validator("content")
    @classmethod
    def _text_only(cls, content):
        if isinstance(content, list):  # OpenAI's content parts: only text parts are supported
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError("only text content parts are supported")
            return "".join(p["text"] for p in content)
        return content

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (an assistant message may give tool_calls instead)")
        return self

    def for_template(self) -> dict:
        """The message as chat templates read it: tool calls' arguments as objects, not JSON text."""
        # open-weight chat templates know "system", not OpenAI's newer name for it
        message: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": _json_or_text(call.function.arguments)}}
                for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def _json_or_text(text: str):
    """A tool call's arguments as the template reads them: the JSON value, or the text where it is not one
    (or one the body's own bounds would refuse)."""
    try:
        return load_json(text)
    except BadRequest:
        return text


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict | None = None  # {"name": ..., "schema": {...}, "strict": true}

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and not isinstance((self.json_schema or {}).get("schema"), dict):
            raise ValueError('type "json_schema" needs json_schema.schema, a JSON schema object')
        return self

    def grammar(self) -> GrammarSpec | None:
        if self.type == "json_object":
            return GrammarSpec("json_object")
        if self.type == "json_schema":
            return GrammarSpec("json_schema", self.json_schema["schema"])
        return None


class _Common(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # extension, as in vLLM
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)  # extension
    repetition_penalty: float = Field(default=1.0, gt=0.0)  # extension
    repeat_last_n: int = Field(default=-1, ge=-1)  # extension: the penalty's window (-1: the whole context)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    speculative: SpeculativeOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    response_format: ResponseFormat | None = None
    json_schema: dict | None = None  # llama-server's extension: the output's JSON schema
    grammar: str | None = None  # llama-server's extension: a GBNF grammar
    timings_per_token: bool = False  # llama-server's extension: its `timings` object on the reply

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, seed):
        try:
            check_seed(seed)
        except InvalidParameterError as error:
            raise ValueError(str(error)) from None
        return seed

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, value):
        if value is not None and value <= 0:
            raise ValueError("must be a positive integer")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop sequences must be at most {MAX_STOP_CHARS} characters")
        return stops

    @model_validator(mode="after")
    def _neutral_only(self):
        refuse_unless_neutral(self.model_extra, NEUTRAL_ONLY)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    @property
    def include_speculation(self) -> bool:
        """Extension: each stream chunk says how its tokens were made (`speculation`: RoundProvenance)."""
        return bool(self.stream_options and self.stream_options.get("include_speculation"))

    def output_grammar(self) -> GrammarSpec | None:
        """What the output must match: response_format, or llama-server's json_schema / grammar (one)."""
        given = [name for name in ("response_format", "json_schema", "grammar") if getattr(self, name) is not None
                 and not (name == "response_format" and self.response_format.type == "text")]
        if len(given) > 1:
            raise BadRequest(f"give one of {', '.join(given)}, not several", given[1])
        try:
            if self.json_schema is not None:
                return GrammarSpec("json_schema", self.json_schema)
            if self.grammar is not None:
                return GrammarSpec("gbnf", self.grammar)
            return None if self.response_format is None else self.response_format.grammar()
        except InvalidParameterError as error:
            raise BadRequest(str(error), given[0]) from None

    def generation_request(self, default_max_tokens: int, tokenizer=None, tool_grammar: bool = True) -> GenerationRequest:
        """The API's request for this body (InvalidParameterError where its settings do not go together);
        `tokenizer`: the served model's (a tool call grammar writes its markers as its tokens); `tool_grammar`:
        whether tool_choice "auto" constrains the answer to text or well-formed calls (chat only)."""
        prompt, chat = self.prompt_and_chat()
        sampling = SamplingParams.of(self)
        spec = self.speculative
        return GenerationRequest(prompt, self.token_limit or default_max_tokens,
                                 sampling, tuple(self.stop or ()), self.seed, chat,
                                 k=spec.k if spec else None, speculative=spec.enabled if spec else True,
                                 grammar=self.output_grammar(), logprobs=self.top_alternatives())

    def top_alternatives(self) -> int | None:
        """How many alternatives each token's log-probability comes with (None: no log-probabilities)."""
        return None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # extension, as vLLM's: the last message is the assistant's answer begun by the client, to be continued
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _tool_choice(self):
        choice = self.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if not isinstance(name, str):
                raise ValueError('tool_choice must be "none", "auto", "required" or '
                                 '{"type": "function", "function": {"name": ...}}')
            if name not in [tool.function.name for tool in self.tools or []]:
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        elif choice == "required" and not self.tools:
            raise ValueError('tool_choice "required" needs tools')
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        return self

    @property
    def uses_tools(self) -> bool:
        """Whether the tools are listed to the model and its answer read for calls."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced_tool(self) -> str | None | bool:
        """False: the model may answer in text; True: it must call a tool; a name: it must call that one."""
        if isinstance(self.tool_choice, dict):
            return self.tool_choice["function"]["name"]
        return self.tool_choice == "required"

    def tool_definitions(self) -> tuple[dict, ...]:
        return tuple(tool.model_dump(exclude_none=True) for tool in self.tools or [])

    def generation_request(self, default_max_tokens: int, tokenizer=None, tool_grammar: bool = True) -> GenerationRequest:
        request = super().generation_request(default_max_tokens, tokenizer)
        if self.continue_final_message:
            request = request.replace(continue_final=True)
        if not self.uses_tools:
            return request
        forced, grammar, tools = self.forced_tool, request.grammar, list(self.tool_definitions())
        if forced:
            if grammar is not None:
                raise BadRequest("a required tool call and a response format cannot both apply", "tool_choice")
            grammar = call_grammar(tools, forced if isinstance(forced, str) else None, tokenizer,
                                   self.parallel_tool_calls)
        elif grammar is None and tool_grammar:  # "auto": text, or calls the client can read
            grammar = auto_grammar(tools, tokenizer, self.parallel_tool_calls)
        return request.replace(tools=tuple(tools), grammar=grammar)

    def top_alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("max_completion_tokens")
    @classmethod
    def _positive_completion(cls, value):
        return cls._positive(value)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def prompt_and_chat(self) -> tuple[list[dict], bool]:
        return [message.for_template() for message in self.messages], True


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]
    suffix: str | None = None  # fill-in-the-middle: the text after the completion (models with FIM tokens)
    logprobs: int | None = Field(default=None, ge=0, le=5)  # the legacy API's top alternatives per token

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("must not be empty")
            if isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise ValueError("one prompt per request (batched prompts are not supported; n gives several "
                                     "choices)")
                prompt = prompt[0]
        if prompt == "":
            raise ValueError("must not be empty")
        return prompt

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    def prompt_and_chat(self) -> tuple[str | list[int], bool]:
        return self.prompt, False

    def top_alternatives(self) -> int | None:
        return self.logprobs



def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens: the prompt tokens a prefix cache held (counted in prompt_tokens)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def openapi_body(kind: type) -> dict:
    """The OpenAPI requestBody of a completion endpoint, from its pydantic model."""
    schema = kind.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node):  # the document root has no $defs: put each referenced definition in place
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            if reference.startswith("#/$defs/"):
                return inline(definitions[reference.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}
