"""Bind and run the server with uvicorn: used by `specdec serve` and by the tests, the same way."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading

import uvicorn
from fastapi import FastAPI

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


# After the grace period the server cancels the generations still running itself and gives their replies
# this long to go out (an in-band error and [DONE] for a stream, a 503 for a queued or non-streamed
# request) before uvicorn's own timeout would cut the connections mid-chunk.
CLOSING_SECONDS = 5.0


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose shutdown ends the generations still running when the grace period is over
    (app.state.scheduler.cancel_all), so that each reply ends as documented instead of being cut."""

    def __init__(self, config: uvicorn.Config, grace: float):
        super().__init__(config)
        self.grace = grace

    async def shutdown(self, sockets=None) -> None:
        scheduler = getattr(self.config.app.state, "scheduler", None)
        timer = None
        if scheduler is not None:
            timer = asyncio.get_running_loop().call_later(self.grace, scheduler.cancel_all)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()


def make_server(app: FastAPI, shutdown_grace: float = 30.0, log_level: str = "info") -> uvicorn.Server:
    # on SIGTERM/SIGINT in-flight requests get shutdown_grace seconds to finish (GracefulServer)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_grace + CLOSING_SECONDS,
                            access_log=log_level == "debug")
    return GracefulServer(config, shutdown_grace)


def serve_forever(server: uvicorn.Server, sock: socket.socket) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully and return (exit status 0, not 143)."""
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal it caught once it has shut down; a no-op handler makes that a
        # normal return instead of death by SIGTERM.
        signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])
