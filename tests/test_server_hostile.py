"""What agents, editors and the internet send to `specdec serve` (issue 52): keys on every route, JSON-only
POSTs, clients that leave mid-body or trickle their headers, a bug's exception answered and counted, and a long
prompt that must not hold a short request behind it."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec.api.request import GenerationRequest
from specdec.core.sampling import SamplingParams
from specdec.server.run import TimedHeadProtocol
from specdec.server.scheduler import Job, Scheduler
from test_server import RunningServer, raw_request, server  # noqa: F401 (the fixture)

KEY = {"Authorization": "Bearer s3cret"}
JSON = {"Content-Type": "application/json"}


def statuses(running: RunningServer, endpoint: str) -> dict[str, float]:
    _, text = running.request("GET", "/metrics")
    return {s.labels["status"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.labels.get("endpoint") == endpoint and s.name.endswith("_total")}


class Recorder(logging.Handler):
    """Log records of the server's loggers (uvicorn's do not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def server_log():
    recorder = Recorder()
    names = ("uvicorn.error", "uvicorn", "specdec.server")
    for name in names:
        logging.getLogger(name).addHandler(recorder)
    yield recorder
    for name in names:
        logging.getLogger(name).removeHandler(recorder)


def route_paths(routes) -> list[str]:
    """Every path an app serves, the routers it includes walked into."""
    paths = []
    for route in routes:
        included = getattr(route, "original_router", None)
        paths += route_paths(included.routes) if included is not None else [route.path]
    return paths


def test_every_route_but_health_and_metrics_needs_the_key_and_every_post_is_json(tiny_generator):
    running = RunningServer(tiny_generator, api_key="s3cret")
    try:
        routes = set(route_paths(running.app.routes))
        assert {"/infill", "/openapi.json", "/docs", "/redoc", "/v1/models", "/v1/responses", "/v1/messages"} <= routes
        for path in sorted(routes - {"/health", "/metrics", "/", "/page"}):
            for method in ("GET", "POST"):
                status, _, text = raw_request(running.port, method, path, "{}", JSON)
                error = json.loads(text)["error"]
                if path.startswith("/api/"):  # Ollama's shape: the message alone
                    assert status == 401 and "API key" in error, (method, path)
                    continue
                kind = error["type"] if path.startswith("/v1/messages") else error["code"]  # each dialect's shape
                assert status == 401 and kind in ("invalid_api_key", "authentication_error"), (method, path)
        for path in ("/health", "/metrics", "/", "/page/app.js", "/page/vendor/marked.umd.js"):  # the page's files
            assert raw_request(running.port, "GET", path)[0] == 200, path
        assert raw_request(running.port, "GET", "/openapi.json", headers=KEY)[0] == 200
        body = json.dumps({"input_prefix": "def f(", "input_suffix": ")", "n_predict": 2})
        for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}):
            assert raw_request(running.port, "POST", "/infill", body, {**KEY, **headers})[0] == 415, headers
    finally:
        running.stop()


def test_a_client_trickling_its_headers_is_disconnected(server, monkeypatch):
    monkeypatch.setattr(TimedHeadProtocol, "head_seconds", 0.5)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as idle, \
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        for connection in (idle, slow):
            assert connection.recv(100) == b""  # closed by the server
        assert time.monotonic() - started < 5
    assert server.request("GET", "/health")[0] == 200  # a prompt client is served as before


def test_a_client_gone_mid_body_is_a_quiet_499(server, server_log):
    before = statuses(server, "/v1/completions").get("499", 0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    deadline = time.monotonic() + 10
    while statuses(server, "/v1/completions").get("499", 0) <= before:
        assert time.monotonic() < deadline, statuses(server, "/v1/completions")
        time.sleep(0.05)
    assert not [record for record in server_log.records if record.exc_info or record.levelno >= logging.ERROR]


def test_an_exception_in_the_app_is_a_counted_json_500(tiny_generator, server_log):
    running = RunningServer(tiny_generator)

    def broken(job):
        raise RuntimeError("a bug")

    running.app.state.scheduler.encode = broken
    try:
        status, _, text = raw_request(running.port, "POST", "/v1/completions", json.dumps({"prompt": "a"}), JSON)
        assert status == 500 and json.loads(text)["error"]["type"] == "server_error"
        assert statuses(running, "/v1/completions") == {"500": 1.0}
        logged = [record for record in server_log.records if record.exc_info]
        assert len(logged) == 1 and "a bug" in str(logged[0].exc_info[1])  # the bug, logged once
        # the same 500 in Anthropic's and Ollama's shapes (issue 94: the dialects' own error shape, the 500 too)
        messages = [{"role": "user", "content": "hi"}]
        status, _, text = raw_request(running.port, "POST", "/v1/messages", json.dumps(
            {"model": "tiny", "max_tokens": 4, "messages": messages}), JSON)
        assert status == 500 and json.loads(text)["error"]["type"] == "api_error", text
        for path, body in (("/api/chat", {"model": "tiny", "messages": messages}),
                           ("/api/generate", {"model": "tiny", "prompt": "a", "raw": True, "stream": False})):
            status, _, text = raw_request(running.port, "POST", path, json.dumps(body), JSON)
            assert status == 500 and isinstance(json.loads(text)["error"], str), (path, text)
    finally:
        running.stop()


def test_a_short_request_is_prefilled_before_a_long_prompt_is_done(tiny_generator):
    """A 400-token prompt is prefilled in 32-token chunks, never all at once; a 3-token request that arrives
    after its first chunk starts at the next step, and the long one goes on where it stopped."""
    scheduler = Scheduler(tiny_generator, max_active=4, prefill_tokens_per_step=32)
    events: list[tuple[str, str]] = []

    def job(name: str, prompt: list[int]) -> Job:
        made = Job(GenerationRequest(prompt, 4, SamplingParams(temperature=0.0), chat=False))
        made.emit = lambda event: events.append((name, type(event).__name__))
        return made

    long = job("long", [5 + i % 50 for i in range(400)])
    scheduler.waiting.append(long)
    scheduler._admit_some()
    scheduler._step()
    generation = scheduler.active[0][1]
    assert 0 < generation.cache.length <= 64 and not generation.prefilled, events
    scheduler.waiting.append(job("short", [7, 8, 9]))
    scheduler._admit_some()
    scheduler._step()
    assert ("short", "Started") in events and ("long", "Started") not in events
    for _ in range(30):
        scheduler._admit_some()
        scheduler._step()
    assert ("long", "Started") in events and events.index(("short", "Started")) < events.index(("long", "Started"))
    assert ("short", "Done") in events


def test_messages_the_chat_template_cannot_render_get_a_400(server, monkeypatch):
    """A template's own refusal (raise_exception) or a message shape it does not expect was a 500."""
    tokenizer = server.generator.target.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", "{{ raise_exception('Conversation roles must alternate') }}")
    status, text = server.request("POST", "/v1/chat/completions",
                                  json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
    message = json.loads(text)["error"]["message"]
    assert status == 400 and "chat template cannot render" in message and "alternate" in message, text


def test_ray_app_builder_keys_become_the_options_each_replica_loads(tiny_dirs):
    """Issue 77: app_builder handed each replica a dict where it reads GeneratorOptions, so every replica
    failed at start; without Ray installed, what a replica does with its spec runs here (the whole path through
    Ray Serve: tests/test_ray_replicas.py)."""
    from specdec.api.generator import SpeculativeGenerator
    from specdec.api.options import GeneratorOptions
    from specdec.errors import SpecdecError
    from specdec.server.ray_app import replica_spec_of

    spec = replica_spec_of({"target": str(tiny_dirs["llama"]), "drafter": "ngram", "k": "3", "replicas": "2",
                            "max_active": "2", "api_key": "k"})
    assert isinstance(spec.generator, GeneratorOptions) and spec.replicas == 2 and spec.settings.max_active == 2
    generator = SpeculativeGenerator.from_options(spec.generator)  # what build_replica_app calls
    assert generator.generate("hello", 4, chat=False).token_ids == SpeculativeGenerator(
        generator.target, None).generate("hello", 4, chat=False).token_ids
    for bad in ({"colour": "red"}, {"replicas": "two"}, {"drafter": "nope"}, {"target": "/no/such/model"}):
        with pytest.raises(SpecdecError):  # one-line errors, before any model loads
            replica_spec_of({"target": str(tiny_dirs["llama"]), **bad})


def test_server_settings_are_frozen_and_checked_at_construction():
    """Issue 77 item 2: whoever builds the settings (the CLI, Ray's replicas, a test) gets the same checks."""
    import dataclasses

    from specdec.errors import InvalidParameterError
    from specdec.server.state import ServerSettings

    settings = ServerSettings("m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_active = 0
    for field, value in (("max_active", 0), ("max_queue", -1), ("default_max_tokens", 0), ("max_tokens_cap", 0),
                         ("kv_memory_bytes", 0), ("prefill_tokens_per_step", 0), ("reasoning_format", "loud")):
        with pytest.raises(InvalidParameterError, match=field):
            ServerSettings("m", **{field: value})


def test_a_megabyte_to_tokenize_does_not_hold_other_requests(server):  # noqa: F811
    """Issue 94: /tokenize ran on the event loop, so a 1 MB body held /health (and every stream) for seconds."""
    import threading

    body = json.dumps({"content": "hello world " * 85000, "with_pieces": True})
    took = []

    def tokenize():
        started = time.monotonic()
        status, _ = server.request("POST", "/tokenize", body)
        took.append((status, time.monotonic() - started))

    worker = threading.Thread(target=tokenize)
    worker.start()
    time.sleep(0.05)
    slowest = 0.0
    while worker.is_alive():
        started = time.monotonic()
        assert server.request("GET", "/health")[0] == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.02)
    worker.join()
    status, seconds = took[0]
    assert status == 200 and slowest < seconds / 3, (slowest, seconds)


def test_errors_starlette_writes_as_text_take_the_json_shape(server):  # noqa: F811
    """Issue 94: the page's static files answered malformed ranges in plain text."""
    for header, status in (("units=0-1", 400), ("bytes=1-2-3", 400), ("bytes=--1", 416), ("bytes=999999-", 416)):
        code, _, text = raw_request(server.port, "GET", "/page/app.js", headers={"Range": header})
        assert code == status and json.loads(text)["error"]["message"], (header, text)
    assert raw_request(server.port, "GET", "/page/app.js", headers={"Range": "bytes=0-1"})[0] == 206


def test_a_cancelled_prefill_leaves_what_it_computed_for_the_retry(tiny_generator):
    """Issue 90: an agent's client that gives up during a long prompt's prefill and sends it again resumes
    where the first stopped (its computed part went to the prefix cache when it was cancelled), and the retry
    decodes as the prompt alone does."""
    from specdec.api.batch import BatchRunner
    from specdec.api.events import Done
    from specdec.api.prefix_cache import PrefixCache

    model = tiny_generator.target.model
    runner = BatchRunner(tiny_generator, PrefixCache(model, 64 << 20))
    prompt = [5 + i % 50 for i in range(300)]
    request = GenerationRequest(prompt, 8, SamplingParams(temperature=0.0), chat=False)
    generation = runner.admit("first", request)
    for _ in range(3):
        runner.step(32)
    computed = generation.cache.length
    assert 0 < computed < len(prompt) - 1 and not generation.prefilled
    runner.drop("first")  # the client left
    assert runner.prefix_cache.stats.entries == 1
    runner.admit("retry", request)
    results = []
    while runner.running:
        results += [event.result for _, event in runner.step() if isinstance(event, Done)]
    assert results[0].stats.cached_prompt_tokens >= model.reusable_prefix(computed) >= 16
    assert results[0].token_ids == tiny_generator.generate(prompt, 8, chat=False).token_ids


def test_a_stream_starts_at_once_and_keeps_alive_through_a_long_prefill(tiny_generator, monkeypatch):
    """Issue 90: nothing reached a client until its whole prompt was prefilled (agents with a 300 s timeout
    gave up with no headers). The status line and the dialect's first event go out when the request is
    admitted, then keep-alives while the prompt is prefilled, then the text."""
    import httpx

    from specdec.server import jobs
    from test_server import slow_server

    monkeypatch.setattr(jobs, "KEEP_ALIVE_SECONDS", 0.1)
    running = slow_server(tiny_generator, pause=0.05, prefill_tokens_per_step=16)  # ~16 chunks: ~0.8 s of prefill
    prompt = " ".join(f"w{i}" for i in range(120))
    try:
        for path, body, first_event, keep_alive in (
                ("/v1/completions", {"prompt": prompt, "max_tokens": 4, "stream": True}, '"text": ""', ": keep-alive"),
                ("/v1/messages", {"model": "tiny", "max_tokens": 4, "stream": True,
                                  "messages": [{"role": "user", "content": prompt}]}, "message_start", "ping")):
            started = time.monotonic()
            with httpx.stream("POST", f"http://127.0.0.1:{running.port}{path}", json=body, timeout=60) as reply:
                headers_at = time.monotonic() - started
                seen = [(time.monotonic() - started, line) for line in reply.iter_lines() if line]
            assert reply.status_code == 200
            opening = next(at for at, line in seen if first_event in line)
            text_at = next(at for at, line in seen if '"text": "' in line and '"text": ""' not in line
                           or "text_delta" in line)
            alive = [at for at, line in seen if keep_alive in line]
            assert headers_at < text_at and opening < text_at, (path, headers_at, opening, text_at)
            assert alive and alive[0] < text_at, (path, seen[:6])
    finally:
        running.stop()
