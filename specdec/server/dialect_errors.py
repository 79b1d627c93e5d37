"""Error replies in the shape each API dialect's clients read. Every refusal is written once, in OpenAI's
shape (the guard, the routes, the scheduler's jobs); this middleware rewrites those under Anthropic's
routes into Anthropic's shape (`{"type": "error", "error": {"type": ..., "message": ...}}`) and those under
Ollama's into its (`{"error": "..."}`), whoever wrote them, so no route or gate needs to know which dialect
it is answering; an error Starlette writes as plain text (a static file's range errors) becomes JSON too."""

from __future__ import annotations

import json
from http import HTTPStatus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdec.server.anthropic_reply import anthropic_error
from specdec.server.protocol import error_body

ANTHROPIC_PATHS = ("/v1/messages",)  # and the paths under it
OLLAMA_PATHS = ("/api",)


def under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)


def speaks_anthropic(path: str) -> bool:
    return under(path, ANTHROPIC_PATHS)


def speaks_ollama(path: str) -> bool:
    return under(path, OLLAMA_PATHS)


class DialectErrors:
    """ASGI middleware: a JSON error reply (status >= 400) on an Anthropic or Ollama route, rewritten in its
    shape; and an error written as plain text anywhere (Starlette's own, e.g. a static file's malformed Range),
    written as a JSON error in the route's dialect."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        shape = anthropic_error if speaks_anthropic(path) else ollama_error if speaks_ollama(path) else openai_error
        start: Message | None = None
        body = b""

        async def rewrite(message: Message) -> None:
            nonlocal start, body
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is whole
                return
            if start is None:
                return await send(message)
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            new_body = reshaped(start["status"], body, shape)
            headers = [(name, value) for name, value in start["headers"]
                       if name.lower() not in (b"content-length", b"content-type")]
            await send({**start, "headers": headers + [(b"content-type", b"application/json"),
                                                       (b"content-length", str(len(new_body)).encode())]})
            await send({"type": "http.response.body", "body": new_body})

        await self.app(scope, receive, rewrite)


def ollama_error(status: int, message: str) -> dict:
    return {"error": message}


def openai_error(status: int, message: str) -> dict:
    return error_body(message, "invalid_request_error" if status < 500 else "server_error")


def reshaped(status: int, body: bytes, shape=anthropic_error) -> bytes:
    """An error body in a dialect's shape: an OpenAI-shaped one's message, or a plain-text one's text (its
    status's reason where it is empty); other JSON is left as it is."""
    try:
        written = json.loads(body)
    except ValueError:  # plain text
        text = body.decode("utf-8", "replace").strip()
        return json.dumps(shape(status, text.splitlines()[0] if text else HTTPStatus(status).phrase)).encode()
    error = written.get("error") if isinstance(written, dict) else None
    if shape is openai_error or not isinstance(error, dict) or "message" not in error:
        return body  # JSON already in its dialect's shape
    return json.dumps(shape(status, str(error["message"]))).encode()
