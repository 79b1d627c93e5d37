"""Ollama's request bodies, read into the one chat request the server runs (ChatCompletionRequest), as the
Anthropic dialect does: sampling, tools and their grammars, stop strings and the bounds are exactly chat's,
and an error names the Ollama field the client sent.

`options` (Ollama's Modelfile parameters): num_predict, temperature, top_k, top_p, min_p, seed, stop,
repeat_penalty and repeat_last_n are honoured, with Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9,
repeat_last_n 64); num_ctx is checked and has no other effect (the whole prompt is always read, never cut to
fit); presence_penalty and frequency_penalty are refused unless 0, as on every route; the runner's settings
(num_thread, num_gpu, use_mmap, ...) and names Ollama does not define are ignored, as Ollama ignores them.
num_predict unset or <= 0 generates until the answer ends, at most the server's cap (--max-tokens-cap, by
default the model's context), as Ollama bounds its open-ended answers.
"""

from __future__ import annotations

import json
import math
import re
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specdec.server.protocol import ChatCompletionRequest
from specdec.server.request_body import BadRequest

ROLES = ("system", "user", "assistant", "tool")
THINK_LEVELS = ("low", "medium", "high", "max")
# chat fields whose errors name the Ollama field the client sent
OLLAMA_NAMES = {"max_tokens": "options.num_predict", "temperature": "options.temperature",
                "top_p": "options.top_p", "top_k": "options.top_k", "min_p": "options.min_p", "seed": "options.seed",
                "stop": "options.stop", "repetition_penalty": "options.repeat_penalty",
                "repeat_last_n": "options.repeat_last_n", "response_format": "format"}
# Go's time.ParseDuration, which Ollama reads keep_alive strings with: "5m", "1h30m", "90s", "-1m", "0"
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's keep_alive in seconds: a number of seconds or a Go duration; negative: forever (inf); None:
    not given. ValueError for text Go would not read."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if body == "0":
            return 0.0
        parts = _DURATION_PART.findall(body)
        if not parts or "".join(number + unit for number, unit in parts) != body:
            raise ValueError(f"{value!r} is not a duration (a number of seconds, or e.g. \"5m\", \"1h30m\")")
        value = sign * sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    return math.inf if value < 0 else float(value)


class OllamaOptions(BaseModel):
    """`options`, read as leniently as Ollama reads them (1.0 is an integer, 1 a float)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    num_predict: int | None = None
    num_ctx: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.8, ge=0.0)
    top_k: int = Field(default=40, ge=0)
    top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    stop: list[str] | str | None = None
    repeat_penalty: float = Field(default=1.0, gt=0.0)
    repeat_last_n: int = Field(default=64, ge=-1)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @model_validator(mode="after")
    def _penalties_we_do_not_apply(self):
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise ValueError(f"{name}={getattr(self, name)} is not supported by this server (only 0)")
        return self

    def chat_fields(self, max_tokens_cap: int) -> dict:
        """The chat request's sampling fields; num_predict unset or <= 0: up to the cap, as Ollama's open end."""
        limit = self.num_predict if self.num_predict is not None and self.num_predict > 0 else max_tokens_cap
        return {"max_tokens": min(limit, max_tokens_cap), "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "min_p": self.min_p, "repetition_penalty": self.repeat_penalty,
                "repeat_last_n": self.repeat_last_n, "stop": self.stop,
                "seed": None if self.seed is None or self.seed == -1 else self.seed}  # -1: Ollama's "random"


class CalledFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: str
    arguments: dict = Field(default_factory=dict)


class CalledTool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    id: str | None = None
    function: CalledFunction


class OllamaMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: str
    content: str = ""
    thinking: str | None = None  # an earlier answer's reasoning: chat templates leave it out of history
    images: list | None = None
    tool_calls: list[CalledTool] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        role = role.lower()  # as Ollama reads it
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        return role

    def chat_message(self) -> dict:
        """The message as the chat request reads it (tool calls' arguments as JSON text, each call an id)."""
        message: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": call.id or f"call_{index}", "type": "function", "function": {
                "name": call.function.name, "arguments": json.dumps(call.function.arguments)}}
                for index, call in enumerate(self.tool_calls)]
        if self.role == "tool":
            message |= {key: value for key, value in (("tool_call_id", self.tool_call_id), ("name", self.tool_name))
                        if value is not None}
        return message


class GenerationBody(BaseModel):
    """What /api/chat and /api/generate share."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
    model: str = Field(min_length=1)
    format: str | dict | None = None
    options: OllamaOptions = Field(default_factory=OllamaOptions)
    stream: bool = True
    think: bool | str | None = None
    keep_alive: float | str | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    speculative: dict | None = None  # the server's extension, read as chat reads it
    # extension: OpenAI's tool_choice ("auto", "required", "none" or a named function), which Ollama lacks
    tool_choice: str | dict | None = None

    @field_validator("options", mode="before")
    @classmethod
    def _lenient(cls, options):
        return OllamaOptions() if options is None else options

    @field_validator("format")
    @classmethod
    def _json_or_schema(cls, value):
        if isinstance(value, str) and value not in ("", "json"):
            raise ValueError('must be "json" or a JSON schema object')
        return value or None

    @field_validator("think")
    @classmethod
    def _think_value(cls, value):
        if isinstance(value, str) and value not in THINK_LEVELS:
            raise ValueError(f"must be true, false or one of {', '.join(THINK_LEVELS)}")
        return value

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value):
        keep_alive_seconds(value)  # checked now; read again where it is used
        return value

    @property
    def keep_alive_seconds(self) -> float | None:
        return keep_alive_seconds(self.keep_alive)

    @property
    def thinks(self) -> bool:
        return self.think not in (None, False)

    def response_format(self) -> dict | None:
        if self.format is None:
            return None
        if self.format == "json":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": self.format}}

    def chat_request(self, messages: list[dict], max_tokens_cap: int, tools: list | None = None
                     ) -> ChatCompletionRequest:
        """The chat request this body means (BadRequest naming the Ollama field at fault)."""
        fields = {"model": self.model, "messages": messages, **self.options.chat_fields(max_tokens_cap),
                  "response_format": self.response_format(), "logprobs": self.logprobs or
                  self.top_logprobs is not None, "top_logprobs": self.top_logprobs}
        if tools:
            fields["tools"] = tools
        for extension in ("speculative", "tool_choice"):
            if getattr(self, extension) is not None:
                fields[extension] = getattr(self, extension)
        try:
            return ChatCompletionRequest.model_validate(fields)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else None
            name = OLLAMA_NAMES.get(field, field)
            message = error["msg"].removeprefix("Value error, ")
            raise BadRequest(f"{name}: {message}" if name else message, name) from None


def in_ollamas_names(error: BadRequest) -> BadRequest:
    """A refusal of the chat request (its grammar, its tools, its bounds) naming the Ollama field the client
    sent instead of chat's."""
    name = OLLAMA_NAMES.get(error.param or "")
    return error if name is None else BadRequest(f"{name}: {error}", name)


class ChatBody(GenerationBody):
    """`POST /api/chat`; no messages: load the model (Ollama's preload)."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict] | None = None

    @model_validator(mode="after")
    def _text_only(self):
        for index, message in enumerate(self.messages):
            if message.images:
                raise ValueError(f"messages[{index}].images: this server's models read text, not images")
        return self


class GenerateBody(GenerationBody):
    """`POST /api/generate`; no prompt: load the model. `template` (a Go template) is refused unless empty:
    the model's own chat template renders the prompt; `raw` sends the prompt as it is."""

    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    context: list[int] | None = None
    images: list | None = None

    @model_validator(mode="after")
    def _supported(self):
        if self.images:
            raise ValueError("images: this server's models read text, not images")
        if self.template:
            raise ValueError("template: a Go template is not supported; the model's own chat template renders "
                             "the prompt (or send raw: true with the prompt written out)")
        if self.raw and (self.system or self.context):
            raise ValueError("raw mode does not take system or context")  # Ollama's own rule
        return self


class ModelBody(BaseModel):
    """`POST /api/show`, `/api/pull`, `/api/delete`, ...: a model's name (`name` is its older spelling)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    name: str | None = None
    verbose: bool = False
    stream: bool = True

    @model_validator(mode="after")
    def _named(self):
        if not (self.model or self.name):
            raise ValueError("model: is required")
        return self

    @property
    def model_name(self) -> str:
        return self.model or self.name

