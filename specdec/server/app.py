"""The OpenAI-compatible HTTP API (FastAPI): chat and text completions, streaming, models, health, metrics."""

from __future__ import annotations

import asyncio
import os
import random
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
from starlette.requests import ClientDisconnect

from specdec.api.events import FINAL_EVENTS, Cancelled, Chunk, Done, Event, Failed, Refused, Started
from specdec.core.rounds import GenerationResult
from specdec.errors import ContextLengthError, SpecdecError
from specdec.api.generator import SpeculativeGenerator
from specdec.api.request import GenerationRequest
from specdec.server.guard import GuardSettings, RequestGuard
from specdec.server.metrics import ResponseCounter, ServerMetrics
from specdec.server.infill import InfillRequest, require_fim
from specdec.server.protocol import BadRequest, ChatCompletionRequest, CompletionRequest, error_body, parse_request
from specdec.server.replies import Reply, speculative_stats, sse
from specdec.server.tools import speaks_hermes
from specdec.api.prefix_cache import PrefixCache
from specdec.server.scheduler import PREFILL_TOKENS_PER_STEP, Job, QueueFullError, Scheduler


DISCONNECT_POLL_SECONDS = 0.25
BODY_SECONDS = 30.0  # a body not received whole by then gets 408 (a client trickling it holds a connection)


KNOWN_ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/infill")
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
    prefill_tokens_per_step: int = PREFILL_TOKENS_PER_STEP  # prompt tokens prefilled per step
    tool_grammar: bool = True  # tool_choice "auto" constrained to text or well-formed calls (--no-tool-grammar: off)


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
    app.add_middleware(RequestGuard, settings=guard)
    app.add_middleware(ResponseCounter, count=lambda endpoint, status: metrics.requests.labels(endpoint, status).inc(),
                       label=endpoint_label)
    if settings.allowed_origins:  # outermost: a browser's preflight is answered before the guard
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    def error(status: int, message: str, kind: str, endpoint: str, param: str | None = None,
              code: str | None = None, headers: dict | None = None) -> JSONResponse:
        """An OpenAI-style error reply (ResponseCounter counts it under `endpoint`'s label)."""
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

    def refused(exc: SpecdecError, endpoint: str) -> JSONResponse:
        """A request refused before it ran: 413 for a body too large, 408 for one too slow, 499 for a client
        gone before its body arrived, else 400 naming the field at fault."""
        if isinstance(exc, BodyTooLarge):
            return error(413, str(exc), "invalid_request_error", endpoint)
        if isinstance(exc, BodyNotReceived):
            return error(exc.status, str(exc), "invalid_request_error", endpoint)
        return error(400, str(exc), "invalid_request_error", endpoint, getattr(exc, "param", None))

    async def complete(request: Request, endpoint: str, kind: type) -> Response:
        try:
            raw = await read_body(request, endpoint)
            body = parse_request(raw, kind)
            generation_request = make_request(body)
        except SpecdecError as exc:
            return refused(exc, endpoint)
        tools = isinstance(body, ChatCompletionRequest) and body.uses_tools
        reply = Reply(kind is ChatCompletionRequest, settings.model_name, body.include_usage, token_text,
                      tools=tools, choices=body.n)
        return await run_jobs(request, endpoint, generation_request, body.n, body.stream, reply)

    async def run_jobs(request: Request, endpoint: str, generation_request: GenerationRequest, n: int, stream: bool,
                       reply, infill: bool = False) -> Response:
        """Submit the request's `n` choices (seeds seed, seed + 1, ...), wait until they start, then answer
        whole or as a stream."""
        arrived = time.perf_counter()
        jobs: list[Job] = []
        try:
            first = Job(generation_request)
            await run_in_threadpool(scheduler.encode, first)  # off the worker: tokenizing may take a while
            prompt_length = len(first.request.prompt)
            if settings.max_prompt_tokens is not None and prompt_length > settings.max_prompt_tokens:
                return error(400, f"the prompt is {prompt_length} tokens; this server takes at most "
                             f"{settings.max_prompt_tokens}", "invalid_request_error", endpoint,
                             code="context_length_exceeded")
            base = first.request.seed if first.request.seed is not None else random.getrandbits(63)
            jobs = [Job(first.request.replace(seed=base + i if n > 1 or first.request.seed is not None else None))
                    for i in range(n)]
            for job in jobs:
                scheduler.submit(job)
        except BadRequest as exc:
            return error(400, str(exc), "invalid_request_error", endpoint, exc.param)
        except QueueFullError as exc:
            for job in jobs:
                job.cancel()
            return error(503, str(exc), "server_busy", endpoint)
        except SpecdecError as exc:
            return error(400, str(exc), "invalid_request_error", endpoint)
        prompt_tokens = 0
        for job in jobs:  # each waits in the queue until admitted
            first = await next_event(job, request)
            if not isinstance(first, Started):
                for other in jobs:
                    other.cancel()
            if isinstance(first, Refused):
                code = "context_length_exceeded" if isinstance(first.error, ContextLengthError) else None
                return error(400, str(first.error), "invalid_request_error", endpoint, code=code)
            if isinstance(first, Cancelled) and await request.is_disconnected():  # gone while queued or prefilling
                return error(499, "the client closed the request", "invalid_request_error", endpoint)
            if not isinstance(first, Started):
                return error(500 if isinstance(first, Failed) else 503, ended_text(first), "server_error", endpoint)
            prompt_tokens = first.prompt_tokens
        if stream:  # the status goes out now; a non-streamed reply's status is known at its end
            events = infill_events(jobs[0], reply, arrived) if infill else stream_events(jobs, reply, prompt_tokens,
                                                                                        arrived)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        results = []
        for job in jobs:
            result = await finish(job, request)
            if result is None or isinstance(result, Exception):
                for other in jobs:
                    other.cancel()
            if result is None:
                if await request.is_disconnected():  # nobody reads this reply: count it as nginx does, not a 503
                    return error(499, "the client closed the request", "invalid_request_error", endpoint)
                return error(503, "generation cancelled: the server is shutting down", "server_error", endpoint)
            if isinstance(result, Exception):
                return error(500, f"generation failed: {result}", "server_error", endpoint)
            results.append(result)
        return JSONResponse(reply.whole(results, prompt_tokens))

    async def read_body(request: Request, endpoint: str) -> bytes:
        try:
            raw = await asyncio.wait_for(request.body(), BODY_SECONDS)
        except asyncio.TimeoutError:
            raise BodyNotReceived(408, f"the body did not arrive within {BODY_SECONDS:.0f} s") from None
        except ClientDisconnect:  # closed mid-body, or a Content-Length longer than what it sent
            raise BodyNotReceived(499, "the client closed the connection before its body arrived") from None
        if len(raw) > settings.max_request_bytes:  # a body sent without Content-Length
            raise BodyTooLarge(f"the body is larger than {settings.max_request_bytes} bytes")
        return raw

    def token_text(token: int) -> str:
        return generator.target.tokenizer.decode([token], skip_special_tokens=False)

    def make_request(body) -> GenerationRequest:
        if body.model is not None and body.model != settings.model_name:
            raise BadRequest(f"model {body.model!r} is not served here (this server serves "
                             f"{settings.model_name!r})", "model")
        tokenizer = generator.target.tokenizer
        if isinstance(body, ChatCompletionRequest) and body.uses_tools and not speaks_hermes(tokenizer):
            raise BadRequest(f"model {settings.model_name!r}: its chat template does not list tools "
                             "(Hermes-style <tool_call> templates are supported)", "tools")
        try:
            request = body.generation_request(settings.default_max_tokens, tokenizer, settings.tool_grammar)
        except SpecdecError as exc:
            raise BadRequest(str(exc), getattr(exc, "param", None)) from None
        if isinstance(body, CompletionRequest) and body.suffix is not None:
            if not isinstance(body.prompt, str):
                raise BadRequest("suffix needs a text prompt", "suffix")
            fim = require_fim(tokenizer, settings.model_name, "suffix")
            request = request.replace(prompt=fim.prompt(body.prompt, body.suffix), chat=False)
        return request

    @app.post("/infill", responses=ERROR_RESPONSES)
    async def infill(request: Request):
        """llama.cpp's fill-in-the-middle endpoint, as editor plugins (llama.vim, llama.vscode) call it."""
        endpoint = "/infill"
        try:
            body = parse_request(await read_body(request, endpoint), InfillRequest)
            fim = require_fim(generator.target.tokenizer, settings.model_name, "input_prefix")
            prompt = fim.prompt(body.input_prefix, body.input_suffix,
                                [(chunk.filename, chunk.text) for chunk in body.input_extra], lead=body.prompt)
            limit = body.n_predict if body.n_predict > 0 else settings.default_max_tokens
            generation_request = GenerationRequest(prompt, limit, body.sampling(), body.checked_stop(),
                                                   None if body.seed in (None, -1) else body.seed, chat=False)
        except SpecdecError as exc:
            return refused(exc, endpoint)
        return await run_jobs(request, endpoint, generation_request, 1, body.stream,
                              InfillReply(settings.model_name), infill=True)

    async def next_event(job: Job, request: Request) -> Event:
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
                        job.cancel("the client disconnected")
                        return Cancelled("the client disconnected")
                if event is not None:
                    return event
        except BaseException:
            job.cancel()
            raise

    async def finish(job: Job, request: Request) -> GenerationResult | Exception | None:
        while True:
            event = await next_event(job, request)
            if isinstance(event, Done):
                return event.result
            if isinstance(event, Failed):
                return event.error
            if isinstance(event, Cancelled):
                return None

    async def stream_events(jobs: list[Job], reply, prompt_tokens: int, arrived: float) -> AsyncIterator[str]:
        """The choices' chunks as their rounds commit text, interleaved (each chunk names its choice)."""
        first_text = True
        results: list[GenerationResult | None] = [None] * len(jobs)
        try:
            for index in range(len(jobs)):
                yield sse(reply.opening(index))
            async for index, event in merged_events(jobs):
                if isinstance(event, Chunk):
                    chunks = reply.delta(index, event.chunk.text, event.chunk.logprobs)
                    if chunks and first_text:
                        metrics.time_to_first_token.observe(time.perf_counter() - arrived)
                        first_text = False
                    for chunk in chunks:
                        yield sse(chunk)
                elif isinstance(event, Done):
                    results[index] = event.result
                    for chunk in reply.closing(index, event.result):
                        yield sse(chunk)
                else:  # failed or cancelled: tell the client in-band, the status line is already sent
                    yield sse(error_body(ended_text(event), "server_error"))
                    break
            if reply.include_usage and all(result is not None for result in results):
                yield sse(reply.usage_chunk(results, prompt_tokens))
            yield "data: [DONE]\n\n"
        finally:
            for job in jobs:
                job.cancel()  # no-op when finished; frees the slots when the client disconnected

    async def infill_events(job: Job, reply: "InfillReply", arrived: float) -> AsyncIterator[str]:
        """llama-server's stream: `data: {"content": ..., "stop": false}` per round, a last one with stop true."""
        try:
            while True:
                event = await job.events.get()
                if isinstance(event, Chunk) and event.chunk.text:
                    yield sse(reply.chunk(event.chunk.text))
                elif isinstance(event, Done):
                    yield sse(reply.last(event.result))
                    break
                elif not isinstance(event, Chunk):
                    yield sse(error_body(ended_text(event), "server_error"))
                    break
        finally:
            job.cancel()

    return app


async def merged_events(jobs: list[Job]):
    """(choice index, event) of several jobs' events as they come; a job's stream ends with its Done (or
    another final event)."""
    pending = {asyncio.ensure_future(job.events.get()): index for index, job in enumerate(jobs)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda task: pending[task]):
                index = pending.pop(task)
                event = task.result()
                yield index, event
                if not isinstance(event, FINAL_EVENTS):
                    pending[asyncio.ensure_future(jobs[index].events.get())] = index
    finally:
        for task in pending:
            task.cancel()


def ended_text(event: Event) -> str:
    """A request's end other than Done, as its error message says it."""
    if isinstance(event, Cancelled):
        return f"generation cancelled: {event.reason}"
    kind = "failed" if isinstance(event, Failed) else "error"
    return f"generation {kind}: {event.error}"


class BodyTooLarge(BadRequest):
    """A body over --max-request-bytes that came without a Content-Length (HTTP 413)."""


class BodyNotReceived(BadRequest):
    """A body that did not arrive whole: too slow (HTTP 408) or the client left (499)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class InfillReply:
    """llama-server's `/infill` response shape: content, stop, token counts, timings."""

    def __init__(self, model: str):
        self.model = model

    def chunk(self, text: str) -> dict:
        return {"content": text, "stop": False}

    def last(self, result: GenerationResult) -> dict:
        return {"content": "", "stop": True, **self._summary(result)}

    def whole(self, results: list[GenerationResult], prompt_tokens: int) -> dict:
        result = results[0]
        return {"content": result.text, "stop": True, "tokens_evaluated": prompt_tokens, **self._summary(result)}

    def _summary(self, result: GenerationResult) -> dict:
        s = result.stats
        return {"model": self.model, "tokens_predicted": len(result.token_ids),
                "stop_type": "limit" if result.finish_reason == "length" else "eos",
                "timings": {"predicted_n": s.new_tokens, "predicted_per_second": s.decode_tokens_per_second},
                "specdec": speculative_stats(result)}
