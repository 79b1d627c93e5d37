"""Error replies in the shape each API dialect's clients read. Every refusal is written once, in OpenAI's
shape (the guard, the routes, the scheduler's jobs); this middleware rewrites those under Anthropic's
routes into Anthropic's shape (`{"type": "error", "error": {"type": ..., "message": ...}}`) and those under
Ollama's into its (`{"error": "..."}`), whoever wrote them, so no route or gate needs to know which dialect
it is answering."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdec.server.anthropic_reply import anthropic_error

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
    shape."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (speaks_anthropic(scope["path"]) or speaks_ollama(scope["path"])):
            return await self.app(scope, receive, send)
        shape = anthropic_error if speaks_anthropic(scope["path"]) else ollama_error
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
            headers = [(name, value) for name, value in start["headers"] if name.lower() != b"content-length"]
            await send({**start, "headers": headers + [(b"content-length", str(len(new_body)).encode())]})
            await send({"type": "http.response.body", "body": new_body})

        await self.app(scope, receive, rewrite)


def ollama_error(status: int, message: str) -> dict:
    return {"error": message}


def reshaped(status: int, body: bytes, shape=anthropic_error) -> bytes:
    """An OpenAI-shaped error body in another dialect's shape (another body is left as it is)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body
    return json.dumps(shape(status, str(message))).encode()
