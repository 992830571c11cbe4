"""The embedded demo engine in a process of its own, attached over the admin API on loopback.

The dashboard never shares an interpreter (and its GIL and garbage collector) with the cache it
watches, as with a real server: measured in benchmarks/bench_dashboard.py, a dashboard in the
engine's own process cost it about a tenth of its requests; in its own process, nothing
measurable. The child is `radixtop serve` on a free loopback port with a one-off token (passed in
its environment, never on a command line), and it dies with its parent.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM when the dashboard's process goes, however it goes."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, output: Callable[[], str],
                 target: str | None = None) -> None:
    """Until the `radixtop serve` child ``proc`` answers /healthz at ``url`` (as ``target``, when
    given: a restarted one answers with its new name); RuntimeError if it exits or stays silent."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"radixtop serve exited at start ({proc.returncode}): {output()}")
        try:
            reply = httpx.get(f"{url}/healthz", timeout=1.0)
            if reply.status_code == 200 and (target is None or reply.json()["target"] == target):
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"radixtop serve did not answer on {url} within {timeout:g} s")
        time.sleep(0.05)


@contextmanager
def demo_server(name: str, model: str, capacity: int, sessions: int, seed: int, arrival_rate: float,
                read_only: bool = False, start_timeout: float = 120.0) -> Iterator[tuple[str, str]]:
    """(url, token) of a `radixtop serve` child running the demo workload, until the block ends."""
    token = secrets.token_urlsafe(24)
    port = _free_port()
    cmd = [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--name", name, "--model", model, "--capacity", str(capacity), "--sessions", str(sessions),
           "--seed", str(seed), "--arrival-rate", str(arrival_rate)]
    if read_only:
        cmd.append("--read-only")
    env = {**os.environ, "RADIXTOP_TOKEN": token}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, start_timeout, lambda: (proc.stderr.read() or "").strip()[-500:])
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
