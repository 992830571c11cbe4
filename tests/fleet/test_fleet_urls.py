"""`radixtop fleet --fleet FILE` over real `radixtop serve` workers (the bundled demo engine in
child processes), one that refuses and one that accepts and never answers: the view comes back
within its deadline with a row saying why for each; /v1/fleet aggregates the same; a worker's own
dashboard opens with its token from the tokens file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient

from radixtop.adapters.errors import Unauthorized
from radixtop.adapters.fleet.config import read_fleet_file
from radixtop.adapters.fleet.probe import FleetPoller
from radixtop.adapters.fleet.sources import FleetFileSource, Mapping
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.embedded import demo_server
from radixtop.cli.fleet import open_poller, open_worker
from tests.support.live_server import free_port

LOOPBACK = "http://127.0.0.1"  # the Host a loopback server answers to


@pytest.fixture(scope="module")
def workers():
    with demo_server("fleet a", "tiny", 4096, 8, 1, 40.0) as a, demo_server("fleet b", "tiny", 2048, 8, 2, 40.0) as b:
        for child in (a, b):
            client = RadixtopClient(child.url, timeout=10)
            deadline = time.monotonic() + 60
            while client.stats().prompt_tokens == 0 or not client.stats().open_sessions:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            client.release()
        yield a, b


@pytest.fixture
def hanging():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def fleet_file(tmp_path, *urls: str):
    path = tmp_path / "fleet.txt"
    path.write_text("# workers\n" + "\n".join(urls) + "\n")
    return path


def radixtop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_rows_for_every_worker_within_the_deadline_and_why_for_the_ones_down(workers, hanging, tmp_path):
    a, b = workers
    refused = f"http://127.0.0.1:{free_port()}"
    path = fleet_file(tmp_path, a.url, b.url, refused, hanging)
    started = time.monotonic()
    done = radixtop("fleet", "--fleet", str(path), "--json", "--timeout", "1")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["workers"] == 4 and doc["reachable"] == 2
    assert doc["elapsed_s"] < 2 * 1 + 0.5 + 1.0, doc["elapsed_s"]  # the poll's deadline (2 x timeout + 0.5 s), not more
    assert elapsed < 15
    rows = {r["worker"]: r for r in doc["rows"]}
    for child, capacity in ((a, 4096), (b, 2048)):
        r = rows[child.url]
        assert r["source"] == "radixtop" and r["reachable"] and r["why"] == ""
        assert r["capacity_tokens"] == capacity
        assert r["available_tokens"] + r["evictable_tokens"] + r["unevictable_tokens"] == capacity
        assert r["bytes_per_token"] == 256 and r["capacity_bytes"] == capacity * 256
        assert r["open_sessions"] > 0 and 0 <= r["hit_rate"] <= 1
    assert "Connection refused" in rows[refused]["why"]
    assert "within 1 s" in rows[hanging]["why"]
    for url in (refused, hanging):
        r = rows[url]
        assert not r["reachable"] and r["source"] == "none"
        for name in ("capacity_tokens", "available_tokens", "evictable_tokens", "unevictable_tokens", "open_sessions",
                     "hit_rate", "pressure"):
            assert r[name] is None, name  # unknown, never 0
    order = [r["worker"] for r in doc["rows"]]
    assert set(order[2:]) == {refused, hanging}  # unreachable last
    pressures = [r["pressure"] for r in doc["rows"][:2]]
    assert pressures == sorted(pressures, reverse=True)


def test_the_table_says_unknown_and_why(workers, tmp_path):
    a, _ = workers
    refused = f"http://127.0.0.1:{free_port()}"
    done = radixtop("fleet", "--fleet", str(fleet_file(tmp_path, a.url, refused)), "--timeout", "1",
                    env={"COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 worker rows · 1 reachable" in out
    assert f"{refused}: radixtop: cannot reach {refused}" in out
    line = next(x for x in out.splitlines() if refused.removeprefix("http://") in x and "down" in x)
    assert line.count("?") >= 8 and " 0 " not in line


def test_a_source_that_is_down_exits_3_and_bad_files_exit_2(tmp_path):
    done = radixtop("fleet", "--smg", f"http://127.0.0.1:{free_port()}", "--json", "--timeout", "1")
    assert done.returncode == 3
    assert "cannot reach SMG" in json.loads(done.stdout)["error"]
    bad = tmp_path / "bad.txt"
    bad.write_text("sglang=http://h:1 dp=0\n")
    done = radixtop("fleet", "--fleet", str(bad))
    assert done.returncode == 2 and "bad.txt:1: dp= wants" in done.stderr
    done = radixtop("fleet", "--fleet", str(bad), "--smg", "http://x")
    assert done.returncode == 2 and "give one of --smg" in done.stderr


def test_the_tokens_file_must_be_private_and_its_tokens_are_never_printed(workers, tmp_path):
    a, _ = workers
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{a.url} {a.token}\n")
    tokens.chmod(0o644)
    done = radixtop("fleet", "--fleet", str(fleet_file(tmp_path, a.url)), "--tokens", str(tokens))
    assert done.returncode == 2 and "mode 0644" in done.stderr and "chmod 600" in done.stderr
    assert a.token not in done.stderr + done.stdout
    tokens.chmod(0o600)
    done = radixtop("fleet", "--fleet", str(fleet_file(tmp_path, a.url)), "--tokens", str(tokens), "--json")
    assert done.returncode == 0 and a.token not in done.stdout


def test_a_workers_dashboard_opens_with_its_own_token_and_actions_need_it(workers, tmp_path):
    a, b = workers
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# one worker's token only\n{a.url} {a.token}\n")
    tokens.chmod(0o600)
    poller = open_poller(None, None, fleet_file(tmp_path, a.url, b.url), tokens_file=tokens, timeout=5)
    rows = {r.worker: r for r in poller.poll().rows}
    adapter, label = open_worker(rows[a.url], poller)
    try:
        assert label == a.url
        session = adapter.sessions(limit=1).sessions[0].id
        assert adapter.plan_close(session).session_id == session
        assert adapter.close_session(session).session_id == session  # its token: the action runs
    finally:
        adapter.release()
    adapter, _ = open_worker(rows[b.url], poller)
    try:
        session = adapter.sessions(limit=1).sessions[0].id
        with pytest.raises(Unauthorized):  # no token for b in the file: b refuses actions
            adapter.close_session(session)
    finally:
        adapter.release()


def test_v1_fleet_aggregates_and_is_no_route_without_a_fleet(workers, tmp_path):
    a, b = workers
    refused = f"http://127.0.0.1:{free_port()}"
    path = fleet_file(tmp_path, a.url, b.url, refused)
    poller = FleetPoller(FleetFileSource(path, read_fleet_file(path), Mapping()), timeout=2)
    own = RadixtopClient(a.url, timeout=5)
    try:
        with TestClient(create_app(own, "t" * 20, AuditLog(None), fleet=poller.poll), base_url=LOOPBACK) as http:
            doc = http.get("/v1/fleet").json()
            assert doc["workers"] == 3 and doc["reachable"] == 2
            assert {r["worker"] for r in doc["rows"]} == {a.url, b.url, refused}
            assert "/v1/fleet" in http.get("/openapi.json").json()["paths"]
        with TestClient(create_app(own, "t" * 20, AuditLog(None)), base_url=LOOPBACK) as http:
            reply = http.get("/v1/fleet")  # no fleet, no route (and none in its schema)
            assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
            assert "/v1/fleet" not in http.get("/openapi.json").json()["paths"]
    finally:
        own.release()


@pytest.mark.timeout(60)
def test_v1_fleet_readers_during_a_slow_poll_get_the_last_view_at_once(workers):
    """A poll may take 2 x timeout + 0.5 s: readers that come meanwhile are answered the last
    view at once, none waits behind the poll's lock (nor holds a server thread while it runs)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from radixtop.adapters.fleet.sources import Discovery, Source, WorkerSpec

    release, polls = threading.Event(), []

    class Slow(Source):
        label = "slow"

        def discover(self) -> Discovery:
            polls.append(1)
            if len(polls) > 1:
                release.wait(20)
            return Discovery((WorkerSpec(f"http://10.9.9.{len(polls)}:1", None),))

    poller = FleetPoller(Slow(), timeout=0.2, max_age=0.0)
    own = RadixtopClient(workers[0].url, timeout=5)
    try:
        with TestClient(create_app(own, "t" * 20, AuditLog(None), fleet=poller.poll), base_url=LOOPBACK) as http:
            assert http.get("/v1/fleet").json()["rows"][0]["worker"] == "http://10.9.9.1:1"
            slow = threading.Thread(target=lambda: http.get("/v1/fleet"))
            slow.start()
            while len(polls) < 2:
                time.sleep(0.01)
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                replies = list(pool.map(lambda _: http.get("/v1/fleet"), range(8)))
            assert time.monotonic() - started < 5
            assert [r.status_code for r in replies] == [200] * 8
            assert {r.json()["rows"][0]["worker"] for r in replies} == {"http://10.9.9.1:1"}
            release.set()
            slow.join(10)
            assert http.get("/v1/fleet").json()["rows"][0]["worker"] == "http://10.9.9.3:1"
    finally:
        release.set()
        own.release()


def test_serve_takes_fleet_options_only_together():
    done = radixtop("serve", "--fleet-map", "/nonexistent")
    assert done.returncode == 2 and "go with --fleet" in done.stderr


def test_radixtop_serve_fleet_answers_v1_fleet(workers, tmp_path):
    a, b = workers
    port = free_port()
    path = fleet_file(tmp_path, a.url, b.url)
    proc = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--model", "tiny", "--capacity",
                             "512", "--sessions", "2", "--arrival-rate", "1", "--port", str(port), "--fleet", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "RADIXTOP_TOKEN": "x" * 24})
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/v1/fleet", timeout=10, trust_env=False)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        doc = reply.json()
        assert reply.status_code == 200 and doc["source"] == f"fleet {path}"
        assert {r["worker"] for r in doc["rows"]} == {a.url, b.url} and doc["reachable"] == 2
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


async def test_enter_in_the_fleet_view_opens_that_workers_dashboard(workers, tmp_path):
    """What `radixtop fleet --tui` does on Enter: the row, then that worker's own dashboard."""
    from radixtop.inspector.app import RadixtopApp
    from radixtop.inspector.cache_screen import CacheScreen
    from radixtop.inspector.fleet_view import FleetScreen, FleetTable

    a, b = workers
    poller = open_poller(None, None, fleet_file(tmp_path, a.url, b.url), timeout=5)
    opened = []

    def open_row(row):
        opened.append(row)
        return open_worker(row, poller)

    fleet = RadixtopApp(home=FleetScreen(poller.poll, open_worker=open_row, auto_poll=False))
    try:
        async with fleet.run_test(size=(160, 40)) as pilot:
            for _ in range(300):
                if fleet.home.polls:
                    break
                await pilot.pause(0.02)
            second = fleet.query_one(FleetTable).rows[1]
            await pilot.press("down", "enter")
            for _ in range(300):
                if isinstance(fleet.screen, CacheScreen) and fleet.screen.polls:
                    break
                await pilot.pause(0.02)
            assert opened == [second]
            app = fleet.screen
            assert app.stats is not None and app.stats.target == ("fleet a" if second.worker == a.url else "fleet b")
    finally:
        fleet.home.release()


def test_radixtop_fleet_tui_in_a_terminal_opens_a_worker_and_comes_back(workers, tmp_path):
    """`radixtop fleet --tui` in a pseudo-terminal: the fleet view; Enter: the worker's own
    dashboard; q: the fleet view again; q: the end (exit 0)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    a, _ = workers
    path = fleet_file(tmp_path, a.url, f"http://127.0.0.1:{free_port()}")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command as a user runs it
        os.environ.update(TERM="xterm-256color", COLUMNS="150", LINES="40")
        os.execv(sys.executable, [sys.executable, "-P", "-m", "radixtop.cli.main", "fleet", "--fleet", str(path),
                                  "--tui", "--timeout", "1"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))

    def screen_until(*words: str, timeout: float = 30.0) -> bytes:
        seen, deadline = b"", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break
            if all(w.encode() in seen for w in words):
                return seen
        raise AssertionError(f"never saw {words}; the screen had {seen[-2000:]!r}")

    try:
        screen_until("2 worker rows", "1 reachable")
        os.write(fd, b"\r")  # the cursor is on the reachable worker (it sorts first)
        screen_until("fleet a")  # its dashboard's header names it
        os.write(fd, b"q")
        screen_until("2 worker rows")
        os.write(fd, b"q")
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "radixtop fleet --tui did not end on q"
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
