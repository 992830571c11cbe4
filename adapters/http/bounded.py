"""Every outbound read radixtop makes (a radixtop server, SGLang's own routes, a fleet's gateway,
indexer or workers) within one wall-clock deadline and a cap on the bytes it reads.

httpx's timeout is per socket operation: a server that sends a byte a second never times out
there. Here every socket operation of a client made by ``bounded_client`` waits at most what is
left of the thread's deadline (``deadline``: connect through the last byte, nested blocks keep
the earlier one), and ``exchange`` stops reading a reply past its cap. Either way the connection is
closed, so nothing keeps reading after its deadline; the failure is one line naming the target.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

from radixtop.adapters.errors import BadRequest, TargetTimeout, TargetUnreachable
from radixtop.adapters.http.proxy import transport_for
from radixtop.adapters.http.wire import WireError

MAX_REPLY_BYTES = 64 * 2**20
"""The most a reply of radixtop's admin API may take (a page of 1000 nodes is ~0.5 MiB)."""


class ReplyTooLarge(WireError):
    """A reply over the bytes its read allows: the read was stopped and the connection closed."""


_thread = threading.local()


@contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Every exchange this thread makes inside the block ends within ``seconds`` of now, or by an
    enclosing block's deadline where that comes first. Yields the monotonic time it ends at."""
    outer: float | None = getattr(_thread, "deadline", None)
    at = time.monotonic() + max(seconds, 0.0)
    if outer is not None:
        at = min(at, outer)
    _thread.deadline = at
    try:
        yield at
    finally:
        _thread.deadline = outer


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """A socket operation's timeout: httpx's own, cut to what is left of the thread's deadline."""
    at: float | None = getattr(_thread, "deadline", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the exchange's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A connection whose every read, write and handshake ends by the thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's own sockets, each wrapped in ``_Stream``."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_client(url: str, timeout: float, headers: dict[str, str] | None = None) -> httpx.Client:
    """An httpx client of ``url``'s server whose sockets keep the thread's ``deadline``; direct, or
    through ``proxy.proxy_for(url)``. It asks for uncompressed replies (the cap counts what is kept)."""
    transport = transport_for(url)
    # httpx builds httpcore's pool itself and takes no network backend: the pool's is replaced
    # before any connection is made (a test proves the deadline holds, so an httpx that renames it fails)
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):
        raise RuntimeError("this httpx keeps no network backend on its pool: radixtop cannot bound its reads")
    pool._network_backend = _Backend()
    return httpx.Client(base_url=url, timeout=timeout, transport=transport,
                        headers={"Accept-Encoding": "identity", **(headers or {})})


def exchange(client: httpx.Client, request: httpx.Request, *, timeout: float, what: str,
             max_bytes: int = MAX_REPLY_BYTES) -> httpx.Response:
    """Send ``request`` and read its reply whole, within ``timeout`` seconds of wall clock (or the
    thread's earlier deadline) and ``max_bytes`` of body. TargetTimeout, TargetUnreachable or
    ReplyTooLarge name ``what``; the connection of a read cut short is closed."""
    started = time.monotonic()
    with deadline(timeout) as at:
        try:
            response = client.send(request, stream=True)
            try:
                body = _read_capped(response, max_bytes, what)
            finally:
                response.close()
        except httpx.TimeoutException:
            given = at - started  # less than ``timeout`` where an enclosing deadline came first
            seconds = timeout if given > timeout - 0.01 else round(max(given, 0.0), 1)
            raise TargetTimeout(f"{what} did not answer within {seconds:g} s") from None
        except httpx.InvalidURL as exc:
            raise BadRequest(f"{what}: {exc}") from None
        except (httpx.TransportError, httpx.DecodingError) as exc:
            raise TargetUnreachable(f"cannot reach {what}: {str(exc) or type(exc).__name__}") from None
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=body, request=request,
                          extensions={"reason_phrase": response.extensions.get("reason_phrase", b""),
                                      "http_version": response.extensions.get("http_version", b"HTTP/1.1")})


def _read_capped(response: httpx.Response, max_bytes: int, what: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ReplyTooLarge(f"{what} answered {_size(int(declared))}, over the {_size(max_bytes)} radixtop reads "
                            "from it: the read was stopped")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise ReplyTooLarge(f"{what} answered more than {_size(max_bytes)}, the most radixtop reads from it: "
                                "the read was stopped")
    return bytes(body)


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"
