"""The real fleet engines for the tests, from `.venv-fleet` (made by .ci/setup-fleet: `smg` and
`ai-dynamo-runtime` pin a pydantic older than .venv's, so they get a venv of their own and run as
child processes): SMG, SGLang's model gateway, and Dynamo's standalone KV indexer."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support import REPO
from tests.support.live_server import free_port
from tests.support.server_process import terminate

FLEET_VENV = REPO / ".venv-fleet"


def fleet_executable(name: str) -> Path:
    path = FLEET_VENV / "bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run bash .ci/setup-fleet (these tests must not be skipped)", pytrace=False)
    return path


@contextmanager
def smg(worker_urls: list[str], log: Path, *extra: str) -> Iterator[str]:
    """A real `smg launch` routing to ``worker_urls`` (``extra``: more of its options); yields its
    URL once every worker is registered and healthy."""
    port, metrics_port = free_port(), free_port()
    cmd = [str(fleet_executable("smg")), "launch", "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
           "--worker-urls", *worker_urls, "--policy", "cache_aware", "--load-monitor-interval", "1", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        with httpx.Client(timeout=5, trust_env=False) as client:
            while True:
                assert proc.poll() is None, f"smg exited: {log.read_text()[-2000:]}"
                try:
                    workers = client.get(f"{url}/workers").json()["workers"]
                    if len(workers) == len(worker_urls) and all(w.get("is_healthy") for w in workers):
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                assert time.monotonic() < deadline, f"smg did not register {worker_urls}: {log.read_text()[-2000:]}"
                time.sleep(0.3)
        yield url
    finally:
        terminate(proc)


@contextmanager
def dynamo_indexer(log: Path, block_size: int = 16) -> Iterator[str]:
    """A real `python -m dynamo.indexer` (HTTP-only mode; it binds 0.0.0.0)."""
    port = free_port()
    cmd = [str(fleet_executable("python")), "-m", "dynamo.indexer", "--port", str(port), "--threads", "2",
           "--block-size", str(block_size)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=2, trust_env=False) as client:
            while True:
                assert proc.poll() is None, f"the indexer exited: {log.read_text()[-2000:]}"
                try:
                    if client.get(f"{url}/workers").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"the indexer did not start: {log.read_text()[-2000:]}"
                time.sleep(0.2)
        yield url
    finally:
        terminate(proc)
