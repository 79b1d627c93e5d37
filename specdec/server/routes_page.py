"""GET / and /page/*: the chat page that shows what speculation does (server/page/: its HTML, script, style
and vendored libraries, all served from the package; nothing is fetched from the network). The page's files
are open like /health; every API call it makes passes the guard with the key the user enters."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

PAGE_DIR = Path(__file__).resolve().parent / "page"

router = APIRouter()


# What Ollama's server answers at its root: the health check its clients and tools make there.
OLLAMA_RUNNING = "Ollama is running"


@router.get("/", include_in_schema=False)
async def page(request: Request) -> Response:
    """The page for a browser (it asks for HTML); Ollama's health line for a program asking Ollama's root."""
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(OLLAMA_RUNNING)
    return FileResponse(PAGE_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.head("/", include_in_schema=False)
async def alive() -> Response:
    return PlainTextResponse(OLLAMA_RUNNING)


def page_files() -> StaticFiles:
    """The page's script, style and vendored libraries, mounted at /page."""
    return StaticFiles(directory=PAGE_DIR)


def is_page_path(path: str) -> bool:
    return path == "/" or path.startswith("/page/")
