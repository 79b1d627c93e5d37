"""What every request passes before an endpoint sees it: the Host allow-list, the API key, the body's
size and content type. Each refusal is an OpenAI-style JSON error with a 4xx status.

Why each: a server on loopback can still be reached by any web page the user visits, through the
browser. A page can POST a "simple" cross-origin request (text/plain or form-encoded) without a CORS
preflight, so every POST must be sent as application/json (Ollama's routes excepted where no Origin header
says a page sent it); DNS rebinding makes a page's own host name resolve to 127.0.0.1, so on loopback only
loopback host names are served. An API key (`--api-key`, `SPECDEC_API_KEY`) guards every route (the API,
/infill, Ollama's routes, the OpenAPI document and its pages) as OpenAI's, vLLM's and llama.cpp's servers
do; only OPEN_PATHS (/health, /metrics) stay open for probes and scrapers, and the chat page's static files
(`/`, `/page/...`: the page asks the user for the key and sends it with every API call).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from specdec.server.protocol import error_body
from specdec.server.routes_page import is_page_path

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
OPEN_PATHS = ("/health", "/metrics")  # answered without the API key


@dataclass(frozen=True)
class GuardSettings:
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    allowed_hosts: tuple[str, ...] | None = None  # host names served (None: any)


def key_matches(headers: dict[str, str], api_key: str) -> bool:
    """Whether a request carries the key: as OpenAI's clients send it (`Authorization: Bearer KEY`) or as
    Anthropic's do (`x-api-key: KEY`); compared in constant time."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), api_key.encode()):
        return True
    return "x-api-key" in headers and hmac.compare_digest(headers["x-api-key"].strip().encode(), api_key.encode())


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def host_name(header: str) -> str:
    """'example.org:8000' -> 'example.org'; '[::1]:8000' -> '::1'."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def unlabelled_json_allowed(path: str, headers: dict[str, str]) -> bool:
    """Ollama's routes read a body sent without its JSON content type (Ollama's own examples are `curl -d`,
    which labels it form data) where no browser sent it: a page's request always names its Origin."""
    return path.startswith("/api/") and "origin" not in headers


class RequestGuard:
    """ASGI middleware: refuses a request with 400 (host), 401 (key), 413 (size) or 415 (content type)."""

    def __init__(self, app: ASGIApp, settings: GuardSettings):
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        status, message, code, headers = refusal
        body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *headers]})
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope) -> tuple[int, str, str, list] | None:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        path, settings = scope["path"], self.settings
        if settings.allowed_hosts is not None and host_name(headers.get("host", "")) not in settings.allowed_hosts:
            return 400, "this server does not answer for that Host header", "host_not_allowed", []
        if settings.api_key is not None and path not in OPEN_PATHS and not is_page_path(path):
            if not key_matches(headers, settings.api_key):
                return (401, "missing or incorrect API key (send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                        "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        if scope["method"] == "POST":
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > settings.max_request_bytes:
                return 413, f"the body is larger than {settings.max_request_bytes} bytes", "request_too_large", []
            media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media_type != "application/json" and not unlabelled_json_allowed(path, headers):
                return 415, "the body must be JSON sent as 'Content-Type: application/json'", "unsupported_media_type", []
        return None

