"""Bind and run the server with uvicorn: used by `specdec serve` and by the tests, the same way."""

from __future__ import annotations

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


def make_server(app: FastAPI, shutdown_grace: float = 30.0, log_level: str = "info") -> uvicorn.Server:
    # timeout_graceful_shutdown: on SIGTERM/SIGINT, in-flight requests get this long to finish; then the
    # app's lifespan shutdown cancels the rest (their clients get an in-band error and [DONE]).
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=shutdown_grace,
                                         access_log=log_level == "debug"))


def serve_forever(server: uvicorn.Server, sock: socket.socket) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully and return (exit status 0, not 143)."""
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal it caught once it has shut down; a no-op handler makes that a
        # normal return instead of death by SIGTERM.
        signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])
