"""What every route of one server shares: the generator, the settings, the scheduler and the metrics."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request

from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.api.structured import check_startable
from specdec.server.metrics import ServerMetrics
from specdec.api.reasoning import REASONING_FORMATS, Reasoning
from specdec.errors import InvalidParameterError
from specdec.server.response_store import ResponseStore
from specdec.server.scheduler import PREFILL_TOKENS_PER_STEP, Scheduler


class ModelRouter(Protocol):
    """Which loaded model's state a request's `model` names (server/served_models.py: ServedModels)."""

    loaded: dict[str, "ServerState"]  # the models in memory, least recently used first

    def names(self) -> list[str]: ...

    async def state_for(self, name: str | None) -> "ServerState": ...


@dataclass(frozen=True)
class ServerSettings:
    """What one server is allowed to do, checked at construction (InvalidParameterError naming the field and
    its `specdec serve` flag), whoever builds it: the CLI, Ray's replicas, a test, a Python user."""

    model_name: str  # the id clients send as `model`
    max_active: int = 16  # generations whose rounds run batched together
    max_queue: int = 64  # requests waiting beyond those; more get HTTP 503
    default_max_tokens: int = 512
    api_key: str | None = None  # required as 'Authorization: Bearer KEY' on /v1 routes when set
    max_request_bytes: int = 1 << 20  # larger bodies get 413 before they are read
    allowed_hosts: tuple[str, ...] | None = None  # Host names served (None: any); loopback binds set these
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed by CORS (none by default)
    max_prompt_tokens: int | None = None  # longer prompts get 400 (None: up to the model's context)
    max_tokens_cap: int | None = None  # max_tokens above it get 400, n_predict is cut to it (None: the context)
    kv_memory_bytes: int | None = None  # running generations' KV caches at most (more wait); None: no limit
    prefix_cache_bytes: int = 512 << 20  # prompts' keys and values kept for later prompts; 0: off
    prefill_tokens_per_step: int = PREFILL_TOKENS_PER_STEP  # prompt tokens prefilled per step
    tool_grammar: bool = True  # tool_choice "auto" constrained to text or well-formed calls (--no-tool-grammar: off)
    # a thinking model's <think> block as reasoning_content: "auto" (where its chat template writes one),
    # "deepseek" (always), "none" (left in content)
    reasoning_format: str = "auto"

    def __post_init__(self):
        checks = [
            (self.max_active >= 1, "max_active (--max-active) must be >= 1"),
            (self.max_queue >= 0, "max_queue (--max-queue) must be >= 0"),
            (self.default_max_tokens >= 1, "default_max_tokens (--default-max-tokens) must be >= 1"),
            (self.max_request_bytes >= 1, "max_request_bytes (--max-request-bytes) must be >= 1"),
            (self.max_prompt_tokens is None or self.max_prompt_tokens >= 1,
             "max_prompt_tokens (--max-prompt-tokens) must be >= 1"),
            (self.max_tokens_cap is None or self.max_tokens_cap >= 1, "max_tokens_cap (--max-tokens-cap) must be >= 1"),
            (self.kv_memory_bytes is None or self.kv_memory_bytes > 0, "kv_memory_bytes (--kv-memory) must be > 0"),
            (self.prefix_cache_bytes >= 0, "prefix_cache_bytes (--prefix-cache) must be >= 0"),
            (self.prefill_tokens_per_step >= 1, "prefill_tokens_per_step (--prefill-chunk) must be >= 1"),
            (self.reasoning_format in REASONING_FORMATS,
             f"reasoning_format (--reasoning-format) must be one of {', '.join(REASONING_FORMATS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidParameterError(message)


@dataclass
class ServerState:
    generator: SpeculativeGenerator
    settings: ServerSettings
    scheduler: Scheduler
    metrics: ServerMetrics
    reasoning: Reasoning | None = None  # how chat answers are split (reasoning_for)
    responses: ResponseStore = field(default_factory=ResponseStore)  # the Responses API's stored responses
    models: ModelRouter | None = None  # every model served by name, this one among them (served_models.py)
    # /tokenize's turns: tokenizing holds the interpreter's lock much of the time, so one at a time
    tokenizing: asyncio.Semaphore = field(default_factory=asyncio.Semaphore)

    async def for_model(self, name: str | None) -> "ServerState":
        """The state of the model a request names (None: this server's default), loaded on first use."""
        return await self.models.state_for(name)

    @property
    def max_tokens_cap(self) -> int:
        """The most tokens one request may generate: --max-tokens-cap, by default the model's context."""
        return self.settings.max_tokens_cap or self.generator.target.model.max_context

    @property
    def default_max_tokens(self) -> int:
        """What a request that sets no limit generates at most."""
        return min(self.settings.default_max_tokens, self.max_tokens_cap)

    def check_grammar(self, request: GenerationRequest) -> None:
        """InvalidParameterError for a request whose grammar cannot begin an output (or that the engine gives
        up on within its first tokens): found now, before a stream's status line, it is a 400, not an in-band
        error. (Blocking: the routes call it off the event loop.)"""
        if request.grammar is not None:
            target = self.generator.target
            check_startable(request.grammar, target.tokenizer, target.model.vocab_size)

    def token_text(self, token: int) -> str:
        """How a token is spelled in `logprobs`."""
        return self.generator.target.tokenizer.decode([token], skip_special_tokens=False)


def server_state(request: Request) -> ServerState:
    """The state of the server a request came to (the routes' one dependency)."""
    return request.app.state.server
