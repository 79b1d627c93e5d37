"""The OpenAI-compatible HTTP API (FastAPI): chat and text completions, streaming, models, health, metrics."""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from starlette.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.core.rounds import GenerationResult
from specdec.errors import ContextLengthError, SpecdecError
from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.server.guard import GuardSettings, RequestGuard
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    now,
    parse_request,
    usage,
)
from specdec.api.prefix_cache import PrefixCache
from specdec.server.scheduler import PREFILL_TOKENS_PER_STEP, Job, QueueFullError, Scheduler


DISCONNECT_POLL_SECONDS = 0.25


KNOWN_ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")
RETRY_AFTER_SECONDS = "5"  # what a 503 (queue full, shutting down) suggests to a client


@dataclass
class ServerSettings:
    model_name: str  # the id clients send as `model`
    max_active: int = 16  # generations whose rounds run batched together
    max_queue: int = 64  # requests waiting beyond those; more get HTTP 503
    default_max_tokens: int = 512
    api_key: str | None = None  # required as 'Authorization: Bearer KEY' on /v1 routes when set
    max_request_bytes: int = 1 << 20  # larger bodies get 413 before they are read
    allowed_hosts: tuple[str, ...] | None = None  # Host names served (None: any); loopback binds set these
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed by CORS (none by default)
    max_prompt_tokens: int | None = None  # longer prompts get 400 (None: up to the model's context)
    kv_memory_bytes: int | None = None  # running generations' KV caches at most (more wait); None: no limit
    prefix_cache_bytes: int = 512 << 20  # prompts' keys and values kept for later prompts; 0: off
    prefill_tokens_per_step: int = PREFILL_TOKENS_PER_STEP  # prompt tokens prefilled per step while streams run


ERROR_SCHEMA = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}, "required": ["message", "type"]}}, "required": ["error"]}
ERROR_RESPONSES = {
    status: {"description": what, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for status, what in [(400, "invalid request (one line in error.message)"), (401, "missing or wrong API key"),
                         (413, "body too large"), (415, "body not sent as application/json"),
                         (503, "queue full or shutting down (Retry-After)")]
}


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


def endpoint_label(path: str) -> str:
    """A bounded label for metrics: unknown paths fold into one."""
    return path if path in KNOWN_ENDPOINTS else "other"


def create_app(generator: SpeculativeGenerator, settings: ServerSettings) -> FastAPI:
    # `metrics` is bound below, before the worker starts, so the callback finds it.
    prefix_cache = PrefixCache(generator.target.model, settings.prefix_cache_bytes)
    scheduler = Scheduler(generator, settings.max_active, settings.max_queue,
                          on_finished=lambda job, result: metrics.record_generation(result),
                          on_round=lambda batch: metrics.record_round(batch),
                          kv_budget_bytes=settings.kv_memory_bytes,
                          prefix_cache=prefix_cache if prefix_cache.enabled else None,
                          prefill_tokens_per_step=settings.prefill_tokens_per_step)
    metrics = ServerMetrics(lambda: scheduler.queue_length, lambda: scheduler.active_count,
                            lambda: scheduler.kv_bytes_in_use, settings.kv_memory_bytes,
                            prefix_cache if prefix_cache.enabled else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        scheduler.stop()  # after uvicorn's graceful wait: cancels whatever is still running

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.settings = scheduler, metrics, settings
    guard = GuardSettings(settings.api_key, settings.max_request_bytes, settings.allowed_hosts)
    app.add_middleware(RequestGuard, settings=guard,
                       on_refused=lambda path, status: metrics.requests.labels(endpoint_label(path), str(status)).inc())
    if settings.allowed_origins:  # outermost: a browser's preflight is answered before the guard
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    def error(status: int, message: str, kind: str, endpoint: str, param: str | None = None,
              code: str | None = None, headers: dict | None = None) -> JSONResponse:
        metrics.requests.labels(endpoint_label(endpoint), str(status)).inc()
        if status == 503:
            headers = {**(headers or {}), "Retry-After": RETRY_AFTER_SECONDS}
        return JSONResponse(error_body(message, kind, param, code), status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # exc.headers carries Allow on a 405
        return error(exc.status_code, str(exc.detail), "invalid_request_error", request.url.path,
                     headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return error(400, str(exc.errors()[0].get("msg")), "invalid_request_error", request.url.path)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": settings.model_name, "active": scheduler.active_count,
                "queued": scheduler.queue_length, "pid": os.getpid()}  # pid: which replica answered

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "specdec"}
        ]}

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {metrics.content_type: {}}, "description": "Prometheus text format"}})
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    # The bodies are parsed by parse_request (one-line 400s), so their schemas are declared for the OpenAPI
    # document here rather than taken from the signature.
    @app.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest), responses=ERROR_RESPONSES)
    async def chat_completions(request: Request):
        return await complete(request, "/v1/chat/completions", ChatCompletionRequest)

    @app.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest), responses=ERROR_RESPONSES)
    async def completions(request: Request):
        return await complete(request, "/v1/completions", CompletionRequest)

    async def complete(request: Request, endpoint: str, kind: type) -> Response:
        arrived = time.perf_counter()
        try:
            raw = await request.body()
            if len(raw) > settings.max_request_bytes:  # a body sent without Content-Length
                return error(413, f"the body is larger than {settings.max_request_bytes} bytes",
                             "invalid_request_error", endpoint)
            body = parse_request(raw, kind)
            job = Job(make_request(body))
            await run_in_threadpool(scheduler.encode, job)  # off the worker: tokenizing may take a while
            prompt_length = len(job.request.prompt)
            if settings.max_prompt_tokens is not None and prompt_length > settings.max_prompt_tokens:
                return error(400, f"the prompt is {prompt_length} tokens; this server takes at most "
                             f"{settings.max_prompt_tokens}", "invalid_request_error", endpoint,
                             code="context_length_exceeded")
            scheduler.submit(job)
        except BadRequest as exc:
            return error(400, str(exc), "invalid_request_error", endpoint, exc.param)
        except QueueFullError as exc:
            return error(503, str(exc), "server_busy", endpoint)
        except SpecdecError as exc:
            return error(400, str(exc), "invalid_request_error", endpoint)
        first_kind, first = await next_event(job, request)  # waits in the queue until admitted
        if first_kind == "error":
            code = "context_length_exceeded" if isinstance(first, ContextLengthError) else None
            return error(400, str(first), "invalid_request_error", endpoint, code=code)
        if first_kind == "cancelled" and await request.is_disconnected():  # gone while queued or prefilling
            return error(499, "the client closed the request", "invalid_request_error", endpoint)
        if first_kind != "started":
            return error(500 if first_kind == "failed" else 503, f"generation {first_kind}: {first}",
                         "server_error", endpoint)
        prompt_tokens = first
        reply = Reply(kind is ChatCompletionRequest, settings.model_name, body.include_usage)
        if body.stream:  # the status goes out now; a non-streamed reply's status is known at its end
            metrics.requests.labels(endpoint, "200").inc()
            return StreamingResponse(stream_events(job, reply, prompt_tokens, arrived),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        result = await finish(job, request)
        if result is None:
            if await request.is_disconnected():  # nobody reads this reply: count it as nginx does, not as a 503
                return error(499, "the client closed the request", "invalid_request_error", endpoint)
            return error(503, "generation cancelled: the server is shutting down", "server_error", endpoint)
        if isinstance(result, Exception):
            return error(500, f"generation failed: {result}", "server_error", endpoint)
        metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(reply.whole(result, prompt_tokens))

    def make_request(body) -> GenerationRequest:
        if body.model is not None and body.model != settings.model_name:
            raise BadRequest(f"model {body.model!r} is not served here (this server serves "
                             f"{settings.model_name!r})", "model")
        try:
            return body.generation_request(settings.default_max_tokens)
        except SpecdecError as exc:
            raise BadRequest(str(exc)) from None

    async def next_event(job: Job, request: Request) -> tuple[str, object]:
        """The job's next event; a client that disconnects meanwhile cancels the job (within a round). The
        connection is checked every DISCONNECT_POLL_SECONDS even while events flow (a non-streamed reply's
        rounds would otherwise hide a client that left)."""
        try:
            while True:
                event = None
                try:
                    event = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_SECONDS)
                except asyncio.TimeoutError:
                    pass
                if event is None or time.monotonic() - job.connection_checked > DISCONNECT_POLL_SECONDS:
                    job.connection_checked = time.monotonic()
                    if await request.is_disconnected():
                        job.cancel()
                        return "cancelled", "the client disconnected"
                if event is not None:
                    return event
        except BaseException:
            job.cancel()
            raise

    async def finish(job: Job, request: Request) -> GenerationResult | Exception | None:
        while True:
            kind, payload = await next_event(job, request)
            if kind in ("done", "failed"):
                return payload
            if kind == "cancelled":
                return None

    async def stream_events(job: Job, reply: "Reply", prompt_tokens: int, arrived: float) -> AsyncIterator[str]:
        first_text = True
        try:
            yield sse(reply.chunk(role=True))
            while True:
                kind, payload = await job.events.get()
                if kind == "chunk":
                    if payload.text:
                        if first_text:
                            metrics.time_to_first_token.observe(time.perf_counter() - arrived)
                            first_text = False
                        yield sse(reply.chunk(text=payload.text))
                elif kind == "done":
                    yield sse(reply.chunk(finish_reason=payload.finish_reason, result=payload))
                    if reply.include_usage:
                        yield sse(reply.usage_chunk(payload, prompt_tokens))
                    break
                else:  # failed or cancelled: tell the client in-band, the status line is already sent
                    yield sse(error_body(f"generation {kind}: {payload}", "server_error"))
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()  # no-op when finished; frees the slot when the client disconnected

    return app


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Reply:
    """Builds OpenAI response objects for one request (chat.completion or text_completion)."""

    def __init__(self, chat: bool, model: str, include_usage: bool):
        self.chat, self.model, self.include_usage = chat, model, include_usage
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, result: GenerationResult, prompt_tokens: int) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "finish_reason": result.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason, "logprobs": None}
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = usage(prompt_tokens, len(result.token_ids))
        body["specdec"] = speculative_stats(result)
        return body

    def chunk(self, text: str = "", role: bool = False, finish_reason: str | None = None,
              result: GenerationResult | None = None) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])
        if result is not None:
            body["specdec"] = speculative_stats(result)
        return body

    def usage_chunk(self, result: GenerationResult, prompt_tokens: int) -> dict:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(prompt_tokens, len(result.token_ids))
        return body


def speculative_stats(result: GenerationResult) -> dict:
    """The extension field with this request's speculation figures."""
    s = result.stats
    return {"drafter": s.drafter, "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4), "tau": round(s.tau, 4),
            "tokens_per_second": round(s.decode_tokens_per_second, 2)}
