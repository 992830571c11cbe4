"""The engine loop: one owner thread, commands between steps, timeouts, recording for replay."""

from __future__ import annotations

import io
import threading
import time

import pytest

from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.owner.queue import OwnerStopped, OwnerTimeout
from radixtop.gpu_backend.traces.ops import replay, tree_rows
from radixtop.gpu_backend.workload import ChatWorkload, WorkloadConfig
from tests.support.engines import CounterClock, check_invariants, make_scheduler

SMALL = WorkloadConfig(sessions=6, system_prompts=2, system_prompt_len=32, turn_input_len=(4, 12),
                       turn_output_len=(4, 12), turns=(1, 4), max_running=3, seed=7)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_workload_is_reproducible_and_shares_system_prompts():
    a, b = ChatWorkload(SMALL), ChatWorkload(SMALL)
    for _ in range(20):
        assert a.step() == b.step()
    begins = [x for _ in range(10) for x in a.step() if x.kind == "begin"]
    prefixes = {tuple(x.input_ids[:32]) for x in begins}
    assert len(prefixes) <= 2


def test_engine_runs_workload_and_commands_on_its_own_thread():
    s = make_scheduler(capacity=2048)
    engine = Engine(s, SMALL).start()
    try:
        wait_for(lambda: engine.requests_finished >= 30)
        assert engine.call(lambda sched: threading.current_thread().name) == "radixtop-engine"
        engine.call(check_invariants)  # a consistent view: taken between two steps
        stats = engine.call(lambda sched: sched.stats())
        assert stats.total_size > 0
        closed = engine.close_session("s1")
        assert closed.session_id == "s1"
    finally:
        engine.stop()
    assert not engine.alive
    with pytest.raises(OwnerStopped):
        engine.call(lambda sched: None)


def test_engine_evicts_when_the_pool_is_short_and_never_breaks_invariants():
    s = make_scheduler(capacity=200)  # smaller than the working set
    engine = Engine(s, SMALL).start()
    try:
        wait_for(lambda: engine.requests_finished >= 60)
        engine.call(check_invariants)
        assert engine.call(lambda sched: sched.evicted_tokens) > 0
    finally:
        engine.stop()


def test_command_timeout_is_a_clear_error():
    s = make_scheduler()
    engine = Engine(s, None).start()
    gate = threading.Event()
    try:
        threading.Thread(target=engine.call, args=(lambda sched: gate.wait(5),), daemon=True).start()
        time.sleep(0.05)  # the owner thread is now stuck in the first command
        with pytest.raises(OwnerTimeout, match="the engine thread did not take the request within 0.2s"):
            engine.call(lambda sched: 1, timeout=0.2)
    finally:
        gate.set()
        engine.stop()


def test_a_dead_engine_thread_says_why():
    s = make_scheduler()
    engine = Engine(s, SMALL)
    engine._step = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    engine.start()
    wait_for(lambda: not engine.alive)
    with pytest.raises(OwnerStopped, match="engine thread died: RuntimeError: boom"):
        engine.call(lambda sched: None)


def test_recorded_run_replays_to_the_same_tree():
    clock = CounterClock()
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler

    s = Scheduler(get_geometry("tiny"), 600, device="cpu", clock=clock)
    record = io.StringIO()
    engine = Engine(s, SMALL, record_to=record).start()
    try:
        wait_for(lambda: engine.requests_finished >= 40)
        engine.evict(50)
        engine.pause_workload()
        live_tree = engine.call(tree_rows)
        live_stats = engine.call(lambda sched: sched.stats().as_dict())
    finally:
        engine.stop()
    doc = replay(io.StringIO(record.getvalue()), capacity=600, clock=CounterClock())
    assert doc["tree"] == live_tree
    assert doc["stats"] == live_stats


def test_a_refused_begin_leaves_the_session_as_it_was():
    workload = ChatWorkload(SMALL)
    before = {sid: list(s.history) for sid, s in workload.sessions.items()}
    begins = [a for a in workload.step() if a.kind == "begin"]
    assert begins and all(len(a.input_ids) > len(before[a.session_id]) for a in begins)
    for action in begins:
        workload.abort(action.rid)
    assert {sid: s.history for sid, s in workload.sessions.items()} == before
    assert not any(s.busy for s in workload.sessions.values())


def test_the_demo_keeps_going_on_a_pool_smaller_than_its_conversations():
    """A 512-token pool, and chats that grow past it: refused turns are not kept, and a session
    whose conversation no longer fits in the whole pool ends (closed if it closes) instead of
    retrying forever. Before, every history outgrew the pool and the engine stepped in vain."""
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler

    s = Scheduler(get_geometry("llama-3-8b"), 512, device="meta")
    engine = Engine(s, WorkloadConfig(sessions=48, seed=0, max_running=8, text=True))
    finished = []
    for _ in range(6):
        before = engine.requests_finished
        for _ in range(1000):
            engine._step()  # the loop's body, on this thread (the engine thread is not started)
        finished.append(engine.requests_finished - before)
        assert max(len(x.history) for x in engine.workload.sessions.values()) <= 512 + 128
        check_invariants(s)
    assert min(finished) >= 50, finished  # every 1000 steps, still finishing requests
    assert s.closes > 0
