"""OpenAI request bodies: parsing, validation and the response/chunk shapes.

Policy for fields (docs/server.md):
- fields we implement are validated strictly: a wrong type or an out-of-range value is a 400;
- OpenAI fields we do not implement are accepted at their neutral value (e.g. `presence_penalty: 0`,
  `logprobs: false`, `n: 1`) and rejected with a 400 otherwise, so a client never silently gets
  something other than what it asked for;
- fields OpenAI does not define are ignored (clients add their own, e.g. `user`), as vLLM does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specdec.api.request import GenerationRequest
from specdec.core.sampling import SamplingParams, check_seed
from specdec.core.speculation_length import check_k, is_auto
from specdec.errors import InvalidParameterError

# OpenAI fields we accept only at their neutral value: field -> values that mean "off".
NEUTRAL_ONLY: dict[str, tuple] = {
    "n": (1, None),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
    "logprobs": (False, None),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
    "best_of": (None, 1),
    "echo": (False, None),
    "suffix": (None, ""),
}


MAX_STOP_CHARS = 256  # each stop string is searched for after every round: keep that cheap


class BadRequest(InvalidParameterError):
    """A request the server refuses with HTTP 400; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class SpeculativeOptions(BaseModel):
    """The `speculative` extension: turn the drafter off, or fix K, for one request."""

    model_config = ConfigDict(strict=True, extra="forbid")
    enabled: bool = True
    k: int | str | None = Field(default=None)  # N, "auto" or "auto:N" (K chosen up to N), as --k

    @field_validator("k")
    @classmethod
    def _k_grammar(cls, k):
        if isinstance(k, str) and not is_auto(k):  # a number comes as a JSON number
            raise ValueError(f"k must be an integer, 'auto' or 'auto:N', not {k!r}")
        if k is not None:
            try:
                check_k(k)
            except InvalidParameterError as error:
                raise ValueError(str(error)) from None
        return k


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict]

    @field_validator("content")
    @classmethod
    def _text_only(cls, content):
        if isinstance(content, list):  # OpenAI's content parts: only text parts are supported
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError("only text content parts are supported")
            return "".join(p["text"] for p in content)
        return content


class _Common(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # extension, as in vLLM
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)  # extension
    repetition_penalty: float = Field(default=1.0, gt=0.0)  # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    speculative: SpeculativeOptions | None = None

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
        for name, value in (self.model_extra or {}).items():
            if name in NEUTRAL_ONLY and value not in NEUTRAL_ONLY[name]:
                raise BadRequest(f"{name}={json.dumps(value)} is not supported by this server", name)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def generation_request(self, default_max_tokens: int) -> GenerationRequest:
        """The API's request for this body (InvalidParameterError where its settings do not go together)."""
        prompt, chat = self.prompt_and_chat()
        sampling = SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                  min_p=self.min_p, repetition_penalty=self.repetition_penalty)
        spec = self.speculative
        return GenerationRequest(prompt, self.token_limit or default_max_tokens,
                                 sampling, tuple(self.stop or ()), self.seed, chat,
                                 k=spec.k if spec else None, speculative=spec.enabled if spec else True)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    @field_validator("max_completion_tokens")
    @classmethod
    def _positive_completion(cls, value):
        return cls._positive(value)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def prompt_and_chat(self) -> tuple[list[dict], bool]:
        return [{"role": m.role, "content": m.content} for m in self.messages], True


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("must not be empty")
            if isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise ValueError("one prompt per request (n and batched prompts are not supported)")
                prompt = prompt[0]
        if prompt == "":
            raise ValueError("must not be empty")
        return prompt

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    def prompt_and_chat(self) -> tuple[str | list[int], bool]:
        return self.prompt, False


def parse_request(body: bytes, kind: type[_Common]) -> _Common:
    """Bytes -> a validated request, or BadRequest with one readable line."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body's JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = "is required"
        raise BadRequest(f"{param}: {message}" if param else message, param) from None


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
