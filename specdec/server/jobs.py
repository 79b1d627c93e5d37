"""A request's choices as scheduler jobs: submitted, waited for until they start, then answered whole or as a
stream of server-sent events, a client that leaves cancelling its jobs."""

from __future__ import annotations

import asyncio
import random
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specdec.api.events import FINAL_EVENTS, Cancelled, Chunk, Done, Event, Failed, Refused, Started
from specdec.api.request import GenerationRequest
from specdec.core.rounds import GenerationResult
from specdec.errors import ContextLengthError, SpecdecError
from specdec.server.http_errors import ended_text, error
from specdec.server.request_body import BadRequest
from specdec.server.scheduler import Job, QueueFullError
from specdec.server.state import ServerState
from starlette.concurrency import run_in_threadpool

DISCONNECT_POLL_SECONDS = 0.25
KEEP_ALIVE_SECONDS = 10.0  # a stream quiet this long (queued, or a long prefill) gets a keep-alive frame


async def run_jobs(state: ServerState, request: Request, generation_request: GenerationRequest, n: int,
                   stream: bool, reply) -> Response:
    """Submit the request's `n` choices (seeds seed, seed + 1, ...), wait until they start, then answer
    whole or as a stream (`reply`: the dialect's writer, stream_events says how)."""
    arrived = time.perf_counter()
    jobs = await submit(state, generation_request, n)
    if isinstance(jobs, Response):
        return jobs
    if stream:  # the status and the stream's first event go out at once: a long prompt's prefill (minutes for an
        # agent's) happens behind them, with keep-alives, so a client's own timeout never sees a silent server
        prompt_tokens = len(jobs[0].request.prompt)
        events = stream_events(state, jobs, reply, prompt_tokens, arrived)
        return StreamingResponse(events, media_type=reply.media_type,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    prompt_tokens = 0
    for job in jobs:  # each waits in the queue until admitted
        first = await next_event(job, request)
        if not isinstance(first, Started):
            for other in jobs:
                other.cancel()
            return await not_started(first, request)
        prompt_tokens = first.prompt_tokens
    results = []
    for job in jobs:
        result = await finish(job, request)
        if result is None or isinstance(result, Exception):
            for other in jobs:
                other.cancel()
        if result is None:
            if await request.is_disconnected():  # nobody reads this reply: count it as nginx does, not a 503
                return error(499, "the client closed the request", "invalid_request_error")
            return error(503, "generation cancelled: the server is shutting down", "server_error")
        if isinstance(result, SpecdecError):  # the request's own input failed mid-output (Refused)
            return error(400, str(result), "invalid_request_error")
        if isinstance(result, Exception):
            return error(500, f"generation failed: {result}", "server_error")
        results.append(result)
    return JSONResponse(reply.whole(results, prompt_tokens))


async def submit(state: ServerState, generation_request: GenerationRequest, n: int) -> list[Job] | Response:
    """The choices' jobs, queued; or the error reply (a prompt too long, the queue full)."""
    jobs: list[Job] = []
    try:
        first = Job(generation_request)
        await run_in_threadpool(state.scheduler.encode, first)  # off the worker: tokenizing may take a while
        prompt_length, limit = len(first.request.prompt), state.settings.max_prompt_tokens
        if limit is not None and prompt_length > limit:
            return error(400, f"the prompt is {prompt_length} tokens; this server takes at most {limit}",
                         "invalid_request_error", code="context_length_exceeded")
        context = state.generator.target.model.max_context
        if prompt_length >= context:  # known now, before a stream's status line: a 400, not an in-band error
            return error(400, f"prompt is {prompt_length} tokens; the model's context is {context} tokens",
                         "invalid_request_error", code="context_length_exceeded")
        base = first.request.seed if first.request.seed is not None else random.getrandbits(63)
        jobs = [Job(first.request.replace(seed=base + i if n > 1 or first.request.seed is not None else None))
                for i in range(n)]
        for job in jobs:
            state.scheduler.submit(job)
    except BadRequest as exc:
        return error(400, str(exc), "invalid_request_error", exc.param)
    except QueueFullError as exc:
        for job in jobs:
            job.cancel()
        return error(503, str(exc), "server_busy")
    except SpecdecError as exc:
        return error(400, str(exc), "invalid_request_error")
    return jobs


async def not_started(first: Event, request: Request) -> Response:
    """The reply to a job whose first event was not Started."""
    if isinstance(first, Refused):
        code = "context_length_exceeded" if isinstance(first.error, ContextLengthError) else None
        return error(400, str(first.error), "invalid_request_error", code=code)
    if isinstance(first, Cancelled) and await request.is_disconnected():  # gone while queued or prefilling
        return error(499, "the client closed the request", "invalid_request_error")
    return error(500 if isinstance(first, Failed) else 503, ended_text(first), "server_error")


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
    """The job's result, its failure (a SpecdecError where its own input was at fault), or None when it
    was cancelled."""
    while True:
        event = await next_event(job, request)
        if isinstance(event, Done):
            return event.result
        if isinstance(event, (Failed, Refused)):
            return event.error
        if isinstance(event, Cancelled):
            return None


async def stream_events(state: ServerState, jobs: list[Job], reply, prompt_tokens: int, arrived: float
                        ) -> AsyncIterator[str]:
    """The choices' events as their rounds commit text, interleaved, in the reply's dialect: `reply` writes
    the stream's frames (stream_start / keep_alive / stream_text / stream_done / stream_failed / stream_end,
    sent as its media_type: server-sent events for the OpenAI chat and completions Reply, Responses,
    Anthropic Messages and llama-server's routes, one JSON object a line for Ollama's). The start goes out before the prompts are
    prefilled; while nothing comes, a keep-alive every KEEP_ALIVE_SECONDS."""
    first_text = True
    results: list[GenerationResult | None] = [None] * len(jobs)
    try:
        for frame in reply.stream_start(prompt_tokens):
            yield frame
        async for index, event in merged_events(jobs, KEEP_ALIVE_SECONDS):
            if event is None:  # a quiet while (queued, or a long prefill)
                for frame in reply.keep_alive():
                    yield frame
                continue
            if isinstance(event, Started):
                continue
            if isinstance(event, Chunk):
                frames = reply.stream_text(index, event.chunk)
                if frames and first_text:
                    state.metrics.time_to_first_token.observe(time.perf_counter() - arrived)
                    first_text = False
            elif isinstance(event, Done):
                results[index] = event.result
                frames = reply.stream_done(index, event.result)
            else:  # refused, failed or cancelled: tell the client in-band, the status line is already sent
                kind = "invalid_request_error" if isinstance(event, Refused) else "server_error"
                frames = reply.stream_failed(ended_text(event), kind)
            for frame in frames:
                yield frame
            if not isinstance(event, (Chunk, Done)):
                break
        for frame in reply.stream_end(results, prompt_tokens):
            yield frame
    finally:
        for job in jobs:
            job.cancel()  # no-op when finished; frees the slots when the client disconnected


async def merged_events(jobs: list[Job], quiet_seconds: float | None = None):
    """(choice index, event) of several jobs' events as they come; a job's stream ends with its Done (or
    another final event). (None, None) after each `quiet_seconds` without one (None: never)."""
    pending = {asyncio.ensure_future(job.events.get()): index for index, job in enumerate(jobs)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, timeout=quiet_seconds, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                yield None, None
                continue
            for task in sorted(done, key=lambda task: pending[task]):
                index = pending.pop(task)
                event = task.result()
                yield index, event
                if not isinstance(event, FINAL_EVENTS):
                    pending[asyncio.ensure_future(jobs[index].events.get())] = index
    finally:
        for task in pending:
            task.cancel()
