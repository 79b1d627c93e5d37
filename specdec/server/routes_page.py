"""GET / and /page/*: the chat page that shows what speculation does (server/page/: its HTML, script, style
and vendored libraries, all served from the package; nothing is fetched from the network). The page's files
are open like /health; every API call it makes passes the guard with the key the user enters."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

PAGE_DIR = Path(__file__).resolve().parent / "page"

router = APIRouter()


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(PAGE_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def page_files() -> StaticFiles:
    """The page's script, style and vendored libraries, mounted at /page."""
    return StaticFiles(directory=PAGE_DIR)


def is_page_path(path: str) -> bool:
    return path == "/" or path.startswith("/page/")
