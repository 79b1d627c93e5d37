"""Serving the models a user has, by name (llama-server's router mode, Ollama's habit): every model found in
a folder or the stores is listed in /v1/models; a request's `model` picks one, loaded on first use with the
drafter `--drafter auto` pairs it with, kept while at most `max_loaded` are, the least recently used idle one
unloaded first. A request for a model being loaded waits for it; an unknown name is a 404 in the dialect's
error shape. A request may set how long its model stays loaded once idle (Ollama's keep_alive; 0: unloaded
when its requests end); the model the server was started with stays loaded whatever is asked."""

from __future__ import annotations

import asyncio
import gc
import math
import time
import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from starlette.concurrency import run_in_threadpool

from specdec.api.options import GeneratorOptions
from specdec.errors import SpecdecError
from specdec.server.memory import release_free_memory

if TYPE_CHECKING:
    from specdec.server.state import ServerState


class ModelNotFound(SpecdecError):
    """A request named a model this server does not serve (HTTP 404)."""

    param = "model"


@dataclass(frozen=True)
class ModelCatalog:
    """What may be served by name: served name -> the model spec that loads it (a zoo name, a path, a store
    name), and how each is loaded (the target's options, its `target` replaced)."""

    models: dict[str, str]
    options: GeneratorOptions
    max_loaded: int = 2

    def __post_init__(self):
        if self.max_loaded < 1:
            raise SpecdecError("max_loaded (--max-loaded) must be >= 1")

    def options_for(self, name: str) -> GeneratorOptions:
        """How `name` loads: its spec in the target's options; the target's own options for the default model
        (loaded again after it was unloaded)."""
        return dataclasses.replace(self.options, target=self.models[name]) if name in self.models else self.options


class ServedModels:
    """The loaded models' states (one generator and scheduler each), least recently used first."""

    def __init__(self, first: "ServerState", catalog: ModelCatalog | None,
                 load: Callable[[str, GeneratorOptions], "ServerState"]):
        self.default = first.settings.model_name
        self.responses = first.responses  # one Responses store for every model (not the first model itself:
        # holding it would keep its weights after it is unloaded)
        self.catalog = catalog
        self.load = load  # (served name, options) -> a started ServerState; runs off the event loop
        self.loaded: OrderedDict[str, "ServerState"] = OrderedDict({self.default: first})
        self.loading: dict[str, asyncio.Lock] = {}
        self.expiry: dict[str, float] = {}  # name -> when (time.time()) it is unloaded once idle (keep_alive)

    def names(self) -> list[str]:
        """Every model a request may name, the default first."""
        extra = [] if self.catalog is None else [name for name in self.catalog.models if name != self.default]
        return [self.default, *extra]

    async def state_for(self, name: str | None) -> "ServerState":
        """The named model's state, loaded now if it is not (None: the default model)."""
        name = self.default if name is None else name
        if name not in self.names():
            raise ModelNotFound(f"model {name!r} is not served here (this server serves "
                                f"{', '.join(repr(n) for n in self.names())})")
        lock = self.loading.setdefault(name, asyncio.Lock())
        async with lock:  # a second request for a model being loaded waits for the first's load
            if name not in self.loaded:
                state = await run_in_threadpool(self.load, name, self.catalog.options_for(name))
                state.models, state.responses = self, self.responses  # one list, one store
                self.loaded[name] = state
                await self._unload_beyond_budget(keep=name)
        self.loaded.move_to_end(name)
        return self.loaded[name]

    def add(self, name: str, spec: str) -> bool:
        """Serve one more model by name (one pulled while the server runs); False where nothing is served by
        name (no catalog: the server was started without --local-models or --models-dir)."""
        if self.catalog is None:
            return False
        self.catalog.models.setdefault(name, spec)
        return True

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """How long `name` stays loaded once idle (None: as before; inf: while the server runs; 0: it is
        unloaded when its requests end). The server's own model always stays."""
        if seconds is not None and name != self.default:
            self.expiry[name] = time.time() + seconds if not math.isinf(seconds) else math.inf

    def expires(self, name: str) -> float:
        """When a loaded model is unloaded once idle (time.time(); inf: not before the server stops)."""
        return self.expiry.get(name, math.inf)

    async def sweep(self) -> list[str]:
        """Unload the idle models whose keep_alive has passed; the names unloaded."""
        now, unloaded = time.time(), []
        for name in list(self.loaded):
            if name != self.default and self.expiry.get(name, math.inf) <= now and self._idle(name):
                await self._unload(name)
                unloaded.append(name)
        return unloaded

    async def sweep_forever(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            await self.sweep()

    def _idle(self, name: str) -> bool:
        scheduler = self.loaded[name].scheduler
        return not (scheduler.active_count or scheduler.queue_length)

    async def _unload_beyond_budget(self, keep: str) -> None:
        """Unload idle models, least recently used first, while more than max_loaded are loaded (a busy one
        stays: its requests finish first)."""
        for name in list(self.loaded):
            if len(self.loaded) <= self.catalog.max_loaded:
                return
            if name != keep and self._idle(name):
                await self._unload(name)

    async def _unload(self, name: str) -> None:
        state = self.loaded.pop(name)
        self.expiry.pop(name, None)
        await run_in_threadpool(state.scheduler.stop)
        del state
        gc.collect()  # its generator's caches and weights, before the allocator is asked to give them back
        release_free_memory()

    def stop_all(self) -> None:
        for state in self.loaded.values():
            state.scheduler.stop()
