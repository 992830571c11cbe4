"""Faults under every face: the target killed and restarted, stopped, its engine thread dying,
and sessions closed while their requests run.

A real ``radixtop serve`` child (demo workload, tiny geometry, a fixed loopback port, the token in
its environment) is SIGKILLed and restarted on the same port, and SIGSTOPped and continued, under
the dashboard (Pilot), the commands (real ``python -m cli.main`` processes) and the HTTP client.
An in-process engine's owner thread is killed by an injected BaseException under the live API.
Every fault is counted when injected and again when survived; the counts are printed as one JSON
line when the module ends, and written to the file $RADIXTOP_FAULTS_REPORT names, if set.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import httpx
import pytest
from textual.worker import Worker, WorkerState

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.embedded import _die_with_parent, wait_healthy
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.workload import ChatWorkload, WorkloadConfig
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.cache_screen import CacheScreen
from radixtop.inspector.modals import AskScreen, ConfirmScreen
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree
from tests.support import REPO  # noqa: E402
from tests.support.engines import build_engine, check_invariants
from tests.support.live_server import free_port, running_server

CAPACITY = 65536
"""Demo pool: 8 open sessions of at most 2048 tokens each, every session closed at its end
(--never-closed 0), never fill it, so the workload itself never evicts: evictions are ours."""
WAIT = 60.0
"""Deadline of every bounded wait (generous: these machines are noisy)."""

INJECTED: Counter[str] = Counter()
SURVIVED: Counter[str] = Counter()


@contextmanager
def fault(kind: str) -> Iterator[None]:
    """Count a fault of ``kind`` as injected now, and as survived if the block ends without error."""
    INJECTED[kind] += 1
    yield
    SURVIVED[kind] += 1


@pytest.fixture(scope="module", autouse=True)
def fault_report(request):
    """At the end of the module: one JSON line of faults injected and survived, per kind."""
    yield
    line = json.dumps({"faults": {kind: {"injected": INJECTED[kind], "survived": SURVIVED[kind]}
                                  for kind in sorted(INJECTED)},
                       "injected": sum(INJECTED.values()), "survived": sum(SURVIVED.values())},
                      separators=(",", ":"))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else nullcontext():
        print(f"\n{line}", flush=True)
    if os.environ.get("RADIXTOP_FAULTS_REPORT"):
        Path(os.environ["RADIXTOP_FAULTS_REPORT"]).write_text(line + "\n", encoding="utf-8")


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.02)


async def until(pilot, predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            app = pilot.app
            raise AssertionError(f"{what}: not within {timeout:g} s (screen {app.screen!r}, toasts "
                                 f"{getattr(app, 'toasts', None)}, banner {app.home.down!r})")
        await pilot.pause(0.05)


# ----- a real `radixtop serve` child -----


class Served:
    """``radixtop serve`` with the demo workload on one fixed loopback port, killed, stopped and
    restarted at will. Each start is a new incarnation: its name and workload seed say which."""

    def __init__(self, port: int, logs: Path):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.token = secrets.token_urlsafe(16)
        self.logs = logs
        self.incarnation = 0
        self.proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"faults demo #{self.incarnation}"

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the next incarnation. From the main thread: its death signal follows the thread
        that forked it (PR_SET_PDEATHSIG), and a worker thread ends long before the test."""
        assert threading.current_thread() is threading.main_thread()
        self.incarnation += 1
        cmd = [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--name", self.name, "--model", "tiny", "--capacity", str(CAPACITY), "--device", "cpu",
               "--sessions", "8", "--seed", str(self.incarnation), "--arrival-rate", "20", "--never-closed", "0",
               "--random-ids"]  # (each seed its own prompts: the incarnations tell apart)
        self.log = self.logs / f"serve-{self.incarnation}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "RADIXTOP_TOKEN": self.token},
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)

    def wait_ready(self) -> None:
        """Until /healthz answers as this incarnation (any thread)."""
        wait_healthy(self.url, self.proc, WAIT, lambda: self.log.read_text()[-2000:], target=self.name)

    def ensure_up(self) -> None:
        """Answering again, whatever a test before left behind (killed, or stopped)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.start()
        self.signal(signal.SIGCONT)
        self.wait_ready()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye; the kernel resets every connection."""
        self.signal(signal.SIGKILL)
        self.proc.wait(WAIT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGKILL)  # a stopped process dies of SIGKILL too
            self.proc.wait(WAIT)


@pytest.fixture(scope="module")
def serve_child(tmp_path_factory) -> Iterator[Served]:
    child = Served(free_port(), tmp_path_factory.mktemp("serve"))
    try:
        child.start()
        yield child
    finally:
        child.close()


@pytest.fixture
def served(serve_child: Served) -> Served:
    serve_child.ensure_up()
    return serve_child


def radixtop(url: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    """A `radixtop` command in a process of its own."""
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], cwd=REPO, env=_cli_env(url, token),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT)


def _cli_env(url: str, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXTOP_")}
    env["RADIXTOP_URL"] = url
    if token is not None:
        env["RADIXTOP_TOKEN"] = token
    return env


def assert_one_line(result: subprocess.CompletedProcess, code: int, *words: str) -> None:
    """Exit ``code``, one line on stderr naming ``words``, no traceback anywhere."""
    assert result.returncode == code, (result.returncode, result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("radixtop: ") and result.stderr.count("\n") == 1, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def connected(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds an established TCP connection to loopback ``port``."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return False
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].split(":")[1], 16) == port and fields[9] in inodes:
                return True
    return False


# ----- the dashboard, watched -----


class WatchedApp(RadixtopApp):
    """The dashboard, recording every failed poll, every toast (they expire on screen) and every
    worker that ended in an error."""

    def __init__(self, adapter, **kwargs):
        super().__init__(home=WatchedScreen(adapter, **kwargs))
        self.outages: list[AdapterError] = []
        self.toasts: list[str] = []
        self.worker_errors: list[BaseException | None] = []

    def notify(self, message: str, *args, **kwargs) -> None:
        self.toasts.append(message)
        super().notify(message, *args, **kwargs)


class WatchedScreen(CacheScreen):
    """The cache's screen, telling its WatchedApp every failed poll and every worker (they run on
    the screen) that ended in an error."""

    def _show_down(self, exc: AdapterError) -> None:
        self.app.outages.append(exc)
        super()._show_down(exc)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.app.worker_errors.append(event.worker.error)


def screen_text(app: RadixtopApp) -> str:
    """The screen as a user reads it, wrapped lines joined (so a wrapped phrase still matches)."""
    lines = (strip.text.strip() for strip in app.screen._compositor.render_strips())
    return " ".join(" ".join(lines).split())


def banner(app: RadixtopApp) -> str:
    widget = app.query_one("#banner")
    return str(widget.content) if widget.display else ""


def assert_nothing_escaped(app: WatchedApp) -> None:
    """No worker died of an error, nothing reached Textual's error handler, no traceback shown."""
    assert app.worker_errors == [] and app._exception is None and app.return_code in (None, 0)
    if app.is_running:
        assert "Traceback" not in screen_text(app)


async def evict_by_keys(pilot, app: RadixtopApp, tokens: int) -> None:
    """E, the count, enter, then Evict on the confirmation: the way a user asks for it."""
    await pilot.press("E")
    await until(pilot, lambda: isinstance(app.screen, AskScreen), "the evict prompt")
    await pilot.press(*str(tokens), "enter")
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the evict confirmation")
    await pilot.click("#confirm")
    await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the confirmation to close")


def top_level_prefixes(app: RadixtopApp) -> set[tuple[int, ...]]:
    return {r.node.first_tokens[:8] for r in app.query_one(CacheTree).rows if r.depth == 0 and r.node}


def prompt_prefixes(seed: int) -> set[tuple[int, ...]]:
    """The first tokens of the system prompts of the demo workload with ``seed`` (what `serve`
    builds with these options): every root child of that incarnation starts with one of them."""
    return {tuple(p[:8]) for p in ChatWorkload(WorkloadConfig(sessions=8, seed=seed)).system_prompts}


# ----- 1. killed and restarted on the same port -----


async def test_dashboard_rides_out_the_server_killed_and_restarted(served):
    adapter = RadixtopClient(served.url, token=served.token, timeout=2.0)
    app = WatchedApp(adapter, interval=0.25)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.home.stats is not None and app.home.stats.evictable_tokens >= 1
                        and app.query_one(SessionsTable).rows and app.query_one(CacheTree).rows,
                        "the demo workload on screen")
            await pilot.press("enter")  # expand the largest subtree: its id means nothing after a restart
            await evict_by_keys(pilot, app, 1)
            await until(pilot, lambda: app.home.stats.evicted_tokens >= 1, "our eviction in the header")
            old_name, old_prompts = served.name, prompt_prefixes(served.incarnation)
            assert top_level_prefixes(app) <= old_prompts

            with fault("server_sigkill"):
                served.kill()
                await until(pilot, lambda: app.home.down is not None, "the outage banner")
                last = app.home.stats
                assert f"cannot reach {served.url}" in banner(app) and "reconnecting" in banner(app)
                # What the user reads: the banner is painted on the next frame (the layout grows).
                await until(pilot, lambda: f"⚠ cannot reach {served.url}" in screen_text(app)
                            and "showing the last good data" in screen_text(app), "the banner on screen")
                # The last good data stays: header figures, tree rows, sessions.
                assert last.target == old_name and app.query_one(CacheTree).rows
                assert app.query_one(SessionsTable).rows
                # An action while it is down: a clear toast naming the target, nothing else.
                seen = len(app.toasts)
                await evict_by_keys(pilot, app, 1)
                await until(pilot, lambda: any(f"cannot reach {served.url}" in m for m in app.toasts[seen:]),
                            "the failed action's toast")
                assert app.home.stats is last and app.home.down is not None
                assert all(isinstance(e, TargetUnreachable) and served.url in e.message for e in app.outages)

            with fault("server_restart"):
                served.launch()
                await asyncio.to_thread(served.wait_ready)  # the dashboard keeps knocking meanwhile
                await until(pilot, lambda: app.home.down is None, "the reconnection")
                assert banner(app) == ""
                assert f"reconnected to {served.url}" in app.toasts
                # Fresh stats from the new process: its name, and its own counters (it never evicted).
                assert app.home.stats.target == served.name != old_name and app.home.stats.evicted_tokens == 0
                # The tree is the new incarnation's, not rows left over from the old one.
                await until(pilot, lambda: app.query_one(CacheTree).rows, "the new tree")
                assert top_level_prefixes(app) <= prompt_prefixes(served.incarnation)
                assert not top_level_prefixes(app) & old_prompts
                # Actions work again.
                await until(pilot, lambda: app.home.stats.evictable_tokens >= 1, "something evictable")
                seen = len(app.toasts)
                await evict_by_keys(pilot, app, 1)
                await until(pilot, lambda: any(m.startswith("evicted ") for m in app.toasts[seen:]),
                            "the eviction's toast")
                await until(pilot, lambda: app.home.stats.evicted_tokens >= 1, "the eviction in the header")
                assert all(isinstance(e, TargetUnreachable) for e in app.outages), app.outages
                assert_nothing_escaped(app)
        assert_nothing_escaped(app)
    finally:
        adapter.release()


async def test_an_expanded_node_that_vanishes_is_forgotten_not_an_outage():
    """What a restart does to every expanded id, an eviction does to one: the tree forgets it;
    the target is not 'down' and the dashboard does not stop at an error banner."""
    engine = build_engine()
    app = WatchedApp(BundledAdapter(engine), interval=0.2)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            tree = app.query_one(CacheTree)
            await until(pilot, lambda: tree.rows, "the tree")
            run = next(r.node for r in tree.rows if r.node.first_tokens[:2] == (50, 51))
            tree.move_to_key(("node", run.id))
            await pilot.press("enter")
            await until(pilot, lambda: run.id in app.home.poller.tree.loaded, "the run expanded")
            with fault("expanded_node_freed"):
                app.home.adapter.flush()  # frees the unlocked run [50..55], the expanded node with it
                polls = app.home.polls
                await until(pilot, lambda: app.home.polls >= polls + 2, "two polls after the flush")
                assert app.outages == [] and app.home.down is None and banner(app) == ""
                assert run.id not in app.home.poller.tree.expanded
                assert all(r.node.id != run.id for r in tree.rows if r.node)
                assert_nothing_escaped(app)
    finally:
        engine.stop()


def test_commands_under_the_server_killed_and_restarted(served):
    url, token = served.url, served.token
    assert radixtop(url, "stats", "--json").returncode == 0
    with fault("server_sigkill_under_a_command"):
        # A command in flight when the server dies: stopped first, so the command is surely
        # connected and waiting when the kill lands.
        served.signal(signal.SIGSTOP)
        waiting = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "stats", "--json", "--timeout", "60"],
                                   cwd=REPO, env=_cli_env(url, token), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: connected(waiting.pid, served.port), "the command's connection")
            served.kill()
            out, err = waiting.communicate(timeout=WAIT)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
        # (its connection is to radixtop's process beside the engine, serve's default: it answers
        # that the engine went away, then goes too)
        assert_one_line(subprocess.CompletedProcess([], waiting.returncode, out, err), 3,
                        "radixtop's engine went away")
        assert out == ""

    with fault("action_while_down"):
        for args in (("evict", "1", "--yes"), ("close", "s1", "--yes"), ("flush", "--yes"), ("stats",)):
            assert_one_line(radixtop(url, *args, token=token), 3, f"cannot reach {url}")

    with fault("server_restart"):
        served.start()
        stats = json.loads(radixtop(url, "stats", "--json").stdout)
        assert stats["target"] == served.name and stats["evicted_tokens"] == 0  # a new process
        wait_until(lambda: radixtop(url, "session", "s1").returncode == 0, "session s1 in the new process")
        done = radixtop(url, "evict", "1", "--yes", token=token)
        assert done.returncode == 0 and done.stdout.startswith("evicted ") and done.stderr == ""
        closed = radixtop(url, "close", "s1", "--yes", token=token)
        assert closed.returncode == 0 and "closed s1" in closed.stdout and closed.stderr == ""


# ----- 2. a target that stops answering -----


async def test_a_stopped_server_times_out_every_face_and_recovers(served):
    url = served.url
    adapter = RadixtopClient(url, token=served.token, timeout=0.5)
    client = RadixtopClient(url, token=served.token, timeout=0.5)
    app = WatchedApp(adapter, interval=0.25)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.home.polls >= 1 and app.query_one(CacheTree).rows, "the first poll")
            with fault("server_sigstop"):
                served.signal(signal.SIGSTOP)
                try:
                    await until(pilot, lambda: app.home.down is not None, "the timeout banner")
                    assert f"{url} did not answer within 0.5 s" in banner(app)  # the cause once (issue 26 item 7)
                    with pytest.raises(TargetTimeout) as info:
                        client.stats()
                    assert info.value.message == f"{url} did not answer within 0.5 s"
                    with pytest.raises(TargetTimeout, match="may still be done"):
                        client.evict(7)  # sent, unanswered: it may run when the server continues
                    command = await asyncio.to_thread(radixtop, url, "stats", "--timeout", "1")
                    assert_one_line(command, 3, f"{url} did not answer within 1 s")
                    assert all(isinstance(e, TargetTimeout) and url in e.message for e in app.outages)
                finally:
                    served.signal(signal.SIGCONT)
                await until(pilot, lambda: app.home.down is None, "the reconnection")
                assert banner(app) == "" and f"reconnected to {url}" in app.toasts
                assert client.stats().target == served.name
                # The unanswered evict ran when the server continued: the message was right to say so.
                await asyncio.to_thread(wait_until, lambda: any(
                    e.action == "evict" and e.extra.get("requested_tokens") == 7 for e in client.audit(20)),
                    "the timed-out evict in the audit log")
                assert radixtop(url, "stats").returncode == 0
                assert_nothing_escaped(app)
    finally:
        adapter.release()
        client.release()


# ----- 3. the engine thread dies under the live API -----


class InjectedFault(BaseException):
    """Raised inside the engine loop: not an Exception, so nothing on the way catches it."""


class DyingWorkload(ChatWorkload):
    """The demo workload, until ``die`` is set: then its next step raises InjectedFault."""

    def __init__(self, config: WorkloadConfig):
        super().__init__(config)
        self.die = threading.Event()

    def step(self, max_new: int | None = None):
        if self.die.is_set():
            raise InjectedFault("workload step blew up (injected)")
        return super().step(max_new)


SMALL = WorkloadConfig(sessions=6, system_prompts=2, system_prompt_len=32, turn_input_len=(4, 12),
                       turn_output_len=(4, 12), turns=(1, 4), max_running=3, seed=7)
WHY = "engine thread died: InjectedFault: workload step blew up (injected)"


async def test_engine_thread_death_is_told_by_every_face():
    engine = Engine(Scheduler(get_geometry("tiny"), 4096, device="cpu"), SMALL, step_interval=0.01)
    workload = engine.workload = DyingWorkload(SMALL)
    engine.start()
    token = "faults"
    auth = {"Authorization": f"Bearer {token}"}
    try:
        with running_server(create_app(BundledAdapter(engine, name="dying engine"), token, AuditLog(None))) as url:
            adapter = RadixtopClient(url, token=token, timeout=5.0)
            app = WatchedApp(adapter, interval=0.25)
            async with app.run_test(size=(160, 48)) as pilot:
                await until(pilot, lambda: app.home.stats is not None and app.query_one(SessionsTable).rows,
                            "the workload on screen")
                with fault("engine_thread_death"):
                    workload.die.set()
                    await asyncio.to_thread(wait_until, lambda: not engine.alive, "the engine thread to die")
                    health = httpx.get(f"{url}/healthz", timeout=10)
                    assert health.status_code == 503
                    assert health.json()["error"] == {"code": "target_unreachable",
                                                      "message": f"dying engine: {WHY}"}
                    reads = ["/v1/stats", "/v1/sessions", "/v1/sessions/s1", "/v1/nodes/root",
                             "/v1/nodes/root/children", "/v1/nodes/root/chain", "/v1/match?tokens=1,2",
                             "/v1/changes?since=0", "/v1/export", "/v1/export?format=columns", "/metrics"]
                    for path in reads:
                        reply = httpx.get(url + path, timeout=10)
                        assert reply.status_code == 503 and WHY in reply.json()["error"]["message"], path
                    actions = [("/v1/sessions/s1/close", None), ("/v1/sessions/s1/close?dry_run=true", None),
                               ("/v1/evict", {"tokens": 1}), ("/v1/flush", None)]
                    for path, body in actions:
                        reply = httpx.post(url + path, json=body, headers=auth, timeout=10)
                        assert reply.status_code == 503, (path, reply.status_code, reply.text)
                        assert reply.json()["error"]["code"] == "target_unreachable" and WHY in reply.text
                    refused = adapter.audit(len(actions))
                    assert all(not e.allowed and WHY in e.error for e in refused)
                    with pytest.raises(TargetUnreachable, match=re.escape(WHY)):
                        adapter.evict(1)

                    # The dashboard: a banner that says why, the last good data, a clear toast.
                    await until(pilot, lambda: app.home.down is not None, "the banner")
                    assert WHY in banner(app)
                    await until(pilot, lambda: WHY in screen_text(app), "the banner on screen")
                    assert app.query_one(SessionsTable).rows and app.home.stats is not None
                    await evict_by_keys(pilot, app, 1)
                    await until(pilot, lambda: any(WHY in m for m in app.toasts), "the refused action's toast")
                    assert_nothing_escaped(app)

                    # The commands: exit 3 and one line that says why.
                    for args in (("stats",), ("flush", "--yes"), ("close", "s1", "--yes")):
                        command = await asyncio.to_thread(radixtop, url, *args, token=token)
                        assert_one_line(command, 3, WHY)
            assert_nothing_escaped(app)
            adapter.release()
    finally:
        engine.stop()


def test_a_command_that_kills_the_engine_thread_is_answered():
    """A BaseException inside a queued command ends the loop; its caller gets why, at once."""
    engine = build_engine()

    def explode():
        raise InjectedFault("a read blew up (injected)")

    try:
        with running_server(create_app(BundledAdapter(engine, name="bundled", timeout=2.0), "t",
                                       AuditLog(None))) as url:
            client = RadixtopClient(url, timeout=10.0)
            with fault("engine_thread_death"):
                engine.scheduler.stats = explode  # the next stats read runs it on the owner thread
                with pytest.raises(TargetUnreachable, match="engine thread died: InjectedFault: a read blew up"):
                    client.stats()
                wait_until(lambda: not engine.alive, "the engine thread to end")
                with pytest.raises(TargetUnreachable, match="engine thread died: InjectedFault: a read blew up"):
                    client.sessions()
            client.release()
    finally:
        engine.stop()


# ----- 4. requests that finish after their session was closed; sessions closed twice -----


def test_a_request_finishing_after_its_close_and_a_second_close_lose_nothing():
    engine = build_engine()  # session d's request "running" is in flight, locking [1,2,3,4,9,9]
    try:
        with running_server(create_app(BundledAdapter(engine), "t", AuditLog(None))) as url:
            client = RadixtopClient(url, token="t")
            with fault("close_before_finish"):
                first = client.close_session("d")
                assert not first.already_closed and first.freed_tokens == 0  # d holds nothing yet
                engine.call(lambda s: s.finish("running", [77, 78]))  # the request ends after the close
                detail = client.session("d")
                assert detail.session.state == "closed" and detail.node_ids == ()  # it tagged nothing
                cached = client.match([1, 2, 3, 4, 9, 9, 77, 78])
                assert cached.matched_tokens == 8  # its KV is cached, held by no session: evictable
                assert client.node(cached.node_id).node.holders == () and client.node(cached.node_id).node.lock_ref == 0
            with fault("double_close"):
                again = client.close_session("d")
                assert again.already_closed and again.freed_tokens == 0 and again.freed_node_ids == ()
                assert client.plan_close("d").state == "closed"
            engine.call(check_invariants)
            st = client.stats()
            assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens
            assert st.uncached_tokens == 0 and st.protected_tokens == 0 and st.unevictable_tokens == 0
            flushed = client.flush()
            assert flushed.freed_tokens == st.evictable_tokens  # every token comes back
            after = client.stats()
            assert after.available_tokens == after.capacity_tokens and after.node_count == 0
            engine.call(check_invariants)
            client.release()
    finally:
        engine.stop()


def test_closes_racing_the_live_workload_lose_nothing():
    """Sessions closed (twice) through the API while their requests run under the demo workload:
    the requests finish after the close, tag nothing, and every slot is accounted for."""
    config = WorkloadConfig(sessions=12, system_prompts=2, system_prompt_len=32, turn_input_len=(4, 24),
                            turn_output_len=(4, 24), turns=(2, 6), max_running=6, seed=11)
    engine = Engine(Scheduler(get_geometry("tiny"), 16384, device="cpu"), config, step_interval=0.005).start()
    closed: set[str] = set()
    try:
        with running_server(create_app(BundledAdapter(engine), "t", AuditLog(None))) as url:
            client = RadixtopClient(url, token="t")
            deadline = time.monotonic() + WAIT
            while len(closed) < 12:
                assert time.monotonic() < deadline, f"only {len(closed)} sessions closed while running"
                engine.pause_workload()  # between steps: the requests seen running are still running
                running = engine.call(lambda s: {r.rid: r.session_id for r in s.running.values()
                                                 if r.session_id and not s.cache.is_session_closed(r.session_id)})
                for rid, sid in list(running.items())[:min(3, 12 - len(closed))]:
                    with fault("close_before_finish"):
                        first = client.close_session(sid)
                        assert not first.already_closed
                        closed.add(sid)
                    with fault("double_close"):
                        again = client.close_session(sid)
                        assert again.already_closed and again.freed_tokens == 0
                engine.pause_workload(False)
                wait_until(lambda: not engine.call(lambda s: set(running) & set(s.running)),
                           "the closed sessions' requests to finish")
            engine.pause_workload()
            engine.call(check_invariants)  # closed sessions hold nothing; no slot leaked or shared
            assert engine.requests_aborted == 0
            for sid in closed:
                detail = client.session(sid)
                assert detail.session.state == "closed" and detail.node_ids == ()
            st = client.stats()
            assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens
            client.flush()
            after = client.stats()
            assert after.available_tokens + after.unevictable_tokens == after.capacity_tokens
            assert after.evictable_tokens == 0
            engine.call(check_invariants)
            client.release()
    finally:
        engine.stop()


# ----- 5. the audit journal cannot be written: an action that cannot be audited does not run -----

JOURNAL_TRACE = "\n".join(json.dumps(op) for op in [
    {"op": "request", "input": list(range(1, 40)), "output": [40, 41], "session": "a"},
    {"op": "request", "input": list(range(100, 140)), "output": [140], "session": "b"},
]) + "\n"


@contextmanager
def journaled_serve(tmp: Path, audit: Path | str, max_file_bytes: int | None = None) -> Iterator[tuple[str, str]]:
    """`radixtop serve` over a trace (no workload: only actions change its cache), its journal at
    ``audit``; with ``max_file_bytes``, the kernel refuses to grow any file past that size (a
    disk that fills: writes fail with EFBIG, as ENOSPC would)."""
    import resource

    trace, port, token = tmp / "trace.jsonl", free_port(), secrets.token_urlsafe(16)
    trace.write_text(JOURNAL_TRACE)

    def limits() -> None:
        _die_with_parent()
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    log = tmp / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", str(trace),
                                 "--model", "tiny", "--capacity", "512", "--device", "cpu", "--port", str(port),
                                 "--audit-log", str(audit)],
                                cwd=REPO, env={**os.environ, "RADIXTOP_TOKEN": token}, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=limits)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, WAIT, lambda: log.read_text()[-2000:])
        yield url, token
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cache_over_http(http: httpx.Client) -> tuple:
    stats = http.get("/v1/stats").json()
    return ({k: v for k, v in stats.items() if "age" not in k and "time" not in k}, http.get("/v1/export").text)


def test_a_journal_that_fills_up_refuses_every_action_and_changes_nothing(tmp_path):
    """`--audit-log /dev/full` once let a flush answer 200 and run with nothing journaled. Here
    the journal stops growing after a few lines: from then on every action is 503 (saying why),
    the cache is as it was, and /v1/audit still lists what did run."""
    journal = tmp_path / "audit.jsonl"
    with journaled_serve(tmp_path, journal, max_file_bytes=1200) as (url, token), \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=WAIT) as http:
        ran = 0
        for _ in range(30):
            before = cache_over_http(http)
            response = http.post("/v1/evict", json={"tokens": 1})
            if response.status_code != 200:
                break
            ran += 1
        with fault("journal_full"):
            assert response.status_code == 503, f"{ran} evicts ran with a journal that cannot grow past 1200 bytes"
            assert response.json()["error"]["code"] == "audit_unavailable"
            assert "nothing was done" in response.json()["error"]["message"]
            assert cache_over_http(http) == before
            for path, body in (("/v1/flush", None), ("/v1/sessions/a/close", None), ("/v1/evict", {"tokens": 1})):
                refused = http.post(path, json=body)
                assert refused.status_code == 503, (path, refused.text)
            assert cache_over_http(http) == before
            listed = http.get("/v1/audit").json()["entries"]
            assert [e["action"] for e in listed if e["allowed"]] == ["evict"] * ran
    assert journal.stat().st_size <= 1200


@pytest.mark.parametrize("where", ["directory", "/dev/full"])
def test_a_journal_path_that_cannot_be_used_is_one_line_at_start(tmp_path, where):
    """A directory said `cannot listen on 127.0.0.1:PORT: Is a directory`; /dev/full started."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(JOURNAL_TRACE)
    path = str(tmp_path) if where == "directory" else where
    result = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", str(trace),
                             "--model", "tiny", "--capacity", "512", "--device", "cpu", "--port", str(free_port()),
                             "--audit-log", path], cwd=REPO, env={**os.environ, "RADIXTOP_TOKEN": "t" * 24},
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT)
    assert_one_line(result, 2, f"cannot use the audit log {path}")
    assert "listen" not in result.stderr
