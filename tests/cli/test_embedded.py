"""`radixtop` with no arguments: the demo engine runs in a child process (`radixtop serve` on
loopback with a one-off token) and the dashboard attaches to it over the admin API."""

from __future__ import annotations

import subprocess
import time

import pytest

from radixtop.adapters.errors import TargetUnreachable, Unauthorized
from radixtop.adapters.http.client import RadixtopClient
from radixtop.cli.embedded import demo_server


def test_the_demo_engine_runs_in_its_own_process_and_goes_with_the_block():
    with demo_server("embedded demo · tiny", "tiny", 4096, 8, 0, 50.0) as (url, token):
        assert url.startswith("http://127.0.0.1:")
        adapter = RadixtopClient(url, token=token, timeout=10)
        st = adapter.stats()
        assert st.target == "embedded demo · tiny" and st.capacity_tokens == 4096
        deadline = time.monotonic() + 30
        while not adapter.sessions(limit=10).sessions:  # the workload is running over there
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert adapter.evict(1).requested_tokens == 1  # the one-off token works
        with pytest.raises(Unauthorized):
            RadixtopClient(url, token="guess", timeout=5).flush()
        pids = subprocess.run(["pgrep", "-f", "--", f"--port {url.rsplit(':', 1)[1]}"], capture_output=True,
                              text=True).stdout.split()
        assert pids, "the child should be a separate process"
        adapter.close()
    with pytest.raises(TargetUnreachable):
        RadixtopClient(url, timeout=2).stats()


def test_a_demo_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match="exited at start"):
        with demo_server("x", "no-such-model", 4096, 8, 0, 1.0):
            pass
