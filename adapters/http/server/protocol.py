"""The admin API's HTTP protocol under uvicorn (httptools): its own refusals carry the API's error
body, and no client can hold the server with a slow or endless request or with many connections."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from functools import cache

from radixtop.adapters.errors import AdapterError, BadRequest
from radixtop.adapters.http.server.logs import RepeatLimit
from radixtop.adapters.http.wire import PayloadTooLarge, error_body, error_to_body

MAX_URL = 65_535  # httptools cannot parse a longer request target; the app holds to the same limit
MAX_HEAD = MAX_URL + 32 * 1024
"""Bytes of a request's head (its request line and headers) before it is refused with 431."""
REQUEST_TIMEOUT_S = 10.0
"""A request's head and body arrive within this many seconds of its first byte (or of the
connection), or the connection is closed (408 while the head is incomplete)."""
MAX_CONNECTIONS = 1024
LOG_EVERY_S = 10.0
"""A failed accept is logged at most this often."""


def max_connections() -> int:
    """Connections one server holds at once: half the process's open-file limit (the cache, its
    engine and their libraries keep the rest), at most MAX_CONNECTIONS."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft // 2))


def url_too_long() -> PayloadTooLarge:
    return PayloadTooLarge(f"request URL over {MAX_URL} bytes (a match over HTTP takes ~10k-30k token ids)")


def _failed_accept(record: logging.LogRecord) -> str | None:
    """What the event loop's failed accepts have in common (each one's text names its socket)."""
    return "accept" if "accept" in record.getMessage() else None


@cache
def http_protocol() -> type:
    """uvicorn's httptools protocol, bounded: a request's head at most MAX_HEAD bytes (431), its
    head and body within REQUEST_TIMEOUT_S (408), at most ``max_connections()`` connections (the
    oldest one waiting for a request makes room, else the new one is answered 503). Its own
    refusals carry the API's error body: 413 for a URL over MAX_URL (httptools cannot parse one,
    so the app never sees it), 400 for a request it cannot parse at all. Also bounds how often
    the event loop logs a failed accept (out of files, it tried and logged again at once)."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    logging.getLogger("asyncio").addFilter(RepeatLimit(burst=1, window=LOG_EVERY_S, key=_failed_accept))
    cap = max_connections()

    class BoundedProtocol(HttpToolsProtocol):
        head_bytes: int | None = 0
        """Bytes of the next request's head so far; None from its end to the end of its body."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.waiting_since = self.loop.time()
            self.request_timer: asyncio.TimerHandle | None = None
            self._arm()
            if len(self.connections) > cap:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.head_bytes is not None:
                self.head_bytes += len(data)
            super().data_received(data)
            if self.head_bytes is not None and self.head_bytes > MAX_HEAD and not self.transport.is_closing():
                if len(getattr(self, "url", b"")) > MAX_URL:
                    self._refuse(413, url_too_long())
                else:
                    self._refuse(431, PayloadTooLarge(f"request head over {MAX_HEAD} bytes"))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self.head_bytes = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self.head_bytes = 0

        def on_response_complete(self) -> None:
            self.waiting_since = self.loop.time()
            super().on_response_complete()

        def send_400_response(self, msg: str) -> None:
            if len(getattr(self, "url", b"")) > MAX_URL:
                self._refuse(413, url_too_long())
            else:
                self._refuse(400, BadRequest("invalid HTTP request: not well-formed HTTP/1.1"))

        # ----- bounds -----

        def _arm(self) -> None:
            if self.request_timer is None:
                self.request_timer = self.loop.call_later(REQUEST_TIMEOUT_S, self._timed_out)

        def _disarm(self) -> None:
            if self.request_timer is not None:
                self.request_timer.cancel()
                self.request_timer = None

        def _timed_out(self) -> None:
            self.request_timer = None
            if self.transport.is_closing():
                return
            if self.head_bytes:  # part of a head: say why (a connection that sent nothing is just closed)
                self._refuse(408, AdapterError(f"the request did not arrive within {REQUEST_TIMEOUT_S:g} s"),
                             code="request_timeout")
            else:
                self.transport.close()  # (a body that stalls: the app sees the client go)

        def _waiting(self) -> bool:
            """Between requests or inside a head: no request of its own is being answered."""
            return (self.head_bytes is not None and (self.cycle is None or self.cycle.response_complete)
                    and not self.transport.is_closing())

        def _make_room(self) -> None:
            others = [c for c in self.connections if c is not self and isinstance(c, BoundedProtocol) and c._waiting()]
            if others:
                min(others, key=lambda c: c.waiting_since).transport.close()
            else:
                busy = AdapterError(f"{cap} connections are being answered: retry after 1 s")
                self._refuse(503, busy, code="busy", headers=((b"retry-after", b"1"),))

        def _refuse(self, status: int, error: AdapterError, code: str | None = None,
                    headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
            """Answer ``status`` with the error body and close the connection."""
            body = error_body(code, error.message) if code else error_to_body(error)
            content = json.dumps(body).encode()
            head = [STATUS_LINE[status]]
            for name, value in (*self.server_state.default_headers, *headers):
                head += [name, b": ", value, b"\r\n"]
            head += [b"content-type: application/json\r\n",
                     b"content-length: " + str(len(content)).encode() + b"\r\n",
                     b"connection: close\r\n\r\n", content]
            self.transport.write(b"".join(head))
            self.transport.close()

    return BoundedProtocol
