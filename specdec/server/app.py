"""The HTTP API (FastAPI): OpenAI's chat and text completions and Responses, Anthropic's Messages, llama-server's
and Ollama's routes, streaming, fill-in-the-middle, models, health, metrics. The routes live in routes_*.py over one ServerState (state.py); requests become scheduler
jobs in jobs.py; errors take OpenAI's shape in http_errors.py."""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.api.generator import SpeculativeGenerator
from specdec.api.options import GeneratorOptions
from specdec.api.prefix_cache import PrefixCache
from specdec.server import (routes_anthropic, routes_completions, routes_infill, routes_info,
                            routes_llama_server, routes_page, routes_responses)
from specdec.server.ollama import routes as routes_ollama
from specdec.server.dialect_errors import DialectErrors
from specdec.server.guard import GuardSettings, RequestGuard
from specdec.server.http_errors import error
from specdec.server.metrics import ResponseCounter, ServerMetrics
from specdec.api.reasoning import reasoning_for
from specdec.server.scheduler import Scheduler
from specdec.server.served_models import ModelCatalog, ServedModels
from specdec.server.state import ServerSettings, ServerState

__all__ = ["ServerSettings", "create_app", "endpoint_label"]

KNOWN_ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/infill",
                   "/completion", "/tokenize", "/detokenize", "/apply-template", "/props", "/v1/messages",
                   "/v1/messages/count_tokens", "/v1/responses", "/", "/api/chat", "/api/generate", "/api/tags",
                   "/api/show", "/api/ps", "/api/version", "/api/pull")


def endpoint_label(path: str) -> str:
    """A bounded label for metrics: unknown paths fold into one."""
    return path if path in KNOWN_ENDPOINTS else "other"


def create_app(generator: SpeculativeGenerator, settings: ServerSettings, catalog: ModelCatalog | None = None) -> FastAPI:
    """The app serving `generator` under settings.model_name, and by name the catalog's other models (loaded
    on first use)."""
    state = server_state_for(generator, settings)
    state.models = ServedModels(state, catalog, partial(load_served_model, settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.scheduler.start()
        sweeper = asyncio.create_task(state.models.sweep_forever())  # models whose keep_alive has passed
        yield
        sweeper.cancel()
        state.models.stop_all()  # after uvicorn's graceful wait: cancels whatever is still running

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.state.server = state
    app.state.scheduler, app.state.metrics, app.state.settings = state.scheduler, state.metrics, settings
    add_middleware(app, state)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail), "invalid_request_error",
                     headers=getattr(exc, "headers", None))  # exc.headers carries Allow on a 405

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return error(400, str(exc.errors()[0].get("msg")), "invalid_request_error")

    for routes in (routes_info, routes_completions, routes_infill, routes_llama_server, routes_anthropic,
                   routes_responses, routes_ollama, routes_page):
        app.include_router(routes.router)
    app.mount("/page", routes_page.page_files(), name="page")
    return app


def server_state_for(generator: SpeculativeGenerator, settings: ServerSettings) -> ServerState:
    """The scheduler (its worker not started yet) and the metrics that watch it."""
    prefix_cache = PrefixCache(generator.target.model, settings.prefix_cache_bytes)
    kept = prefix_cache if prefix_cache.enabled else None
    # `metrics` is bound below, before the worker starts, so the callbacks find it.
    scheduler = Scheduler(generator, settings.max_active, settings.max_queue,
                          on_finished=lambda job, result: metrics.record_generation(result),
                          on_round=lambda batch: metrics.record_round(batch),
                          kv_budget_bytes=settings.kv_memory_bytes, prefix_cache=kept,
                          prefill_tokens_per_step=settings.prefill_tokens_per_step)
    metrics = ServerMetrics(lambda: scheduler.queue_length, lambda: scheduler.active_count,
                            lambda: scheduler.kv_bytes_in_use, settings.kv_memory_bytes, kept)
    reasoning = reasoning_for(generator.target.tokenizer, settings.reasoning_format)
    return ServerState(generator, settings, scheduler, metrics, reasoning)


def load_served_model(settings: ServerSettings, name: str, options: GeneratorOptions) -> ServerState:
    """Another model of the catalog, loaded with its paired drafter, its scheduler started; it shares the
    default model's Responses store and list of models (set by the caller)."""
    generator = SpeculativeGenerator.from_options(options)
    state = server_state_for(generator, dataclasses.replace(settings, model_name=name))
    state.scheduler.start()
    return state


def add_middleware(app: FastAPI, state: ServerState) -> None:
    """The request guard (API key, body size, Host), the response counter, and CORS when origins are allowed."""
    settings, metrics = state.settings, state.metrics
    app.add_middleware(RequestGuard, settings=GuardSettings(settings.api_key, settings.max_request_bytes,
                                                            settings.allowed_hosts))
    app.add_middleware(ResponseCounter, count=lambda endpoint, status: metrics.requests.labels(endpoint, status).inc(),
                       label=endpoint_label)
    # outside the guard and the counter: their refusals and the counter's 500 too take each dialect's shape
    app.add_middleware(DialectErrors)
    if settings.allowed_origins:  # outermost: a browser's preflight is answered before the guard
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version", "anthropic-beta"])
