"""A fleet source or worker that trickles, floods or never ends costs its own row or the view's
error within the poll's deadline: `radixtop fleet` returns and exits, `serve --fleet`'s other
routes keep answering while /v1/fleet readers wait, no read runs past its deadline (no thread,
no connection left behind), and a huge reply is stopped at its cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.fleet.config import read_fleet_file
from radixtop.adapters.fleet.probe import FleetPoller, poll_fleet
from radixtop.adapters.fleet.sources import FleetFileSource, Mapping, SmgSource
from radixtop.adapters.fleet.watch import watch_fleet
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from tests.support.engines import build_engine
from tests.support.hostile_http import hostile_server, wait_until
from tests.support.live_server import running_server


def radixtop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


@pytest.mark.timeout(120)
def test_radixtop_fleet_over_a_trickling_gateway_returns_within_its_deadline():
    with hostile_server("trickle-head", every=0.3) as gateway:
        started = time.monotonic()
        done = radixtop("fleet", "--smg", gateway.url, "--timeout", "2", "--json")
        assert time.monotonic() - started < 15
    assert done.returncode == 3, done.stderr
    assert f"SMG at {gateway.url}/workers did not answer within 2 s" in json.loads(done.stdout)["error"]


@pytest.mark.timeout(180)
def test_serve_fleet_over_a_trickling_gateway_keeps_its_other_routes_answering():
    """48 tokenless /v1/fleet readers while the gateway trickles: /v1/stats, /v1/capabilities and
    /metrics answer at once (no reader holds a server thread while a poll runs), and /v1/fleet
    answers the gateway's error once the first poll's deadline has passed."""
    engine = build_engine()
    try:
        with hostile_server("trickle-head", every=0.3) as gateway:
            fleet = watch_fleet(f"smg={gateway.url}", None, None)
            with running_server(create_app(BundledAdapter(engine), "t" * 24, AuditLog(None), fleet=fleet)) as url:
                with ThreadPoolExecutor(56) as pool:
                    readers = [pool.submit(httpx.get, f"{url}/v1/fleet", timeout=60, trust_env=False)
                               for _ in range(48)]
                    time.sleep(0.5)  # the readers are in
                    for path in ("/v1/stats", "/v1/capabilities", "/metrics", "/healthz"):
                        reply = httpx.get(f"{url}{path}", timeout=10, trust_env=False)
                        assert reply.status_code == 200, (path, reply.text[:200])
                    replies = [r.result(timeout=30) for r in readers]
                assert {r.status_code for r in replies} == {200}
                doc = replies[0].json()
                assert doc["workers"] == 0 and "did not answer within 2 s" in doc["error"]
    finally:
        engine.stop()


@pytest.mark.timeout(120)
def test_radixtop_fleet_json_with_a_trickling_worker_prints_and_exits(tmp_path):
    """A worker that answers a byte at a time: its row says so and the command ends (before,
    the read went on past the deadline and the process waited for it at exit)."""
    with hostile_server("trickle-body", every=0.3) as worker:
        path = tmp_path / "fleet.txt"
        path.write_text(f"{worker.url}\n")
        started = time.monotonic()
        done = radixtop("fleet", "--fleet", str(path), "--json", "--timeout", "1")
        assert time.monotonic() - started < 15
        assert wait_until(lambda: worker.open_now == 0, 5), "the worker's connection is still open"
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)["rows"][0]
    assert not row["reachable"] and "did not answer within 1 s" in row["why"]


@pytest.mark.timeout(120)
def test_polls_of_a_trickling_worker_leave_no_thread_or_connection_behind(tmp_path):
    with hostile_server("trickle-body", every=0.3) as worker:
        path = tmp_path / "fleet.txt"
        path.write_text(f"{worker.url}\n")
        poller = FleetPoller(FleetFileSource(path, read_fleet_file(path), Mapping()), timeout=0.5, max_age=0.0)
        poller.poll()  # the first poll: whatever is made once (a pool's first sockets, imports)
        before, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
        for _ in range(6):
            view = poller.poll()
            assert "did not answer within 0.5 s" in view.rows[0].why
        assert wait_until(lambda: threading.active_count() <= before, 5), threading.enumerate()
        assert wait_until(lambda: len(os.listdir("/proc/self/fd")) <= fds, 5), "a file descriptor per poll"
        assert wait_until(lambda: worker.open_now == 0, 5), worker.open_now
        assert worker.connections == 7


@pytest.mark.timeout(120)
def test_a_worker_that_floods_costs_its_row_and_its_read_is_stopped(tmp_path):
    with hostile_server("flood") as worker:
        path = tmp_path / "fleet.txt"
        path.write_text(f"{worker.url}\n")
        view = poll_fleet(FleetFileSource(path, read_fleet_file(path), Mapping()), timeout=5)
        assert wait_until(lambda: worker.open_now == 0, 5)
    row = view.rows[0]
    assert not row.reachable and "answered more than 1 MiB" in row.why
    assert worker.sent < 16 * 2**20, worker.sent


@pytest.mark.timeout(60)
def test_a_flooding_gateway_is_the_views_error_not_its_memory():
    with hostile_server("flood") as gateway:
        view = poll_fleet(SmgSource(gateway.url, Mapping({}, None), timeout=5), timeout=1)
    assert view.rows == () and "answered more than 16 MiB" in view.error
