"""Issue 27's probe on SGLang 0.5.23's default tree core (Rust): the events the core records,
taken and encoded on the scheduler's thread (``adapters.sglang.probe``), handed over to radixtop's
side (``gpu_backend.owner.handover``) and applied there (``adapters.events.handover``): in this
process over a socket pair, and in a real process of its own, killed mid-stream.

Needs sglang 0.5.23 (``.venv-sglang23``; tests/conftest.py collects this file only there).
"""

from __future__ import annotations

import pytest

from tests.support.engines import SGLANG_VERSION

if SGLANG_VERSION != "0.5.23":  # tests/conftest.py collects this file only beside 0.5.23
    raise RuntimeError(f"needs sglang 0.5.23 (found {SGLANG_VERSION}): run it with .venv-sglang23 "
                       "(.ci/setup-sglang23), as .ci/test does")

import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

from radixtop.adapters.events.adapter import EventTreeAdapter  # noqa: E402
from radixtop.adapters.events.handover import HandoverEvents  # noqa: E402
from radixtop.adapters.model import ROOT_ID  # noqa: E402
from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeEnd, pair  # noqa: E402
from tests.on_sglang.ref import drive23  # noqa: E402
from tests.support.scheduler_loop import SchedulerLoop  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def sgl():
    try:
        return drive23.import_sglang23()
    except drive23.SGLang23UnavailableError as exc:  # pragma: no cover - a broken install
        pytest.fail(str(exc))


def rust_cache(sgl, capacity: int = 4096):
    cache, pools = drive23.build_unified_cache23(capacity, enable_session_radix_cache=False,
                                                 tree_core_backend="rust", enable_kv_cache_events=True)
    assert cache._tree_core_backend == "rust"
    return cache, pools


def requests(seed: int, n: int):
    rng = random.Random(seed)
    talks: list[list[int]] = []
    for _ in range(n):
        if not talks or rng.random() < 0.3:
            talks.append([rng.randrange(1, 50) for _ in range(rng.randrange(5, 40))])
        talk = rng.choice(talks)
        talk.extend(rng.randrange(1, 500) for _ in range(rng.randrange(3, 30)))
        output = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 6))]
        yield list(talk), output
        talk.extend(output)


def test_the_tree_beside_equals_sglangs_cached_tokens_through_the_handover(sgl):
    """Requests with evictions (a pool of 1,024 tokens), the probe's step once a request as the
    plugin's hook once a loop: radixtop's tree, kept off the scheduler's thread from the frames,
    holds exactly SGLang's cached tokens; nothing lost, no frame waited for."""
    from radixtop.adapters.sglang.probe import EventsProbe

    cache, pools = rust_cache(sgl, capacity=1024)
    probe_sock, mirror_sock = pair()
    probe = EventsProbe(cache, ProbeEnd(probe_sock))
    tree = EventTreeAdapter(name="beside", capacity_tokens=1024)
    beside = HandoverEvents(tree, MirrorEnd(mirror_sock))
    try:
        for tokens, output in requests(3, 300):
            drive23.run_request(cache, pools, tokens, output)
            probe.step()
        assert probe.batches > 10 and probe.end.dropped == 0
        assert tree.wait_for_seq(probe.events_seq, 30)  # (the frames of requests given back are numbered too)
        cached = cache.evictable_size() + cache.protected_size()
        assert tree.node(ROOT_ID).node.subtree_tokens == cached > 0
        st = tree.status()
        assert st.complete and st.missed_batches == 0 and st.last_error is None
        assert tree.stats().total_tokens == cached
    finally:
        beside.close()
        probe.end.close()


def test_a_stalled_mirror_costs_the_scheduler_nothing_and_is_told_what_it_missed(sgl):
    """Nobody reads radixtop's end for a while: the probe's sends never wait, the frames past its
    bound are dropped and counted, and when radixtop reads again its tree says it missed them
    (incomplete), never a silent wrong tree."""
    from radixtop.adapters.sglang.probe import EventsProbe

    cache, pools = rust_cache(sgl, capacity=8192)
    probe_sock, mirror_sock = pair(buffer=16 << 10)
    probe = EventsProbe(cache, ProbeEnd(probe_sock, backlog_bytes=16 << 10))
    for tokens, output in requests(4, 400):  # radixtop's side not started yet: a stall
        drive23.run_request(cache, pools, tokens, output)
        probe.step()
    assert probe.end.dropped > 0 and probe.end.held <= 16 << 10
    tree = EventTreeAdapter(name="beside", capacity_tokens=8192)
    beside = HandoverEvents(tree, MirrorEnd(mirror_sock))
    try:
        for tokens, output in requests(5, 20):
            drive23.run_request(cache, pools, tokens, output)
            probe.step()
        assert tree.wait_for_seq(probe.events_seq, 30)  # (the frames of requests given back are numbered too)
        st = tree.status()
        assert not st.complete and st.missed_batches == probe.end.dropped
    finally:
        beside.close()
        probe.end.close()


def test_radixtops_process_killed_mid_stream_leaves_the_scheduler_serving(sgl):
    """radixtop's side in a process of its own (the socket passed as a file descriptor, as the
    plugin will start it); ``kill -9`` of it while requests run: every request completes, the
    probe goes down and holds nothing, and nothing raises on the scheduler's side."""
    from radixtop.adapters.sglang.probe import EventsProbe

    cache, pools = rust_cache(sgl, capacity=2048)
    probe_sock, mirror_sock = pair()
    fd = mirror_sock.fileno()
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import socket, sys, time
            from radixtop.adapters.events.adapter import EventTreeAdapter
            from radixtop.adapters.events.handover import HandoverEvents
            from radixtop.gpu_backend.owner.handover import MirrorEnd
            tree = EventTreeAdapter(name="beside", capacity_tokens=2048)
            HandoverEvents(tree, MirrorEnd(socket.socket(fileno={fd})))
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
                print(tree.stats().total_tokens, flush=True)
        """)],
        pass_fds=(fd,), stdout=subprocess.PIPE, text=True,
    )
    mirror_sock.close()
    probe = EventsProbe(cache, ProbeEnd(probe_sock))
    try:
        assert child.stdout.readline() == "ready\n"
        done = 0
        for i, (tokens, output) in enumerate(requests(6, 400)):
            drive23.run_request(cache, pools, tokens, output)
            probe.step()
            done += 1
            if i == 150:
                assert int(child.stdout.readline()) >= 0  # alive, applying
                os.kill(child.pid, signal.SIGKILL)
                child.wait(timeout=10)
        assert done == 400 and probe.end.down and probe.end.held == 0
        assert probe.end.sent > 0 and probe.end.dropped > 0
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        probe.end.close()


def started_beside(cache, capacity: int, info: dict | None = None, **kwargs):
    """radixtop's process beside this "scheduler", as the plugin starts it: ``(BesideProcess, client)``
    (``info``: more of the plugin's hello, as its ``ops``)."""
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.adapters.http.server.run import bind
    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
    from radixtop.adapters.sglang.probe import BesideProcess

    listening = bind("127.0.0.1", 0)
    listening.listen()
    port = listening.getsockname()[1]
    token = "a-test-token-of-enough-characters"
    sglang = SGLangInProcessAdapter(cache, name="sglang dp0 (test)")  # no owner queue: the loop's thread is the scheduler's
    beside = BesideProcess(
        cache, listening, "127.0.0.1",
        {"name": "sglang dp0 (test)", "dp_rank": 0, "bytes_per_token": 64, "capacity_tokens": capacity, **(info or {})},
        {**os.environ, "RADIXTOP_TOKEN": token}, sglang=sglang, **kwargs)
    return beside, RadixtopClient(f"http://127.0.0.1:{port}", token=token, timeout=30)


def test_radixtops_process_beside_serves_the_tree_and_sglangs_own_figures_and_actions(sgl):
    """``python -m radixtop.adapters.sglang.beside``, started as the plugin starts it (its end of
    the hand-over and the admin API's listening socket passed as descriptors, the token in the
    environment): its admin API shows the Rust core's tree as SGLang caches it, SGLang's own
    totals (asked of the scheduler through the probe), and runs SGLang's evict and flush, the
    tree following each; when the scheduler's end closes (SGLang exited), it exits by itself."""
    import time

    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter

    cache, pools = rust_cache(sgl, capacity=2048)
    beside, client = started_beside(cache, 2048)
    loop = SchedulerLoop(beside, cache, pools)
    try:
        def work() -> None:
            for tokens, output in requests(7, 200):
                drive23.run_request(cache, pools, tokens, output)
                beside.step()

        loop.run(work)
        deadline = time.monotonic() + 30
        while True:  # its first read: the process listening
            try:
                stats = client.stats()
                break
            except Exception:
                assert time.monotonic() < deadline and beside.child.poll() is None
                time.sleep(0.1)
        own = {}
        loop.run(lambda: own.update(stats=SGLangInProcessAdapter(cache).stats()))
        cached = cache.evictable_size() + cache.protected_size()
        assert stats.total_tokens == cached and client.node(ROOT_ID).node.subtree_tokens == cached
        assert (stats.capacity_tokens, stats.available_tokens, stats.evictable_tokens) == \
            (own["stats"].capacity_tokens, own["stats"].available_tokens, own["stats"].evictable_tokens)
        assert stats.target == "sglang dp0 (test)"
        caps = client.capabilities()
        assert caps.tree and caps.evict and caps.flush and not caps.close and "beside" in caps.reason
        evicted = client.evict(100)
        assert evicted.evicted_tokens >= 100 and evicted.evicted_nodes >= 1
        assert client.node(ROOT_ID).node.subtree_tokens == cached - evicted.evicted_tokens == cache.evictable_size()
        client.flush()
        assert client.node(ROOT_ID).node.subtree_tokens == 0 == cache.evictable_size()
        loop.close()
        beside.probe.end.close()  # the scheduler exits
        assert beside.child.wait(timeout=20) == 0
    finally:
        loop.stop.set()
        client.release()
        beside.close()


def test_why_on_the_rust_core_beside_names_sglangs_evictions_and_radixtops_evict_and_flush(sgl):
    """Issue 29 on the Rust core (SGLang 0.5.23's default), radixtop beside the scheduler: the
    history of the blocks that leave the tree kept from its KV events. A prompt SGLang evicted for
    room is named so; one radixtop's evict took, as that evict (the probe tells its removals apart
    in the frames); one its flush took, as the flush; ``then`` before the evict holds what the
    evict took."""
    import time

    cache, pools = rust_cache(sgl, capacity=1024)
    beside, client = started_beside(cache, 1024)
    loop = SchedulerLoop(beside, cache, pools)
    rng = random.Random(5)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(600, 900) for _ in range(n)]

    try:
        first = prompt(64)
        loop.run(lambda: drive23.run_request(cache, pools, first, [1]))
        loop.run(lambda: [drive23.run_request(cache, pools, prompt(100), [2]) for _ in range(30)])  # (a flood)
        deadline = time.monotonic() + 30
        while True:
            try:
                w = client.why(first)
                break
            except Exception:
                assert time.monotonic() < deadline and beside.child.poll() is None
                time.sleep(0.1)
        assert w.cached_tokens < len(first) and w.lost and {x.cause for x in w.lost} == {"evicted"}
        assert w.lost_unit == "block" and sum(x.end - x.start for x in w.lost) == len(first) - w.cached_tokens
        kept = prompt(48)
        loop.run(lambda: drive23.run_request(cache, pools, kept, [3]))
        assert client.match(kept).matched_tokens == len(kept)
        moment = time.time()
        time.sleep(0.01)
        evicted = client.evict(1024).evicted_tokens
        w = client.why(kept)
        assert w.cached_tokens == 0 and {(x.cause, x.who) for x in w.lost} == {("evict_action", "radixtop's evict")}
        v = client.then(moment)
        assert v.left_by_cause == {"evict_action": evicted} and v.tokens_now == v.tokens_then - evicted
        from tests.support.then_walk import check_tree_then  # (the tree then block by block, over HTTP)

        then = check_tree_then(client, v)
        assert {n.left_by for n in then.values() if n.left_at is not None} == {"radixtop's evict"}
        last = prompt(40)
        loop.run(lambda: drive23.run_request(cache, pools, last, [4]))
        client.flush()
        assert {x.cause for x in client.why(last).lost} == {"flushed"}
        loop.run(lambda: drive23.run_request(cache, pools, prompt(30), [5]))
        assert client.match(last).matched_tokens == 0  # (read: what came before is in the tree)
        after = time.time()
        time.sleep(0.01)
        loop.run(lambda: [drive23.run_request(cache, pools, prompt(100), [2]) for _ in range(12)])
        assert {x.cause for x in client.why(last).lost} == {"flushed"}
        assert set(client.then(after).left_by_cause) == {"evicted"}  # (after the flush, SGLang's own again)
    finally:
        loop.stop.set()
        client.release()
        beside.close()


def test_a_sessions_hits_on_the_rust_core_beside_are_the_requests_sglang_gave_back(sgl):
    """Each request SGLang's ``on_release`` gives back finished (its session, its prompt's tokens
    and ``Req.cached_tokens``) crosses in a ``SERVED`` frame after that step's events; beside, a
    session's story lists its requests' hits as SGLang gave them, in order; an aborted one too
    (served its hit), /health's own not."""
    import time

    cache, pools = rust_cache(sgl, capacity=1024)
    beside, client = started_beside(cache, 1024, {"ops": True})
    loop = SchedulerLoop(beside, cache, pools)
    rng = random.Random(3)
    history = [rng.randrange(600, 900) for _ in range(40)]
    served = []
    try:
        for turn in range(4):
            prompt = history + [rng.randrange(600, 900) for _ in range(10)]

            def turn_of(prompt=prompt, abort=turn == 2):
                req = drive23.begin_request(cache, pools, prompt, session_id="chat")
                drive23.finish_request(cache, pools, req, [5, 6], abort=abort)
                return len(prompt), req.cached_tokens

            served.append(loop.run(turn_of))
            history = prompt + [5]
        loop.run(lambda: drive23.run_request(cache, pools, history, [7], rid="HEALTH_CHECK_1"))
        deadline = time.monotonic() + 30
        while True:
            try:
                story = client.why_session("chat")
                if story.requests_kept == len(served):
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline and beside.child.poll() is None
            time.sleep(0.1)
        assert [(r.prompt_tokens, r.cached_tokens) for r in story.requests] == served
        assert served[-1][1] > 0 and story.prompt_tokens == sum(p for p, _ in served)
    finally:
        loop.stop.set()
        client.release()
        beside.close()


def heard(beside, timeout: float = 60) -> None:
    """Steps until radixtop's process said it is up (a process that hangs before that is judged by
    ``probe.STARTING_S``: its start takes seconds on a loaded machine)."""
    import time

    deadline = time.monotonic() + timeout
    while not beside._heard:
        assert time.monotonic() < deadline, "radixtop's process beside never said it was up"
        beside.step()
        time.sleep(0.01)


def test_a_hung_process_beside_is_killed_and_started_again_saying_what_it_missed(sgl, monkeypatch):
    """radixtop's process stopped (SIGSTOP: alive, reading nothing): the probe's frames are dropped
    without a wait; after ``STALLED_S`` of that the process is killed, and started again on the
    same port, its tree saying it is incomplete."""
    import time

    from radixtop.adapters.sglang import probe as probe_module

    monkeypatch.setattr(probe_module, "STALLED_S", 0.5)
    monkeypatch.setattr(probe_module, "RESTART_FIRST_S", 0.1)
    class Poller:  # SGLang's idle sleeper's zmq.Poller, as the hand-over's socket joins and leaves it
        def __init__(self) -> None:
            self.fds: list[int] = []
            self.gone: list[int] = []

        def register(self, fd, flags) -> None:
            self.fds.append(fd)

        def unregister(self, fd) -> None:
            self.gone.append(fd)

    poller = Poller()
    cache, pools = rust_cache(sgl, capacity=8192)
    beside, client = started_beside(cache, 8192, buffer=8 << 10, backlog=8 << 10, poller=poller)
    loop = None
    try:
        assert poller.fds == [beside.probe.end.sock.fileno()]  # a call from radixtop's side wakes it
        heard(beside)
        first = beside.child.pid
        os.kill(first, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        for tokens, output in requests(8, 100_000):
            drive23.run_request(cache, pools, tokens, output)
            beside.step()
            if beside.starts == 2:
                break
            assert time.monotonic() < deadline, "the hung process was never replaced"
        assert beside.child.pid != first and beside.probe.end.dropped == 0
        # the dead end left the poller (a closed socket reads as ready: an idle scheduler would spin)
        assert poller.gone == poller.fds[:1] and poller.fds[1:] == [beside.probe.end.sock.fileno()]
        loop = SchedulerLoop(beside, cache, pools)
        while True:
            try:
                reason = client.capabilities().reason
                break
            except Exception:  # the new process not listening yet
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert "incomplete" in reason
    finally:
        if loop is not None:
            loop.close()
        client.release()
        beside.close()


def test_a_process_beside_that_hangs_before_the_server_goes_idle_is_replaced_all_the_same(sgl, monkeypatch):
    """Frames dropped for a stopped process, then an idle server (steps with nothing to send):
    the stall is judged by frames taken, not by drops seen at each step, so it is still replaced."""
    import time

    from radixtop.adapters.sglang import probe as probe_module

    monkeypatch.setattr(probe_module, "STALLED_S", 0.5)
    monkeypatch.setattr(probe_module, "RESTART_FIRST_S", 0.1)
    cache, pools = rust_cache(sgl, capacity=8192)
    beside, client = started_beside(cache, 8192, buffer=8 << 10, backlog=8 << 10)
    try:
        heard(beside)
        first = beside.child.pid
        os.kill(first, signal.SIGSTOP)
        for tokens, output in requests(9, 100_000):  # a burst, until frames drop
            drive23.run_request(cache, pools, tokens, output)
            beside.step()
            if beside.probe.end.dropped:
                break
        deadline = time.monotonic() + 30
        while beside.starts == 1:  # idle: steps with no event
            assert time.monotonic() < deadline, "a hang seen only under steady drops"
            beside.step()
            time.sleep(0.01)
        assert beside.child.pid != first
    finally:
        client.release()
        beside.close()


def test_a_process_beside_still_starting_is_not_taken_for_hung(sgl, monkeypatch):
    """Found at 1M nodes: the whole tree's first frames filled the socket while radixtop's process
    was still importing (seconds on a loaded machine); no frame taken for ``STALLED_S``, it was
    killed as hung, and the whole tree walked again. Until it says it is up, it has
    ``STARTING_S``."""
    import time

    from radixtop.adapters.sglang import probe as probe_module

    monkeypatch.setattr(probe_module, "STALLED_S", 0.5)
    monkeypatch.setattr(probe_module, "RESTART_FIRST_S", 0.1)
    cache, pools = rust_cache(sgl, capacity=8192)
    beside, client = started_beside(cache, 8192, buffer=8 << 10, backlog=8 << 10)
    first = beside.child.pid
    os.kill(first, signal.SIGSTOP)  # (just started: it has said nothing yet)
    try:
        for tokens, output in requests(9, 100_000):  # a burst, until frames drop
            drive23.run_request(cache, pools, tokens, output)
            beside.step()
            if beside.probe.end.dropped:
                break
        assert beside.probe.end.dropped
        until = time.monotonic() + 3
        while time.monotonic() < until:
            beside.step()
            time.sleep(0.01)
        assert beside.starts == 1 and beside.child.pid == first
        os.kill(first, signal.SIGCONT)
        heard(beside)
        assert beside.starts == 1
    finally:
        os.kill(first, signal.SIGCONT)
        client.release()
        beside.close()
