"""One mirror for both (issue 27, item 3): the bundled cache's change records (``BundledRecorder``),
sent through msgpack as the hand-over carries them and applied to the ``MirrorCache`` that follows
SGLang's trees beside the scheduler. Through random traces (splits, evictions under pressure,
aborts, closes, re-opened ids, a reset), after every operation the mirror equals the bundled tree
field for field, its ledger equals the from-scratch attribution, and the adapter over it (the one
that reads SGLang's) gives each session the figures the bundled cache gives it: what a close
frees, node for node."""

from __future__ import annotations

import json
import time

import pytest

from radixtop.adapters.bundled.recorder import BundledRecorder
from radixtop.adapters.owned.records import BEGIN, NODE, OP, REOPENED, WHOLE, Walk
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.sglang.mirror import MirrorCache
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.traces.ops import Replayer, read_trace
from tests.on_sglang.test_ledger16 import check_kept
from tests.on_sglang.test_mirror16 import check_same as check_same16
from tests.on_sglang.test_mirror16 import wire
from tests.support.trace_gen import capacity_for, generate_trace


def check_same(cache, mirror: MirrorCache) -> None:
    check_same16(cache, mirror, tokens=lambda node: list(node.key), bundled=True)


def check_figures(scheduler, beside: SGLangInProcessAdapter) -> None:
    """The sessions listed open and closed, as the engine knows them and as the adapter beside
    lists them; each session's close, as the bundled cache plans it and as the adapter beside
    plans it on the mirror: the same nodes freed, the same tokens and bytes, the same nodes kept
    and why."""
    cache = scheduler.cache
    page = beside.sessions("exclusive_bytes", 0, 10_000).sessions
    assert {row.id for row in page if row.state == "open"} == set(scheduler.open_session_ids())
    assert beside.stats().open_sessions == len(scheduler.open_session_ids())
    exclusive = cache.exclusive_tokens_by_session()
    for sid in cache.session_ids():
        mine, theirs = beside.plan_close(sid), cache.plan_close(sid)
        assert sorted(mine.freed_node_ids) == sorted(theirs.freed_node_ids), sid
        assert mine.freed_tokens == theirs.freed_tokens == exclusive[sid], sid
        assert mine.freed_bytes == theirs.freed_bytes, sid
        assert sorted((k.node_id, k.reason) for k in mine.kept) == sorted((k.node_id, k.reason) for k in theirs.kept)
    rows = {row.id: row for row in page}
    for sid in cache.session_ids():
        assert rows[sid].exclusive_bytes == exclusive[sid] * cache.bytes_per_token, sid


def ops_of(history) -> list[tuple]:
    """A history's ops but their moments, their tokens as lists (the engine keeps its own lists,
    the copy beside arrays from the records)."""
    return [(*e[1:6], None if e[6] is None else list(e[6]), e[7]) for e in history.requests_after(0, 10**6)[0]]


def scheduler_for(lines: list[str], size: str, close_policy: str = "free") -> Scheduler:
    return Scheduler(get_geometry("tiny"), capacity_for(lines, size), device="cpu", write_kv=False,
                     close_policy=close_policy)


def adapter_over(mirror: MirrorCache, scheduler: Scheduler) -> SGLangInProcessAdapter:
    beside = SGLangInProcessAdapter(mirror, model="tiny", session_controller=mirror.controller)
    beside.bpt = beside._orders.bpt = scheduler.cache.bytes_per_token
    return beside


@pytest.mark.parametrize("close_policy", ["free", "deref"])
@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", range(6))
def test_the_mirror_follows_every_operation_of_the_bundled_cache(seed, size, close_policy):
    """... under either close policy of the engine's (``serve --close-policy``: a close frees the
    session's exclusive nodes, or only drops its references, as SGLang 0.5.23's does)."""
    lines = generate_trace(seed, n_ops=150, max_in_flight=4, vocab=6 if seed % 2 else 400, abort_weight=3)
    scheduler = scheduler_for(lines, size, close_policy)
    cache = scheduler.cache
    recorder = BundledRecorder(cache, scheduler)
    mirror = MirrorCache(page_size=1, close_policy=close_policy)
    mirror.history.tells_requests()  # (as the process beside does where the engine says it tells its ops)
    mirror.apply(wire(recorder.snapshot()))
    beside = adapter_over(mirror, scheduler)
    replayer = Replayer(scheduler)
    kinds = set()
    for op in read_trace(lines):
        replayer.apply(op)
        records = recorder.take()
        kinds |= {r[0] for r in records}
        mirror.apply(wire(records))
        check_same(cache, mirror)
        check_kept(mirror, beside)
        check_figures(scheduler, beside)
        # the engine's ops, as its own history keeps them and as the history beside does (from OP records)
        assert ops_of(mirror.history) == ops_of(cache.history)
    assert OP in kinds and len(kinds) >= 8, kinds
    assert REOPENED in kinds or not any(json.loads(line)["op"] == "register" for line in lines)
    cache.reset()  # (its tombstones gone: the sessions the engine still knows are open again)
    mirror.apply(wire(recorder.take()))
    check_same(cache, mirror)
    check_figures(scheduler, beside)


@pytest.mark.parametrize("sliced", [1, 3])
@pytest.mark.parametrize("seed", range(6))
def test_the_bundled_tree_walked_in_slices_while_it_changes_comes_equal(seed, sliced):
    """radixtop's process beside the engine (re)started with requests running: the whole tree
    walked a few nodes a step between the engine's operations comes whole and equal; and the
    engine's ops meanwhile (its requests' begins and ends, not the tree's) reach the history
    beside, those that waited when the walk began too (found by review: the walk dropped them,
    and a request's begin came without its end)."""
    lines = generate_trace(seed, n_ops=250, max_in_flight=4, vocab=6 if seed % 2 else 400, abort_weight=3)
    scheduler = scheduler_for(lines, "small")
    cache = scheduler.cache
    replayer = Replayer(scheduler)
    ops = list(read_trace(lines))
    for op in ops[:99]:
        replayer.apply(op)
    recorder = BundledRecorder(cache, scheduler)
    before = len(ops_of(cache.history))
    replayer.apply(ops[99])  # (its records wait when the walk begins)
    mirror = MirrorCache(page_size=1)
    mirror.history.tells_requests()
    walk = Walk(recorder)
    kinds = set()
    for op in ops[100:]:
        records = walk.step(most=sliced) if not walk.done else recorder.take()
        kinds |= {r[0] for r in records}
        mirror.apply(wire(records))
        replayer.apply(op)
    while not walk.done:
        mirror.apply(wire(walk.step(most=sliced)))
    mirror.apply(wire(recorder.take()))
    assert {BEGIN, NODE, WHOLE} <= kinds
    assert ops_of(mirror.history) == ops_of(cache.history)[before:] != []
    check_same(cache, mirror)
    beside = adapter_over(mirror, scheduler)
    check_kept(mirror, beside)
    check_figures(scheduler, beside)


def test_the_recorder_takes_only_the_bundled_cache():
    with pytest.raises(TypeError):
        BundledRecorder(MirrorCache(page_size=1))


def test_a_close_during_the_walk_drops_its_session_from_the_nodes_already_sent():
    """A session closed while the whole tree is on its way: a node it shared with another session
    stays, held by the other one only, though it was sent before the close with both."""
    scheduler = Scheduler(get_geometry("tiny"), 256, device="cpu", write_kv=False)
    scheduler.request("r0", [9, 9], [9])  # (a second node: the walk sends the shared one first, then stops)
    scheduler.request("r1", [1, 2, 3, 4], [5], session_id="a")
    scheduler.request("r2", [1, 2, 3, 4], [5], session_id="b")
    cache = scheduler.cache
    recorder = BundledRecorder(cache, scheduler)
    mirror = MirrorCache(page_size=1)
    walk = Walk(recorder)
    mirror.apply(wire(walk.step(most=2)))  # the shared node sent, the walk not through
    assert not walk.done and any(n.session_ids == {"a", "b"} for n in cache.nodes.values())
    scheduler.close_session("a")
    while not walk.done:
        mirror.apply(wire(walk.step(most=8)))
    check_same(cache, mirror)


def test_a_read_in_many_slices_over_the_mirror_is_not_held_back_by_its_wait_for_records():
    """The mirror's thread runs a read's slices back to back: it waits for the next frame of
    records only when no read is under way (it slept up to 200 ms after each slice: a sessions
    page of a busy engine's 200 sessions took 1-10 s, and timed out)."""
    from radixtop.adapters.sglang.mirror import MirrorLoop
    from radixtop.gpu_backend.owner.handover import MirrorEnd, pair

    probe_sock, mirror_sock = pair(1 << 16)
    loop = MirrorLoop(MirrorCache(page_size=1), MirrorEnd(mirror_sock))
    loop.start()

    def read():
        for _ in range(100):  # (each chunk 2 ms of work: a slice's worth, or more)
            until = time.perf_counter() + 0.002
            while time.perf_counter() < until:
                pass
            yield
        return "read"

    try:
        assert loop.queue.call_pass(read, timeout=5.0) == "read"
    finally:
        loop.close()
        probe_sock.close()


def test_a_session_whose_tombstone_a_close_pushes_out_is_listed_open_again(monkeypatch):
    """Past the tombstones kept, a close forgets the oldest: that session, still known to the
    engine, counts as open again there, and so it is listed beside."""
    from radixtop.adapters.sglang import mirror as mirror_module

    monkeypatch.setattr(mirror_module, "TOMBSTONES", 2)
    scheduler = Scheduler(get_geometry("tiny"), 256, device="cpu", write_kv=False)
    cache = scheduler.cache
    cache.closed_session_limit = 2
    recorder = BundledRecorder(cache, scheduler)
    mirror = MirrorCache(page_size=1)
    mirror.apply(wire(recorder.snapshot()))
    beside = adapter_over(mirror, scheduler)
    for n, sid in enumerate(("a", "b", "c")):
        scheduler.request(f"r{n}", [n + 1, 9], [5], session_id=sid)
        scheduler.close_session(sid)
        mirror.apply(wire(recorder.take()))
        check_same(cache, mirror)
        check_figures(scheduler, beside)
    assert scheduler.open_session_ids() == ["a"]  # (its tombstone pushed out by c's close)


def test_the_engine_tells_the_doctor_beside_its_refused_requests_and_refuses_an_unknown_close():
    """What the process beside asks of the engine (``BundledOps``): as its waiting queue, the
    requests refused for want of slots lately, as the doctor in process reads them (it said none);
    a close of an id the engine does not know is refused, as in process."""
    from radixtop.adapters.bundled.beside import BundledOps
    from radixtop.adapters.bundled.doctor import refused_waiting
    from radixtop.adapters.errors import AdapterError
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.scheduler import OutOfSlotsError

    scheduler = Scheduler(get_geometry("tiny"), 64, device="cpu", write_kv=False)
    scheduler.begin("held", list(range(1, 41)), session_id="a")
    with pytest.raises(OutOfSlotsError):
        scheduler.begin("refused", list(range(100, 140)), session_id="b")
    ops = BundledOps(Engine(scheduler), "bundled")
    state = ops.state()
    assert refused_waiting(scheduler) == [("refused", 40)]
    assert (state["waiting"], state["head"]) == (1, ["refused", 40])
    assert [node for node, sid in state["holders"]] and state["holders"][0][1] == "a"
    with pytest.raises(AdapterError, match="no-such"):
        ops.close("no-such")
    assert ops.close("a") == {"freed_tokens": 0}  # (its request still runs: nothing freed yet)
