"""OpenAI-style error replies, and the request body read within the server's limits."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from specdec.server.served_models import ModelNotFound
from specdec.api.events import Cancelled, Event, Failed
from specdec.errors import SpecdecError
from specdec.server.protocol import error_body
from specdec.server.request_body import BadRequest

BODY_SECONDS = 30.0  # a body not received whole by then gets 408 (a client trickling it holds a connection)
RETRY_AFTER_SECONDS = "5"  # what a 503 (queue full, shutting down) suggests to a client

ERROR_SCHEMA = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}, "required": ["message", "type"]}}, "required": ["error"]}
ERROR_RESPONSES = {
    status: {"description": what, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for status, what in [(400, "invalid request (one line in error.message)"), (401, "missing or wrong API key"),
                         (413, "body too large"), (415, "body not sent as application/json"),
                         (503, "queue full or shutting down (Retry-After)")]
}


class BodyTooLarge(BadRequest):
    """A body over --max-request-bytes that came without a Content-Length (HTTP 413)."""


class BodyNotReceived(BadRequest):
    """A body that did not arrive whole: too slow (HTTP 408) or the client left (499)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None,
          headers: dict | None = None) -> JSONResponse:
    """An OpenAI-style error reply (the ResponseCounter middleware counts it under its endpoint)."""
    if status == 503:
        headers = {**(headers or {}), "Retry-After": RETRY_AFTER_SECONDS}
    return JSONResponse(error_body(message, kind, param, code), status_code=status, headers=headers)


def refused(exc: SpecdecError) -> JSONResponse:
    """A request refused before it ran: 413 for a body too large, 408 for one too slow, 499 for a client gone
    before its body arrived, 404 for a model not served, else 400 naming the field at fault."""
    if isinstance(exc, BodyTooLarge):
        return error(413, str(exc), "invalid_request_error")
    if isinstance(exc, BodyNotReceived):
        return error(exc.status, str(exc), "invalid_request_error")
    if isinstance(exc, ModelNotFound):  # as OpenAI answers a model it does not have
        return error(404, str(exc), "invalid_request_error", "model", "model_not_found")
    return error(400, str(exc), "invalid_request_error", getattr(exc, "param", None))


def ended_text(event: Event) -> str:
    """A request's end other than Done, as its error message says it."""
    if isinstance(event, Cancelled):
        return f"generation cancelled: {event.reason}"
    kind = "failed" if isinstance(event, Failed) else "error"
    return f"generation {kind}: {event.error}"


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, or BodyNotReceived (too slow, or the client left) / BodyTooLarge."""
    try:
        raw = await asyncio.wait_for(request.body(), BODY_SECONDS)
    except asyncio.TimeoutError:
        raise BodyNotReceived(408, f"the body did not arrive within {BODY_SECONDS:.0f} s") from None
    except ClientDisconnect:  # closed mid-body, or a Content-Length longer than what it sent
        raise BodyNotReceived(499, "the client closed the connection before its body arrived") from None
    if len(raw) > max_bytes:  # a body sent without Content-Length
        raise BodyTooLarge(f"the body is larger than {max_bytes} bytes")
    return raw
