"""A real uvicorn server on a free loopback port, in a thread, for tests over HTTP."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_serve(proc, url: str, what: str, timeout: float = 30.0) -> None:
    """Until the ``radixtop serve`` child ``proc`` answers ``url``/healthz; its output if it ends first."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, f"{what} did not come up"
            time.sleep(0.2)


def free_ports(n: int = 1) -> int:
    """A base port such that base .. base+n-1 are all free (a test's ports; DP ranks add their rank)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


@contextmanager
def running_server(app, port: int | None = None, **options) -> Iterator[str]:
    """Serve ``app`` (on ``port``, or a free one) until the block ends; yield its URL. ``options``
    go to ``uvicorn.Config`` (``http=`` the protocol ``serve`` uses, for one)."""
    options = {"log_level": "warning", "access_log": False, "lifespan": "off", "host": "127.0.0.1", **options}
    config = uvicorn.Config(app, port=port or free_port(), **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="radixtop-test-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test API server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
