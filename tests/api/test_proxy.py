"""Proxies: a radixtop client never sends a loopback server's requests (bearer token included)
through a proxy; for other hosts it follows the proxy variables and NO_PROXY as curl reads them
(issue 17, item 9)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import AdapterError, TargetUnreachable
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.sglang.routes import SGLangRoutesAdapter
from tests.support.engines import build_engine
from tests.support.live_server import running_server

TOKEN = "proxy-test-token-0123456789"
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                   "no_proxy", "NO_PROXY")
ELSEWHERE = "http://radixtop-proxy-test.invalid:8765"


@contextmanager
def recording_proxy() -> Iterator[tuple[str, list[bytes]]]:
    """A 'proxy' on loopback that records each request it is sent and answers 502."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.05)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    seen.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.fixture
def proxy_env(monkeypatch):
    """Every proxy variable cleared; the test sets the ones it needs."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_loopback_server_is_never_reached_through_a_proxy(proxy_env):
    """With HTTP_PROXY set, requests to a loopback server went through the proxy, bearer token
    included (httpx trusts the environment)."""
    engine = build_engine()
    try:
        with recording_proxy() as (proxy, seen), running_server(create_app(BundledAdapter(engine), TOKEN,
                                                                            AuditLog(None))) as url:
            for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
                proxy_env.setenv(name, proxy)
            for target in (url, url.replace("127.0.0.1", "localhost")):
                client = RadixtopClient(target, token=TOKEN, timeout=5)
                assert client.stats().capacity_tokens == 256
                assert client.flush().flushed is not None
                client.close()
            assert seen == []
    finally:
        engine.stop()


def test_the_sglang_routes_adapter_never_proxies_loopback_either(proxy_env):
    with recording_proxy() as (proxy, seen), recording_proxy() as (target, reached):
        proxy_env.setenv("http_proxy", proxy)
        adapter = SGLangRoutesAdapter(target, api_key="sglang-key", timeout=2)
        with pytest.raises(AdapterError):
            adapter.stats()  # the stand-in answers 502 to everything
        adapter.release()
    assert seen == [] and reached and b"sglang-key" in reached[0]


def test_other_hosts_follow_the_proxy_variables_and_no_proxy(proxy_env):
    with recording_proxy() as (proxy, seen):
        proxy_env.setenv("http_proxy", proxy)
        client = RadixtopClient(ELSEWHERE, token=TOKEN, timeout=2)
        with pytest.raises(AdapterError):
            client.stats()
        client.close()
        assert len(seen) == 1 and seen[0].startswith(b"GET http://radixtop-proxy-test.invalid:8765/v1/stats ")
        for no_proxy in (".invalid", "RADIXTOP-PROXY-TEST.INVALID", "*", "example.com, radixtop-proxy-test.invalid"):
            proxy_env.setenv("NO_PROXY", no_proxy)
            client = RadixtopClient(ELSEWHERE, token=TOKEN, timeout=2)
            with pytest.raises(TargetUnreachable):  # sent directly: the name does not resolve
                client.stats()
            client.close()
        assert len(seen) == 1


@pytest.mark.parametrize("url, environment, expected", [
    # loopback: never, whatever is set
    ("http://127.0.0.1:8765", {"http_proxy": "http://p:3128"}, None),
    ("http://127.9.9.9:8765", {"all_proxy": "http://p:3128"}, None),
    ("http://localhost:8765", {"http_proxy": "http://p:3128"}, None),
    ("http://api.localhost:8765", {"http_proxy": "http://p:3128"}, None),
    ("http://[::1]:8765", {"http_proxy": "http://p:3128"}, None),
    ("https://127.0.0.1:8765", {"https_proxy": "http://p:3128"}, None),
    # other hosts: the scheme's variable, then all_proxy; curl ignores an upper-case HTTP_PROXY
    ("http://gpu-box:8765", {"http_proxy": "http://p:3128"}, "http://p:3128"),
    ("http://gpu-box:8765", {"HTTP_PROXY": "http://p:3128"}, None),
    ("http://gpu-box:8765", {"ALL_PROXY": "http://all:1"}, "http://all:1"),
    ("https://gpu-box:8765", {"HTTPS_PROXY": "http://s:1", "http_proxy": "http://p:3128"}, "http://s:1"),
    ("https://gpu-box:8765", {"https_proxy": "http://s:1", "HTTPS_PROXY": "http://S:2"}, "http://s:1"),
    ("http://gpu-box:8765", {"http_proxy": "p:3128"}, "http://p:3128"),
    # NO_PROXY as curl: a name or any name below it, a leading dot ignored, '*' alone for all
    ("http://gpu-box.lab.example:1", {"http_proxy": "http://p:1", "no_proxy": "lab.example"}, None),
    ("http://lab.example:1", {"http_proxy": "http://p:1", "no_proxy": ".lab.example"}, None),
    ("http://notlab.example:1", {"http_proxy": "http://p:1", "no_proxy": "lab.example"}, "http://p:1"),
    ("http://GPU-BOX:1", {"http_proxy": "http://p:1", "NO_PROXY": "other, gpu-box"}, None),
    ("http://gpu-box:1", {"http_proxy": "http://p:1", "no_proxy": "*"}, None),
    ("http://gpu-box:1", {"http_proxy": "http://p:1", "no_proxy": "*.lab"}, "http://p:1"),
    ("http://gpu-box:1", {"http_proxy": "http://p:1", "no_proxy": "", "NO_PROXY": "gpu-box"}, None),  # '' is unset
    ("http://gpu-box:1", {"http_proxy": "", "ALL_PROXY": "http://all:1"}, "http://all:1"),
    ("http://10.1.2.3:1", {"http_proxy": "http://p:1", "no_proxy": "10.0.0.0/8"}, None),
    ("http://10.1.2.3:1", {"http_proxy": "http://p:1", "no_proxy": "10.1.2.3"}, None),
    ("http://10.1.2.3:1", {"http_proxy": "http://p:1", "no_proxy": "10.1.2.30, 11.0.0.0/8"}, "http://p:1"),
    ("http://[fd00::5]:1", {"http_proxy": "http://p:1", "no_proxy": "fd00::/8"}, None),
    ("http://gpu-box:1", {}, None),
])
def test_which_proxy_a_url_takes(url, environment, expected):
    from radixtop.adapters.http.proxy import proxy_for

    assert proxy_for(url, environment) == expected
