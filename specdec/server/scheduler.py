"""One worker thread runs every generation, their rounds batched.

Why one thread: the model's forward already uses every core, so running two
forwards at once only makes both slower; and keeping the model, the tokenizer
and the caches on one thread needs no locks. Each worker step runs one round of
every active generation (up to `max_active`) with their verify forwards as one
batched pass over the weights (api.batch.BatchRunner; on a memory-bound
machine B requests' rows cost far less than B forwards), and requests join and
leave between steps (continuous batching).

New requests: a request starts when a slot is free and its KV cache fits in the
KV memory budget (`kv_budget_bytes`; else it waits in the queue). Its prompt is
prefilled before it joins the rounds, in chunks of about PREFILL_TOKENS_PER_STEP
prompt tokens per step, the prompts with the fewest tokens left first: a burst of
new or long prompts delays the running streams by a bounded amount per step, and
a short request arriving behind a long prompt waits one chunk, not the whole
prompt. A prompt that shares a prefix with an earlier one (a system
prompt, a chat history resent with one more turn) copies that prefix's keys
and values from the prefix cache instead of computing them; each finished
prefill and each finished generation is offered to it.

Isolation: each job gets its own engine (KV cache, drafter state from
`Drafter.fresh()`, random generator); only the weights, the prefix cache's
read-only copies and the adaptive-K cost model are shared. A cancelled job
(client gone, server stopping) is dropped before its next step and its cache is
freed with it.

Events (api/events.py: Started, Chunk, Done, Refused for bad input found late, Failed, Cancelled) go
back to the asyncio side through `loop.call_soon_threadsafe`; the batch runner's step makes all but the
scheduler's own (Refused for a cache over the KV memory, Cancelled).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from specdec.api.batch import BatchRunner
from specdec.api.grammar_bounds import start_deep_stack_thread
from specdec.api.events import FINAL_EVENTS, Cancelled, Done, Event, Failed, Refused
from specdec.api.generator import SpeculativeGenerator
from specdec.api.prefix_cache import PrefixCache
from specdec.api.request import GenerationRequest
from specdec.errors import SpecdecError
from specdec.server.memory import release_free_memory


class QueueFullError(SpecdecError):
    pass


@dataclass
class Job:
    request: GenerationRequest  # its prompt as checked token ids once `Scheduler.encode` ran
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    loop: asyncio.AbstractEventLoop | None = None
    cancelled: bool = False
    reason: str = ""  # why it was cancelled: what its Cancelled event carries
    connection_checked: float = 0.0  # when the server last asked whether the client is still there
    kv_bytes: int = 0  # its KV cache's size, once known (a job waiting for KV memory is not sized again)

    def cancel(self, reason: str = "the request was cancelled") -> None:
        if not self.cancelled:  # the first reason stands
            self.cancelled, self.reason = True, reason  # read by the worker before each round

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass  # the event loop is closed: the server has stopped and nobody is listening


# Prompt rows' work prefilled per worker step (one block at least), whatever else runs: between two chunks
# new requests are admitted and running streams take a round.
PREFILL_TOKENS_PER_STEP = 512
SHUTTING_DOWN = "the server is shutting down"


class Scheduler:
    def __init__(self, generator: SpeculativeGenerator, max_active: int = 4, max_queue: int = 64,
                 on_finished: Callable | None = None, on_round: Callable | None = None,
                 kv_budget_bytes: int | None = None, prefix_cache: PrefixCache | None = None,
                 prefill_tokens_per_step: int = PREFILL_TOKENS_PER_STEP):
        """kv_budget_bytes: the running generations' target KV caches together, at most (None: no limit);
        prefix_cache: where prompts' keys and values are kept for later prompts (None: none);
        prefill_tokens_per_step: prompt rows' work prefilled per step (more: batches refill faster; fewer:
        shorter stalls of the running streams and of requests behind a long prompt)."""
        if max_active < 1 or max_queue < 0:
            raise SpecdecError("max_active must be >= 1 and max_queue >= 0")
        self.generator = generator
        self.max_active, self.max_queue = max_active, max_queue
        self.kv_budget_bytes = kv_budget_bytes
        self.prefill_tokens_per_step = max(1, prefill_tokens_per_step)
        self.on_finished = on_finished or (lambda job, result: None)
        # on_round: after each batched round (its BatchedRound)
        self.runner = BatchRunner(generator, prefix_cache, keep_conversations=True, on_round=on_round)
        self.waiting: deque[Job] = deque()
        self.active: list[tuple[Job, object]] = []  # (job, its generation), prefilling or running
        self.wake = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None

    # -- asyncio side ---------------------------------------------------------------------
    def start(self) -> None:
        # a deep stack: the worker builds grammar matchers and computes their masks, native code that recurses
        self.thread = start_deep_stack_thread(self._run, "specdec-scheduler")

    def submit(self, job: Job) -> None:
        job.loop = asyncio.get_running_loop()
        with self.wake:
            if self.stopping:
                raise QueueFullError("the server is shutting down")
            if len(self.waiting) >= self.max_queue and len(self.active) >= self.max_active:
                raise QueueFullError(f"the server is busy ({len(self.waiting)} requests waiting); retry later")
            self.waiting.append(job)
            self.wake.notify()

    def cancel_all(self) -> None:
        """Cancel what is queued or running; each job gets its Cancelled event. Does not wait."""
        with self.wake:
            for job in self.waiting:
                job.cancel(SHUTTING_DOWN)
            for job, _ in self.active:
                job.cancel(SHUTTING_DOWN)
            self.wake.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is still queued or running and wait for the worker to exit."""
        with self.wake:
            self.stopping = True
        self.cancel_all()
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout)

    @property
    def queue_length(self) -> int:
        return len(self.waiting)

    @property
    def active_count(self) -> int:
        return len(self.active)

    @property
    def kv_bytes_in_use(self) -> int:
        """Bytes of the target KV caches of the generations started and not yet finished."""
        with self.wake:
            entries = list(self.active)
        return sum(generation.cache.nbytes for _, generation in entries)

    # -- worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        busy = False  # work done since the allocator's free memory was last returned
        while True:
            with self.wake:
                idle = not self.waiting and not self.active
            if idle and busy:  # the last generation has just ended
                release_free_memory()
                busy = False
            with self.wake:
                while not self.stopping and not self.waiting and not self.active:
                    self.wake.wait()
                if self.stopping and not self.waiting and not self.active:
                    return
            self._admit_some()
            self._step()
            busy = True

    def _admit_some(self) -> None:
        """Start waiting requests, first come first served, while a slot is free and the next one's KV cache
        fits in the budget (else it waits, first in line, until running ones finish)."""
        while True:
            with self.wake:
                if not self.waiting or len(self.active) >= self.max_active:
                    return
                job = self.waiting[0]
            if job.cancelled:
                self._dequeue(job)
                job.emit(Cancelled(job.reason))
                continue
            if job.kv_bytes and self.active and not self._kv_fits(job.kv_bytes):
                return
            generation = self._admit(job)
            if generation is None:
                self._dequeue(job)
                continue
            job.kv_bytes = generation.cache.nbytes
            if not self._kv_fits(job.kv_bytes):
                self.runner.drop(job)  # its cache goes; it is allocated again once memory is free
                if self.active:
                    return
                self._dequeue(job)
                job.emit(Refused(SpecdecError(
                    f"this request needs {_mib(job.kv_bytes)} MiB of KV cache, more than the server's KV memory "
                    f"({_mib(self.kv_budget_bytes)} MiB); send a shorter prompt or a smaller max_tokens")))
                continue
            self._dequeue(job)
            with self.wake:
                self.active.append((job, generation))

    def _kv_fits(self, size: int) -> bool:
        return self.kv_budget_bytes is None or self.kv_bytes_in_use + size <= self.kv_budget_bytes

    def _dequeue(self, job: Job) -> None:
        with self.wake:
            if self.waiting and self.waiting[0] is job:
                self.waiting.popleft()

    def _admit(self, job: Job):
        """The job's generation, admitted to the runner (its cache allocated, nothing computed), or None when
        it could not start (the job got its event)."""
        try:
            return self.runner.admit(job, job.request)
        except SpecdecError as exc:
            job.emit(Refused(exc))
        except Exception as exc:  # a bug, not bad input: report it to this request only
            job.emit(Failed(exc))
        return None

    def encode(self, job: Job) -> None:
        """Replace the job's prompt by its checked token ids. Thread-safe: the server calls it off the worker
        thread, so tokenizing a large prompt never stalls the generations running."""
        job.request = job.request.replace(prompt=self.generator.prompt_ids(job.request), chat=False)

    def _step(self) -> None:
        """Cancelled jobs leave; then one step of the runner (BatchRunner.step: about prefill_tokens_per_step
        prompt rows' work prefilled, a row deep in a long prompt counting for more, then one round of every
        prefilled generation, their verify forwards batched), its events to their jobs."""
        with self.wake:
            cancelled = [job for job, _ in self.active if job.cancelled]
        for job in cancelled:
            self.runner.drop(job)
            job.emit(Cancelled(job.reason))
            self._remove(job)
        for job, event in self.runner.step(self.prefill_tokens_per_step):
            if isinstance(event, Done):
                self.on_finished(job, event.result)
            job.emit(event)
            if isinstance(event, FINAL_EVENTS):
                self._remove(job)

    def _remove(self, job: Job) -> None:
        with self.wake:
            self.active = [entry for entry in self.active if entry[0] is not job]


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f}"
