"""Bind and run the server with uvicorn: used by `specdec serve` and by the tests, the same way."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdec.errors import InvalidParameterError


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before loading anything else, so a taken port is one clear error, not a uvicorn log line."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        raise InvalidParameterError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    return sock


# When the grace period is this close to its end, the server cancels the generations still running itself
# and gives their replies the rest of it to go out (an in-band error and [DONE] for a stream, a 503 for a
# queued or non-streamed request), so the process exits within the grace period and uvicorn's own timeout
# never cuts a connection mid-chunk.
CLOSING_SECONDS = 5.0
# A request's head (its line and headers) must arrive within this long of the connection opening or of the
# previous response: a client holding sockets open with a trickle of bytes (slowloris) is disconnected.
HEAD_SECONDS = 10.0


def closing_time(grace: float) -> float:
    return min(CLOSING_SECONDS, grace / 4)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose shutdown ends the generations still running when the grace period is nearly
    over (app.state.scheduler.cancel_all), so that each reply ends as documented instead of being cut."""

    def __init__(self, config: uvicorn.Config, grace: float):
        super().__init__(config)
        self.grace = grace

    async def shutdown(self, sockets=None) -> None:
        scheduler = getattr(self.config.app.state, "scheduler", None)
        timer = None
        if scheduler is not None:
            timer = asyncio.get_running_loop().call_later(self.grace - closing_time(self.grace),
                                                          scheduler.cancel_all)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()


class TimedHeadProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline (HEAD_SECONDS) for each request's head; uvicorn times out
    only an idle kept-alive connection, not one that sends its head a byte at a time."""

    head_seconds = HEAD_SECONDS
    head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._await_head()
        super().data_received(data)
        if not self._between_requests() and self.head_deadline is not None:  # the head arrived
            self.head_deadline.cancel()
            self.head_deadline = None

    def connection_lost(self, exc) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self) -> None:
        if self.head_deadline is None:
            self.head_deadline = self.loop.call_later(self.head_seconds, self._head_late)

    def _head_late(self) -> None:
        self.head_deadline = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()


def make_server(app: FastAPI, shutdown_grace: float = 30.0, log_level: str = "info") -> uvicorn.Server:
    # on SIGTERM/SIGINT in-flight requests get shutdown_grace seconds to finish (GracefulServer)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_grace,
                            access_log=log_level == "debug", http=TimedHeadProtocol)
    return GracefulServer(config, shutdown_grace)


def serve_forever(server: uvicorn.Server, sock: socket.socket) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully and return (exit status 0, not 143)."""
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal it caught once it has shut down; a no-op handler makes that a
        # normal return instead of death by SIGTERM.
        signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])
