"""Prometheus metrics for `GET /metrics`, on a registry of the app's own (several apps can live in one process)."""

from __future__ import annotations

import json
import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specdec.core.rounds import GenerationResult
from specdec.server.protocol import error_body

logger = logging.getLogger("specdec.server")


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_length, active_count, kv_bytes_in_use=lambda: 0, kv_budget_bytes: int | None = None,
                 prefix_cache=None):
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_resident_memory_bytes, cpu seconds, open fds
        self.requests = Counter("specdec_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=registry)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens of finished generations",
                                     registry=registry)
        self.generated_tokens = Counter("specdec_generated_tokens", "Tokens generated", registry=registry)
        self.rounds = Counter("specdec_rounds", "Target forwards in the decode loop (draft-verify rounds)",
                              registry=registry)
        self.drafted = Counter("specdec_draft_tokens", "Draft tokens proposed", registry=registry)
        self.accepted = Counter("specdec_accepted_tokens", "Draft tokens accepted", registry=registry)
        self.decode_seconds = Counter("specdec_decode_seconds", "Seconds spent generating after prefill",
                                      registry=registry)
        self.acceptance_rate = Gauge("specdec_acceptance_rate", "Accepted / drafted tokens since start",
                                     registry=registry)
        self.acceptance_rate.set_function(lambda: _ratio(self.accepted, self.drafted))
        self.tau = Gauge("specdec_tau", "Tokens per target forward since start: 1 + accepted per round",
                         registry=registry)
        self.tau.set_function(lambda: 1 + _ratio(self.accepted, self.rounds) if _value(self.rounds) else 0.0)
        self.tokens_per_second = Gauge("specdec_tokens_per_second",
                                       "Generated tokens / decode seconds of finished generations",
                                       registry=registry)
        self.tokens_per_second.set_function(lambda: _ratio(self.generated_tokens, self.decode_seconds))
        self.time_to_first_token = Histogram("specdec_time_to_first_token_seconds",
                                             "From request arrival to the first generated text",
                                             buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
                                             registry=registry)
        sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256)
        self.batch_generations = Histogram("specdec_batch_generations",
                                           "Generations in one batched round (one pass over the weights)",
                                           buckets=sizes, registry=registry)
        self.batch_rows = Histogram("specdec_batch_rows", "Target rows (tokens verified) in one batched round",
                                    buckets=sizes, registry=registry)
        self.draft_tokens_per_request = Histogram(
            "specdec_request_draft_tokens", "Draft tokens one request verified in one round (its K there)",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64), registry=registry)
        Gauge("specdec_kv_cache_bytes", "Bytes of the running generations' target KV caches",
              registry=registry).set_function(kv_bytes_in_use)
        Gauge("specdec_kv_cache_budget_bytes", "The KV memory budget (--kv-memory; 0: none)",
              registry=registry).set(kv_budget_bytes or 0)
        if prefix_cache is not None:
            stats = prefix_cache.stats
            for name, what, read in [
                ("specdec_prefix_cache_lookups", "Prompts looked up in the prefix cache", lambda: stats.lookups),
                ("specdec_prefix_cache_hits", "Prompts that reused a cached prefix", lambda: stats.hits),
                ("specdec_prefix_cache_reused_tokens", "Prompt tokens copied from the prefix cache instead of "
                 "computed", lambda: stats.reused_tokens),
                ("specdec_prefix_cache_entries", "Prefixes held", lambda: stats.entries),
                ("specdec_prefix_cache_bytes", "Bytes of the prefixes' keys and values", lambda: stats.bytes),
            ]:
                Gauge(name, what, registry=registry).set_function(read)
        Gauge("specdec_queue_length", "Requests waiting for a generation slot",
              registry=registry).set_function(queue_length)
        Gauge("specdec_active_generations", "Generations in progress",
              registry=registry).set_function(active_count)

    def record_round(self, batch) -> None:
        """One step of the worker: a round of several requests, their target rows verified together
        (engine.BatchedRound)."""
        self.batch_generations.observe(len(batch.outcomes))
        self.batch_rows.observe(batch.rows)
        for drafted in batch.drafted:
            self.draft_tokens_per_request.observe(drafted)

    def record_generation(self, result: GenerationResult) -> None:
        s = result.stats
        self.prompt_tokens.inc(s.prompt_tokens)
        self.generated_tokens.inc(s.new_tokens)
        self.rounds.inc(s.rounds)
        self.drafted.inc(s.drafted)
        self.accepted.inc(s.accepted)
        self.decode_seconds.inc(max(s.seconds - s.prefill_seconds, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _value(counter: Counter) -> float:
    return counter._value.get()


def _ratio(numerator: Counter, denominator: Counter) -> float:
    below = _value(denominator)
    return _value(numerator) / below if below else 0.0


class ResponseCounter:
    """ASGI middleware, outermost but for CORS and the dialects' error shapes: counts every response by
    endpoint and status as it starts
    (refusals, errors, streams and whole replies alike), and answers an exception that escaped the app
    with a JSON 500, counted and logged once, instead of the framework's plain-text one."""

    def __init__(self, app, count, label):
        """count(endpoint, status): records one response; label(path): the endpoint label of a path."""
        self.app, self.count, self.label = app, count, label

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def counted(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.count(self.label(scope["path"]), str(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            logger.exception("internal error answering %s %s", scope.get("method"), scope.get("path"))
            if started:  # the status line is out: nothing else can be said
                return
            body = json.dumps(error_body("internal server error", "server_error")).encode()
            await counted({"type": "http.response.start", "status": 500, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
