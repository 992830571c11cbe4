"""The dashboards over a target that trickles (a byte at a time, which never trips a per-read
timeout): each says the target did not answer, and q ends the process at once, in a real
pseudo-terminal as a user runs it."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time

import pytest

from tests.support.hostile_http import hostile_server


def run_in_terminal(*args: str, expect: tuple[str, ...], seconds: float = 30.0) -> tuple[bytes, float]:
    """Run ``radixtop ARGS`` in a pty; wait for every word of ``expect`` on screen, press q, and
    return the screen and the seconds from q to the process's exit (AssertionError if it does
    not end within 15 s)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(TERM="xterm-256color", COLUMNS="150", LINES="40")
        os.execv(sys.executable, [sys.executable, "-P", "-m", "radixtop.cli.main", *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    seen = b""

    def read_some(wait: float) -> None:
        nonlocal seen
        if select.select([fd], [], [], wait)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                pass

    try:
        deadline = time.monotonic() + seconds
        while not all(w.encode() in seen for w in expect):
            assert time.monotonic() < deadline, f"never saw {expect}; the screen had {seen[-3000:]!r}"
            read_some(0.1)
        os.write(fd, b"q")
        pressed = time.monotonic()
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() - pressed < 15, "q did not end it within 15 s"
            read_some(0.1)
        assert os.waitstatus_to_exitcode(done[1]) == 0
        return seen, time.monotonic() - pressed
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


@pytest.mark.timeout(120)
def test_the_dashboard_over_a_trickling_server_says_so_and_quits_on_q():
    with hostile_server("trickle-body", every=0.3) as seen:
        run_in_terminal("tui", "--url", seen.url, "--timeout", "2", expect=("did not answer",))


@pytest.mark.timeout(120)
def test_the_fleet_view_over_a_trickling_worker_quits_on_q(tmp_path):
    with hostile_server("trickle-body", every=0.3) as worker:
        path = tmp_path / "fleet.txt"
        path.write_text(f"{worker.url}\n")
        run_in_terminal("fleet", "--fleet", str(path), "--tui", "--timeout", "1",
                        expect=("1 worker rows", "answer within"))
