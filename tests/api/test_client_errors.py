"""RadixtopClient's failures: unreachable, silent, or odd servers give typed errors naming the URL."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import AdapterError, BadRequest, TargetTimeout, TargetUnreachable, Unauthorized
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server
from tests.support.modules import loaded_modules


@contextmanager
def raw_server(reply: bytes | None) -> Iterator[str]:
    """A TCP server that reads each request and answers ``reply`` verbatim, or (None) never
    answers, holding the connection open until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.05)
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            conn.settimeout(1)
            try:
                conn.recv(65536)
                if reply is not None:
                    conn.sendall(reply)
                    conn.close()
            except OSError:
                pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def test_nothing_listening_is_target_unreachable():
    url = f"http://127.0.0.1:{free_port()}"
    client = RadixtopClient(url, timeout=2)
    for call in (client.stats, lambda: client.evict(1), lambda: list(client.export())):
        with pytest.raises(TargetUnreachable, match=url) as info:
            call()
        assert "cannot reach" in info.value.message
    client.release()


def test_unknown_host_is_target_unreachable():
    client = RadixtopClient("http://radixtop-no-such-host.invalid:8765", timeout=2)
    with pytest.raises(TargetUnreachable, match="radixtop-no-such-host.invalid"):
        client.stats()
    client.release()


def test_a_server_that_never_answers_is_target_timeout():
    with raw_server(None) as url:
        client = RadixtopClient(url, token="t", timeout=0.3)
        for call in (client.stats, lambda: client.close_session("a"), lambda: list(client.export())):
            started = time.monotonic()
            with pytest.raises(TargetTimeout, match=url):
                call()
            assert time.monotonic() - started < 10  # a 0.3 s timeout, against a server that never answers
        client.release()


@pytest.mark.parametrize("reply, expected, words", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", AdapterError, "not JSON"),
    (b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 9\r\nConnection: close\r\n\r\n<h1>x</h1", AdapterError,
     "HTTP 502"),
    (b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}', AdapterError, "lacks"),
    (b'HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]', AdapterError, "404"),
    (b'HTTP/1.1 401 Unauthorized\r\nContent-Length: 53\r\nConnection: close\r\n\r\n'
     b'{"error":{"code":"mystery","message":"who are you?"}}', Unauthorized, "who are you"),
    (b"garbage\r\n\r\n", TargetUnreachable, "cannot reach"),
])
def test_odd_replies_are_clear_errors(reply, expected, words):
    with raw_server(reply) as url:
        client = RadixtopClient(url, timeout=2)
        with pytest.raises(expected, match=words):
            client.stats()
        client.release()


def test_wrong_or_missing_token_is_unauthorized_and_bad_input_is_refused_locally():
    engine = build_engine()
    try:
        with running_server(create_app(BundledAdapter(engine), "right", AuditLog(None))) as url:
            for token in (None, "wrong"):
                client = RadixtopClient(url, token=token)
                assert client.stats().capacity_tokens == 256  # reads need no token
                with pytest.raises(Unauthorized):
                    client.flush()
                assert "wrong" not in repr(client) and "right" not in repr(client)
                client.release()
            client = RadixtopClient(url, token="right")
            with pytest.raises(BadRequest, match="shorter prefix"):
                client.match(list(range(100_000)))
            assert client.match(list(range(5_000))).query_tokens == 5_000
            client.release()
    finally:
        engine.stop()
    with pytest.raises(BadRequest, match="not an http"):
        RadixtopClient("localhost:8765")


def test_http_client_loads_neither_torch_textual_fastapi_nor_the_backend():
    mods = loaded_modules("import radixtop.adapters.http.client")
    assert "httpx" in mods
    assert not {"torch", "textual", "fastapi", "starlette", "uvicorn", "radixtop.gpu_backend", "pydantic"} & mods


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["trickle-head", "trickle-body"])
def test_a_server_that_trickles_is_target_timeout_within_the_timeout(mode):
    """httpx's timeout is per socket read: a byte every 0.2 s never trips it. The client's is wall
    clock over the whole call, and the connection is closed when it passes."""
    from tests.support.hostile_http import hostile_server, wait_until

    with hostile_server(mode, every=0.2) as seen:
        client = RadixtopClient(seen.url, timeout=1)
        for call in (client.stats, client.capabilities, lambda: client.plan_close("a")):
            started = time.monotonic()
            with pytest.raises(TargetTimeout, match=f"{seen.url} did not answer within 1 s"):
                call()
            assert time.monotonic() - started < 5
        assert wait_until(lambda: seen.open_now == 0, 10), "a connection past its deadline is still open"
        client.release()


@pytest.mark.timeout(60)
def test_a_reply_over_the_cap_is_refused_and_its_read_stopped():
    from tests.support.hostile_http import hostile_server, wait_until

    with hostile_server("flood") as seen:
        client = RadixtopClient(seen.url, timeout=10, max_reply_bytes=2**20)
        with pytest.raises(AdapterError, match=f"{seen.url} answered more than 1 MiB"):
            client.stats()
        assert wait_until(lambda: seen.open_now == 0, 10)
        assert seen.sent < 32 * 2**20, seen.sent  # stopped near the cap, not read to the end
        client.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["trickle-head", "trickle-body", "flood"])
def test_sglangs_own_routes_are_read_within_the_timeout_and_the_cap(mode):
    """``--sglang-url``'s reads: one read of the totals (two to five requests) ends within the
    timeout, a flood at the cap, and no connection is left reading."""
    from radixtop.adapters.sglang.routes import SGLangRoutesAdapter
    from tests.support.hostile_http import hostile_server, wait_until

    with hostile_server(mode, every=0.2) as seen:
        adapter = SGLangRoutesAdapter(seen.url, timeout=1, max_reply_bytes=2**20)
        started = time.monotonic()
        with pytest.raises(AdapterError, match=seen.url) as info:
            adapter.stats()
        assert time.monotonic() - started < 5
        assert ("answered more than 1 MiB" if mode == "flood" else "did not answer within 1 s") in info.value.message
        assert wait_until(lambda: seen.open_now == 0, 10)
        adapter.release()
