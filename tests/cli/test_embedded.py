"""`radixtop` with no arguments: the demo engine runs in a child process (`radixtop serve` on
loopback with a one-off token) and the dashboard attaches to it over the admin API."""

from __future__ import annotations

import http.server
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from radixtop.adapters.errors import AdapterError, TargetUnreachable, Unauthorized
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server.logs import RepeatLimit
from radixtop.cli.embedded import demo_server, wait_healthy


def test_the_demo_engine_runs_in_its_own_process_and_goes_with_the_block():
    with demo_server("embedded demo · tiny", "tiny", 4096, 8, 0, 50.0) as child:
        url, token = child.url, child.token
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
        adapter.release()
    with pytest.raises(TargetUnreachable):
        RadixtopClient(url, timeout=2).stats()


def test_a_demo_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match="exited at start"):
        with demo_server("x", "no-such-model", 4096, 8, 0, 1.0):
            pass


def _malformed(url: str, count: int) -> None:
    """``count`` requests that are not HTTP: the server logs a warning for each one."""
    host, port = url.removeprefix("http://").split(":")
    for _ in range(count):
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            conn.recv(4096)


def test_a_flood_of_logged_warnings_never_stops_the_demo():
    """Each malformed request makes the child log a warning; nobody reading its stderr once it had
    started, the pipe filled and the child hung in its next write (/healthz timed out for good)."""
    with demo_server("embedded demo · tiny", "tiny", 4096, 8, 0, 5.0) as child:
        _malformed(child.url, 3000)  # ~100 KB of warnings: more than a pipe holds
        assert httpx.get(f"{child.url}/healthz", timeout=5).status_code == 200
        assert "Invalid HTTP request" in child.log_tail()  # kept, the last of it
        # and said a few times a minute, not 3000 times (the count of the rest comes with the
        # first one of the next minute: test_repeated_warnings_are_limited_per_message)
        assert 1 <= child.log_tail().count("Invalid HTTP request") <= 5


def test_repeated_warnings_are_limited_per_message():
    records = []
    limit = RepeatLimit(burst=3, window=60.0, clock=lambda: now[0])
    now = [0.0]
    logger = logging.getLogger("radixtop.test.repeats")
    logger.propagate = False
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    logger.addFilter(limit)
    try:
        for i in range(10):
            logger.warning("request %s not started: %s", i, "no room")
        logger.warning("another message")
        assert [r.getMessage() for r in records] == [
            "request 0 not started: no room", "request 1 not started: no room",
            "request 2 not started: no room", "another message"]
        now[0] = 61.0
        logger.warning("request %s not started: %s", 10, "no room")
        assert records[-1].getMessage() == ("request 10 not started: no room "
                                            "(7 similar messages suppressed in the last 61 s)")
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(limit)


def test_a_killed_demo_is_restarted_and_says_so():
    notes = []
    with demo_server("embedded demo · tiny", "tiny", 4096, 8, 0, 5.0) as child:
        child.watch(notes.append)
        client = RadixtopClient(child.url, token=child.token, timeout=5)
        first = child.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # the same URL and token answer again, from a new child
            try:
                client.stats()
                break
            except AdapterError:
                assert time.monotonic() < deadline, notes
                time.sleep(0.2)
        assert child.pid != first
        while not notes:  # the watcher says so once it has seen the new child answer too
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert any("restarted" in note and "signal 9" in note for note in notes), notes
        client.release()
    assert not _alive(first)  # reaped, not a zombie


def test_a_demo_that_keeps_dying_is_not_restarted_for_ever():
    notes = []
    with demo_server("embedded demo · tiny", "tiny", 4096, 8, 0, 5.0, max_restarts=1) as child:
        child.watch(notes.append)
        for _ in range(2):
            pid = child.pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while child.pid == pid and not child.ended:
                assert time.monotonic() < deadline, notes
                time.sleep(0.1)
            if not child.ended:
                wait_healthy(child.url, child.proc, 60, child.log_tail)
        deadline = time.monotonic() + 10
        while not child.ended:
            assert time.monotonic() < deadline, notes
            time.sleep(0.1)
        assert "not restarting" in notes[-1] and "radixtop" in notes[-1], notes


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class Squatter:
    """Another local user's process: it watches /proc for a `radixtop ... serve --port N` and binds N
    at once (the child binds it only seconds later, once imported), then answers as a radixtop
    server would and keeps every bearer token it is sent. It also tries each port it is told of."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.bound: list[int] = []
        self.tokens: list[str] = []
        self._stop = threading.Event()
        self._servers: list[http.server.ThreadingHTTPServer] = []
        self._thread = threading.Thread(target=self._watch, name="squatter", daemon=True)

    def __enter__(self) -> Squatter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    stat = (cmdline.parent / "stat").read_bytes()
                    if int(stat.rpartition(b")")[2].split()[1]) != os.getpid():
                        continue  # (only this test's children: other tests' servers are left alone)
                    args = cmdline.read_bytes().split(b"\0")
                except (OSError, ValueError, IndexError):
                    continue
                if b"radixtop.cli.main" in args and b"serve" in args and b"--port" in args:
                    port = args[args.index(b"--port") + 1]
                    if port.isdigit():
                        self.take(int(port))
            time.sleep(0.002)

    def take(self, port: int) -> None:
        if port in self.seen:
            return
        self.seen.add(port)
        tokens = self.tokens

        class Impostor(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.headers.get("Authorization"):
                    tokens.append(self.headers["Authorization"])
                body = json.dumps({"status": "ok", "target": "embedded demo · tiny", "version": 0,
                                   "read_only": False}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args) -> None:
                pass

        try:  # as a squatter would: SO_REUSEADDR, to share a port nobody listens on yet
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Impostor, bind_and_activate=False)
            server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.server_bind()
            server.server_activate()
        except OSError:
            return
        self.bound.append(port)
        self._servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()


def test_a_local_squatter_gets_neither_the_demos_port_nor_its_token():
    """Another local user read the child's `--port N` in /proc and bound it first: the dashboard
    sent it the bearer token on every poll (56 requests in 30 s), and would have sent the
    operator's actions. Now the port is bound and listening before the child exists, the child
    gets the socket itself, and the parent checks who answers before any token goes out; a
    restarted child gets the same socket (the port is never free)."""
    notes = []
    with Squatter() as squatter:
        with demo_server("embedded demo · tiny", "tiny", 4096, 8, 0, 5.0) as child:
            port = int(child.url.rsplit(":", 1)[1])
            squatter.take(port)  # whether or not it saw it in /proc
            client = RadixtopClient(child.url, token=child.token, timeout=10)
            assert client.stats().capacity_tokens == 4096  # the real engine answers
            assert client.evict(1).requested_tokens == 1
            child.watch(notes.append)
            first = child.pid
            os.kill(first, signal.SIGKILL)
            squatter.seen.discard(port)
            deadline = time.monotonic() + 60
            while child.pid == first or not notes:  # while it restarts, the squatter tries again
                squatter.take(port)
                squatter.seen.discard(port)
                assert time.monotonic() < deadline, notes
                time.sleep(0.01)
            assert "restarted" in notes[-1], notes
            assert client.stats().capacity_tokens == 4096
            client.release()
        assert port in squatter.seen or squatter.bound == []
    assert squatter.bound == [] and squatter.tokens == [], (squatter.bound, len(squatter.tokens))


def test_the_parent_sends_no_token_to_what_cannot_prove_it_is_the_child(tmp_path):
    """Whatever holds the port answers /healthz 200 like radixtop: without the child's proof, the
    parent refuses it at once (before it or anything else sends the token)."""
    from radixtop.cli.embedded import _listening_socket

    with Squatter() as squatter:
        sock = _listening_socket()
        port = sock.getsockname()[1]
        sock.close()
        squatter.take(port)
        assert squatter.bound == [port]
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            with pytest.raises(RuntimeError, match="something other than the demo engine answers"):
                wait_healthy(f"http://127.0.0.1:{port}", sleeper, 30, lambda: "", proof_key=b"the child's key")
        finally:
            sleeper.kill()
            sleeper.wait()
        assert squatter.tokens == []


@pytest.mark.parametrize("given", ["not a socket", "a socket on another host"])
def test_serve_refuses_a_socket_fd_that_is_not_a_loopback_listener_in_one_line(given):
    """`serve --socket-fd N` (how the demo's child gets its socket) names what is wrong with N."""
    import sys

    from radixtop.cli.errors import EXIT_USAGE

    with socket.socket() as other:
        if given == "not a socket":
            fd, keep = os.open(os.devnull, os.O_RDONLY), ()
        else:
            other.bind(("0.0.0.0", 0))
            fd, keep = other.fileno(), (other,)
        try:
            result = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--host", "127.0.0.1",
                                     "--socket-fd", str(fd), "--model", "tiny", "--capacity", "512", "--device", "cpu"],
                                    pass_fds=(fd,), capture_output=True, text=True, timeout=120,
                                    env={**os.environ, "RADIXTOP_TOKEN": "t" * 24})
        finally:
            if not keep:
                os.close(fd)
    assert result.returncode == EXIT_USAGE, result
    assert result.stderr.count("\n") == 1 and f"--socket-fd {fd}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
