"""The embedded demo engine in a process of its own, attached over the admin API on loopback.

The dashboard never shares an interpreter (and its GIL and garbage collector) with the cache it
watches, as with a real server: measured in benchmarks/bench_dashboard.py, a dashboard in the
engine's own process cost it about a tenth of its requests; in its own process, nothing
measurable. The child is `radixtop serve` with a one-off token (passed in its environment, never on
a command line), and it dies with its parent. The parent binds the loopback port and listens before
the child exists, and hands the socket over (so no other local user can take the port in between,
nor while a restarted child starts); and before anything sends the token there, the parent checks
that what answers proves a key only the child was given. Its stderr is always read (a full pipe
would hang it), and a child that dies is restarted in its place, on the same socket.
"""

from __future__ import annotations

import hmac
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any


def _listening_socket() -> socket.socket:
    """A socket on a free loopback port, listening already: while it does, no other process can bind
    that port (nor share it: no SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM when the dashboard's process goes, however it goes."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, output: Callable[[], str],
                 target: str | None = None, proof_key: bytes | None = None) -> None:
    """Until the `radixtop serve` child ``proc`` answers /healthz at ``url`` (as ``target``, when
    given: a restarted one answers with its new name); RuntimeError if it exits or stays silent.
    With ``proof_key`` (the child's, in its environment): RuntimeError at once if what answers
    cannot prove it holds that key (another process has the port: nothing may send it a token)."""
    import httpx

    from radixtop.adapters.http.server.edge import CHALLENGE_HEADER, PROOF_HEADER, prove

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"radixtop serve exited at start ({proc.returncode}): {output()}")
        challenge = secrets.token_hex(16)
        try:
            reply = httpx.get(f"{url}/healthz", timeout=1.0, headers={CHALLENGE_HEADER: challenge})
        except httpx.HTTPError:
            reply = None
        if reply is not None and proof_key is not None and not hmac.compare_digest(
                reply.headers.get(PROOF_HEADER, ""), prove(proof_key, challenge)):
            raise RuntimeError(f"something other than the demo engine answers on {url} (it cannot prove "
                               "the key the engine was given): not sending it the token")
        if reply is not None and reply.status_code == 200 and (target is None or reply.json()["target"] == target):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"radixtop serve did not answer on {url} within {timeout:g} s")
        time.sleep(0.05)


class _Tail:
    """The last ``limit`` bytes a child wrote to a pipe, read as it writes them: a pipe nobody
    reads fills (64 KB on Linux), and the child then hangs in its next write to it."""

    def __init__(self, stream: IO[bytes], limit: int = 16_384) -> None:
        self._buf = bytearray()
        self._limit = limit
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(stream,), name="radixtop-demo-log",
                                        daemon=True)
        self._thread.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with stream:
            while chunk := stream.read1(65_536):
                with self._lock:
                    self._buf += chunk
                    del self._buf[:-self._limit]

    def text(self) -> str:
        with self._lock:
            return self._buf.decode("utf-8", "replace")

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class DemoChild:
    """The `radixtop serve` child that runs the embedded demo: its stderr is always read (the last
    of it kept for error messages), and once ``watch`` is called, a child that dies is restarted
    on the same port with the same token, so an attached client carries on against a fresh demo.
    More than ``max_restarts`` deaths within ``RESTART_WINDOW`` seconds and it stays down."""

    RESTART_WINDOW = 60.0

    def __init__(self, cmd: list[str], env: dict[str, str], url: str, token: str, start_timeout: float,
                 max_restarts: int = 3, sock: socket.socket | None = None, proof_key: bytes | None = None) -> None:
        self.cmd, self.env, self.url, self.token = cmd, env, url, token
        self.sock, self.proof_key = sock, proof_key
        """The listening socket every child is handed (``cmd`` names its fd), and the key each proves."""
        self.start_timeout, self.max_restarts = start_timeout, max_restarts
        self.proc: subprocess.Popen | None = None
        self.ended = False
        """True once the child died and will not be restarted."""
        self._tail: _Tail | None = None
        self._deaths: list[float] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        """The last of what the child wrote to stderr (its warnings and errors)."""
        return self._tail.text() if self._tail is not None else ""

    def start(self) -> None:
        """Start the child and wait until it answers; RuntimeError (with its last words) if not."""
        proc = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, pass_fds=() if self.sock is None else (self.sock.fileno(),),
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        with self._lock:
            self.proc, self._tail = proc, _Tail(proc.stderr)
            if self._stopping.is_set():  # stop() ran while this one started: it goes too
                proc.kill()
                proc.wait()
                raise RuntimeError("the demo engine was stopped")
        wait_healthy(self.url, proc, self.start_timeout, self._last_words, proof_key=self.proof_key)

    def _last_words(self) -> str:
        if self.proc is not None and self.proc.poll() is not None and self._tail is not None:
            self._tail.join(2.0)  # it has exited: what it wrote is all in, or nearly
        return self.log_tail().strip()[-500:]

    def watch(self, notify: Callable[[str], Any]) -> None:
        """Restart the child whenever it dies from now on, saying so (and when it gives up) to
        ``notify`` (called from a watcher thread)."""
        threading.Thread(target=self._watch, args=(notify,), name="radixtop-demo-watch", daemon=True).start()

    def _watch(self, notify: Callable[[str], Any]) -> None:
        while not self._stopping.is_set():
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < self.RESTART_WINDOW] + [now]
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            if len(self._deaths) > self.max_restarts:  # (said, then ended: who sees it ended has the reason)
                notify(f"the demo engine exited again ({how}; {len(self._deaths)} times in "
                       f"{self.RESTART_WINDOW:.0f} s): not restarting it. Its last words: "
                       f"{self._last_words()[-200:] or '(none)'}. Quit and run radixtop again.")
                self.ended = True
                return
            try:
                self.start()
            except RuntimeError as exc:
                if self._stopping.is_set():
                    return
                if self.proc.poll() is not None:  # it died again while starting: one more death
                    continue
                notify(f"the demo engine exited ({how}) and could not be restarted: {exc}. "
                       "Quit and run radixtop again.")
                self.ended = True
                return
            notify(f"the demo engine exited ({how}); restarted it: a fresh demo, its cache starts empty")

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            proc = self.proc
        try:
            if proc is None:
                return
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        finally:
            if self.sock is not None:
                self.sock.close()


@contextmanager
def demo_server(name: str, model: str, capacity: int, sessions: int, seed: int, arrival_rate: float,
                read_only: bool = False, start_timeout: float = 120.0, max_restarts: int = 3,
                trace_args: tuple[str, ...] = ()) -> Iterator[DemoChild]:
    """A running `radixtop serve` child with the demo workload, or the trace ``trace_args`` say
    (``--trace PATH --format F ...``), and its ``url`` and ``token``, until the block ends."""
    token, proof_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    sock = _listening_socket()
    port = sock.getsockname()[1]
    cmd = [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--socket-fd", str(sock.fileno()), "--name", name, "--model", model, "--capacity", str(capacity),
           "--sessions", str(sessions), "--seed", str(seed), "--arrival-rate", str(arrival_rate)]
    if read_only:
        cmd.append("--read-only")
    cmd.extend(trace_args)
    env = {**os.environ, "RADIXTOP_TOKEN": token, "RADIXTOP_PROOF_KEY": proof_key}
    child = DemoChild(cmd, env, f"http://127.0.0.1:{port}", token, start_timeout, max_restarts, sock,
                      proof_key.encode())
    try:
        child.start()
        yield child
    finally:
        child.stop()
