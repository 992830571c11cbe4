"""Running the admin API under uvicorn: here until Ctrl-C, or in a thread of its own.

One way for both: a socket bound first, then uvicorn on it with the API's bounded protocol.
``serve`` is ``radixtop serve``'s; ``serve_in_thread`` is the SGLang plugin's."""

from __future__ import annotations

import secrets
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from fastapi import FastAPI

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.http.server.app import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.server.budget import CpuBudget
from radixtop.adapters.http.server.edge import check_token_strength, check_token_text, host_in_url, is_loopback
from radixtop.adapters.http.server.protocol import http_protocol


def bind(host: str, port: int) -> socket.socket:
    """A bound socket, so that a port in use is an OSError here rather than an exit in uvicorn."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def base_url(host: str, port: int) -> str:
    """Where a client reaches a server bound to ``host:port``."""
    return f"http://{host_in_url(host)}:{port}"


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _uvicorn(app: FastAPI) -> Any:
    """A uvicorn server for ``app`` (uvicorn is imported here: ``radixtop --help`` and the SGLang
    plugin's module do without it). Its own logs are warnings only, with no access log."""
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, http=http_protocol(), log_level="warning", access_log=False))


class ServerThread(NamedTuple):
    """The admin API serving in a thread of its own: ``server.should_exit = True`` stops it."""

    server: Any  # uvicorn.Server
    thread: threading.Thread
    url: str


def serve_in_thread(app: FastAPI, host: str, port: int, name: str) -> ServerThread:
    """Serve ``app`` on ``host:port`` in a daemon thread called ``name``; a port that cannot be bound
    raises OSError here, before the thread starts."""
    sock = bind(host, port)
    server = _uvicorn(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    return ServerThread(server, thread, base_url(host, port))


def checked_tokens(host: str, token: str | None, read_token: str | None) -> tuple[str, bool]:
    """The action token to serve with, and whether it was made up here (none given: loopback
    only); ValueError for a bind off loopback without one, or a token too weak or not text."""
    if token is None and not is_loopback(host):
        raise ValueError(f"refusing to serve the admin API on {host!r} without an explicit token: "
                         "it can close sessions and evict; pass a token, or use 127.0.0.1")
    generated = token is None
    if token is None:
        token = secrets.token_urlsafe(24)
    for value, what in ((token, "token"), (read_token, "read token")):
        if value is not None:
            check_token_text(value, what)
            check_token_strength(value, what)
    return token, generated


def serve(adapter: CacheAdapter, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          audit_path: Path | str | None = None, log: Callable[[str], Any] = print,
          read_token: str | None = None, fleet: Callable[[], Any] | None = None,
          sock: socket.socket | None = None, proof_key: bytes | None = None, cpu_share: float | None = None) -> None:
    """Run the admin API until interrupted (Ctrl-C returns normally). Without a token it listens
    on loopback only and makes one up, printed once here (nowhere else); a token given must be
    at least MIN_TOKEN_LENGTH characters, and so must ``read_token`` (reads on a bind that is not
    loopback need either). A bad token or audit log path raises ValueError and a port that cannot
    be bound OSError, before anything is printed. ``sock``: a socket bound (and listening) on
    ``host`` already, handed over by the process that started this one, served instead of
    binding ``port`` (so no other process can take the port in between); ``proof_key``: see
    ``create_app``; ``cpu_share``: at most that share of one core taken for reads, on average
    (``budget.CpuBudget``; None: no bound)."""
    token, generated = checked_tokens(host, token, read_token)
    audit = AuditLog(audit_path)
    try:
        app = create_app(adapter, token, audit, host=host, read_token=read_token, fleet=fleet, proof_key=proof_key,
                         budget=None if cpu_share is None else CpuBudget(cpu_share))
        if sock is None:
            sock = bind(host, port)
        else:
            port = sock.getsockname()[1]
        log(f"radixtop admin API for {adapter.name} on {base_url(host, port)}"
            + (f" (audit log: {audit_path})" if audit_path is not None else ""))
        if generated:
            log(f"API token (send as 'Authorization: Bearer <token>'): {token}")
        # SIGTERM (systemd, docker, kill) stops it as Ctrl-C does: uvicorn shuts down, then raises
        # the signal it caught again under the handler it found, which is this one (by default
        # the process would die of the signal, status 143).
        main = threading.current_thread() is threading.main_thread()  # handlers live in the main thread
        previous = signal.signal(signal.SIGTERM, _stop) if main else None
        try:
            _uvicorn(app).run(sockets=[sock])
        except KeyboardInterrupt:
            pass  # uvicorn has shut down cleanly; Ctrl-C is how a server is meant to stop
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            sock.close()
    finally:
        audit.close()
