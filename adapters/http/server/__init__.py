"""The admin API's HTTP server: ``create_app`` builds it, ``serve`` and ``serve_in_thread`` run it.

FastAPI under uvicorn. ``app``: the factory, with its ``errors`` handlers and the ``reads`` and
``actions`` routers (given ``deps``, answering through ``answers``); ``run``: uvicorn; ``edge``,
``protocol``, ``audit`` (with ``room``, its outcomes' disk space), ``metrics`` and ``logs`` are the
server's own. Only the commands and the
SGLang plugin import it; the client side never does (import-linter)."""

from __future__ import annotations

from radixtop.adapters.http.params import MAX_ID, parse_bool, parse_tokens
from radixtop.adapters.http.server.actions import MAX_BODY
from radixtop.adapters.http.server.app import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.server.edge import check_token_strength, is_loopback
from radixtop.adapters.http.server.protocol import MAX_URL, http_protocol
from radixtop.adapters.http.server.reads import EXPORT_CHUNK_ROWS
from radixtop.adapters.http.server.run import ServerThread, bind, serve, serve_in_thread
from radixtop.adapters.http.wire import PayloadTooLarge

__all__ = [
    "EXPORT_CHUNK_ROWS", "MAX_BODY", "MAX_ID", "MAX_URL", "AuditLog", "PayloadTooLarge", "ServerThread", "bind",
    "check_token_strength", "create_app", "http_protocol", "is_loopback", "parse_bool", "parse_tokens", "serve",
    "serve_in_thread",
]
