"""A pool that cannot be made, or an unknown key, is one line and exit 2; a huge pool on meta
costs nothing: what the commands refuse before they start anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support import REPO
from tests.support.live_server import free_port


def test_an_unknown_keymap_id_is_one_line_naming_the_valid_ids():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "tui", "--keymap", "app.paws=P"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no binding 'app.paws'" in lines[0] and "app.pause" in lines[0]
    assert "tree.toggle" in lines[0] and "sessions.sort" in lines[0]


# ----- a pool that cannot be made is one line and exit 2; a huge one on meta costs nothing -----

NO_CUDA = not __import__("torch").cuda.is_available()
BAD_POOLS = [
    (["serve", "--device", "gpu"], "unknown device 'gpu'; use auto, cpu, cuda or meta"),
    (["serve", "--device", "cpu", "--capacity", "100000000"], "GiB on cpu: more than the"),
    (["serve", "--device", "cpu", "--capacity", str(10**12)], "GiB on cpu: more than the"),
    (["serve", "--device", "meta", "--capacity", str(10**18)], "bytes do not fit in 64 bits"),
    (["serve", "--device", "meta", "--capacity", "1000000000", "--page-size", "1000000000"],
     "page_size 1000000000 must be 1 to 65,536"),
    (["demo", "--device", "cpu", "--capacity", str(10**12)], "GiB on cpu: more than the"),
    (["demo", "--device", "meta", "--capacity", str(10**18)], "bytes do not fit in 64 bits"),
]
if NO_CUDA:  # with a GPU these would start (the capacity case above covers refusals there)
    BAD_POOLS += [(["serve", "--device", "cuda"], "device cuda: CUDA is not available"),
                  (["demo", "--device", "cuda"], "device cuda: CUDA is not available")]


@pytest.mark.parametrize(("args", "message"), BAD_POOLS, ids=[" ".join(a) for a, _ in BAD_POOLS])
def test_a_pool_that_cannot_be_made_is_one_line_and_exit_2(args, message):
    with socket.socket() as taken:  # a pool wrongly accepted ends at the bind, not in a server
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = ["--port", str(taken.getsockname()[1])] if args[0] == "serve" else ["--duration", "1"]
        done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args, *port],
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, "RADIXTOP_TOKEN": "t" * 16})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("radixtop: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


def test_serve_on_meta_with_a_10_to_the_12_token_pool_starts_small():
    """The allocator keeps free ranges, not one entry a slot: 10**12 tokens on meta cost nothing
    until used (before: a 7.3 TiB array, and a traceback)."""
    port = free_port()
    child = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--device", "meta",
                              "--capacity", str(10**12), "--port", str(port)], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "RADIXTOP_TOKEN": "t" * 16})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert child.poll() is None, child.stderr.read()
            try:
                stats = httpx.get(f"http://127.0.0.1:{port}/v1/stats", timeout=5).json()
                if stats["capacity_tokens"]:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve did not answer within 60 s"
                time.sleep(0.2)
        assert stats["capacity_tokens"] == 10**12
        status = Path(f"/proc/{child.pid}/status").read_text()
        peak_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
        assert peak_kib < 1.5 * 2**20, f"peak RSS {peak_kib / 2**20:.2f} GiB"
    finally:
        child.terminate()
        child.communicate(timeout=30)
