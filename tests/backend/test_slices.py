"""Long passes in slices between the owner's steps, and the attribution served while a new one
runs in them (stale while revalidate)."""

from __future__ import annotations

import logging
import time

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.owned.attribution import attribute
from radixtop.gpu_backend.owner.queue import OwnerQueue
from radixtop.gpu_backend.owner.slices import Slices
from tests.support.engines import build_engine


def counting(n: int, seen: list[int], fail_at: int | None = None):
    for k in range(n):
        if k == fail_at:
            raise ValueError("boom")
        seen.append(k)
        yield


def test_a_slice_of_zero_seconds_resumes_a_pass_once():
    slices, seen = Slices(slice_s=0.0, duty=1.0), []
    slices.add(counting(3, seen))
    for expected in ([0], [0, 1], [0, 1, 2]):
        slices.run()
        assert seen == expected and slices.pending == 1
    slices.run()  # the pass returns
    assert slices.pending == 0 and slices.run() == 0.0


def test_passes_run_oldest_first_within_a_slice():
    slices, first, second = Slices(slice_s=60.0, duty=1.0), [], []
    slices.add(counting(2, first))
    slices.add(counting(2, second))
    slices.run()  # a long slice: both end in it, the first before the second starts
    assert first == [0, 1] and second == [0, 1] and slices.pending == 0
    assert slices.work_s > 0


def test_a_pass_that_fails_is_dropped_and_logged_and_the_others_go_on(caplog):
    slices, bad, good = Slices(slice_s=60.0, duty=1.0), [], []
    slices.add(counting(5, bad, fail_at=1))
    slices.add(counting(2, good))
    with caplog.at_level(logging.ERROR, logger="radixtop.slices"):
        slices.run()
    assert bad == [0] and good == [0, 1] and slices.pending == 0
    assert "failed; it is dropped" in caplog.text and "boom" in caplog.text


def test_a_busy_owner_keeps_its_share_and_an_idle_one_runs_passes_flat_out():
    def sleepy(seen):
        for k in range(3):
            time.sleep(0.05)
            seen.append(k)
            yield

    slices, seen = Slices(slice_s=0.0, duty=0.01), []
    slices.add(sleepy(seen))
    assert slices.run() >= 0.05 and seen == [0]
    assert slices.run() == 0.0 and seen == [0]  # 99% of the next ~5 s are the owner's
    slices.run(idle=True)  # nothing else to do: no share to keep
    assert seen == [0, 1]


def test_an_owner_queue_step_runs_a_slice():
    owner, seen = OwnerQueue("test"), []
    owner.slices.slice_s = 0.0
    owner.slices.add(counting(2, seen))
    owner.between_steps()
    assert seen == [0]


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_idle_engine_runs_its_passes_and_still_takes_commands():
    engine = build_engine()
    try:
        seen: list[int] = []
        engine.call(lambda s: engine.slices.add(counting(50, seen)))
        assert engine.call(lambda s: s.cache.node_count()) > 0  # commands between the slices
        wait_until(lambda: len(seen) == 50 and engine.call(lambda s: engine.slices.pending) == 0)
    finally:
        engine.stop()


@pytest.fixture
def kept():
    engine = build_engine()
    yield BundledAdapter(engine)
    engine.stop()


def exact(adapter: BundledAdapter):
    """An attribution of the cache as it is now, from scratch, in one go (the oracle)."""
    def run(s):
        c = s.cache
        return attribute(c.root_node, c._session_leaves, c._closed_session_ids, s.session_activity,
                         s.session_activity, s.geometry.bytes_per_token)
    return adapter.engine.call(run)


def add_to_session(adapter: BundledAdapter, session: str) -> None:
    adapter.engine.call(lambda s: s.request(f"more-{session}-{time.monotonic_ns()}", [60, 61, 62], [63], session))


def figures(page) -> dict[str, tuple]:
    return {v.id: (v.state == "closed", v.tagged_nodes, v.exclusive_bytes, v.shared_bytes, v.fair_share_bytes,
                   v.locked_tokens) for v in page.sessions}


def test_every_read_is_current_after_a_change_and_an_action(kept):
    """The figures a read gets are the cache's at that step: right after a request, and right
    after a close, with no pass to wait for (age 0, current)."""
    first = kept.sessions("id")
    assert first.figures_age_s == 0.0 and first.figures_current and not first.refreshing
    add_to_session(kept, "b")
    page = kept.sessions("id")
    want = {sid: row[1:7] for sid, row in exact(kept).sessions.items()}
    assert figures(page) == want
    assert figures(page)["b"][2] > figures(first)["b"][2]  # b holds more now
    kept.close_session("c")
    page = kept.sessions("id")
    assert figures(page) == {sid: row[1:7] for sid, row in exact(kept).sessions.items()}
    assert figures(page)["c"][:3] == (True, 0, 0)


def test_the_faces_note_old_figures_only():
    from radixtop.adapters.text import figures_note

    assert figures_note(0.4, False) == "figures 0s old"  # always said: the operator acts on them
    assert figures_note(1080.0, False, current=True) == "unchanged since 18m ago"
    assert figures_note(0.0, False, current=True) == "figures current"
    assert figures_note(40.0, False) == "figures 40s old"
    assert figures_note(130.0, True) == "figures 2m old, refreshing"


def test_an_attribution_pass_survives_the_session_maps_changing_between_its_slices():
    """The known and closed sessions are the owner's live maps: between two slices of a pass the
    engine adds and drops sessions. The pass never fails on it (it failed with 'dictionary
    changed size during iteration', and a sessions read with it)."""
    from radixtop.adapters.owned.attribution import attribution_pass

    engine = build_engine()
    try:
        s = engine.scheduler
        known = {f"k{i}": float(i) for i in range(5000)}
        closed = {f"c{i}" for i in range(5000)}
        cache = s.cache
        steps = attribution_pass(cache.root_node, cache._session_leaves, closed, known, known,
                                  s.geometry.bytes_per_token, chunk=16)
        turns = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result = done.value
                break
            turns += 1
            known[f"new{turns}"] = 0.0  # what the engine does between two slices
            closed.add(f"gone{turns}")
            known.pop(f"k{turns}", None)
        assert turns > 10 and "k4999" in result.sessions and "c4999" in result.sessions
    finally:
        engine.stop()


def test_large_maps_are_freed_a_chunk_a_step():
    from radixtop.gpu_backend.owner.slices import RELEASE_CHUNK, released

    big, rows = {k: (k,) for k in range(3 * RELEASE_CHUNK + 1)}, list(range(RELEASE_CHUNK + 5))
    steps = released(big, rows)
    next(steps)
    assert len(big) == 2 * RELEASE_CHUNK + 1  # a chunk, not all of it
    assert sum(1 for _ in steps) == 5 and not big and not rows  # 3 more of the dict, 2 of the list


class FakeClock:
    """``time.perf_counter`` for a module under test: moves only when a step says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_a_slice_starts_no_step_it_expects_to_run_past_its_end(monkeypatch):
    """A step runs only where the longest step of late still fits before the slice ends (the first
    always runs): a slice of 3.25 ms whose steps take 2 ms runs one, not two (a hold of 4 ms), and a
    step of 7 ms makes the next slices take one step each until it is forgotten."""
    import radixtop.gpu_backend.owner.slices as slices_module

    clock = FakeClock()
    monkeypatch.setattr(slices_module, "time", clock)

    def timed(costs: list[float], seen: list[float]):
        for cost in costs:
            clock.now += cost
            seen.append(cost)
            yield

    seen: list[float] = []
    slices = Slices(slice_s=0.00325, duty=1.0)
    slices.add(timed([0.002] * 6, seen))
    slices.run()
    assert seen == [0.002]  # 2 ms spent, the next 2 ms would end at 4 ms: past the slice
    slices.run()
    assert len(seen) == 2
    seen.clear()
    slices = Slices(slice_s=0.00325, duty=1.0)
    slices.add(timed([0.0005] * 6 + [0.007] + [0.0005] * 2000, seen))
    slices.run()
    assert seen == [0.0005] * 6  # 3 ms: a seventh would end past 3.25 ms
    slices.run()
    assert seen[6:] == [0.007]  # the first step of a slice always runs
    per_slice = []
    for _ in range(200):
        before = len(seen)
        slices.run()
        per_slice.append(len(seen) - before)
    assert per_slice[:20] == [1] * 20  # while 7 ms is remembered, one step fills a slice
    assert max(per_slice) >= 5  # forgotten at last: several 0.5 ms steps a slice again


def test_the_fair_share_order_is_current_at_every_read(kept):
    """Fair share moves for every session under a node when one more joins it: the order is kept
    on the tree (``PathSums``), so a read after the change ranks the sessions as they are now."""
    first = kept.sessions("fair_share_bytes")
    assert first.figures_current and first.figures_age_s == 0.0
    add_to_session(kept, "b")
    again = kept.sessions("fair_share_bytes")
    assert again.figures_current and again.figures_age_s == 0.0
    want = {sid: row[1:7] for sid, row in exact(kept).sessions.items()}
    assert figures(again) == want
    assert [v.id for v in again.sessions] == sorted(want, key=lambda sid: (-want[sid][4], sid))


def test_a_filtered_fair_share_page_is_current_at_every_read(kept):
    """A filtered page in a path order is walked on the tree like any other (it was ranked from
    every session's row and reused a while with its age): current after a change."""
    first = kept.sessions("fair_share_bytes", contains="a")
    assert first.figures_current and first.figures_age_s == 0.0
    add_to_session(kept, "b")
    add_to_session(kept, "a")
    again = kept.sessions("fair_share_bytes", contains="a")
    assert again.figures_current and again.figures_age_s == 0.0
    want = {sid: row[1:7] for sid, row in exact(kept).sessions.items() if "a" in sid}
    assert figures(again) == want
    assert [v.id for v in again.sessions] == sorted(want, key=lambda sid: (-want[sid][4], sid))


def test_an_order_whose_first_read_was_dropped_is_made_again():
    """A read dropped midway through making an order (its caller timed out, the owner stopped)
    leaves no half-made order behind: the next read makes it and answers."""
    from radixtop.gpu_backend.ledger.orders import CHUNK
    from radixtop.gpu_backend.owner.slices import run_to_end
    from tests.support.engines import make_scheduler

    s = make_scheduler(4096, 1, "lru", "free")
    for k in range(CHUNK + 50):
        s.request(f"r{k}", [1, 2, k + 10], [], f"s{k:04d}")
    first = s.orders.page_pass("tagged_nodes", 0, 5)
    while "tagged_nodes" not in s.orders._orders:  # past the count of the sessions that moved
        next(first)
    next(first)  # the order made in part (it yields every CHUNK sessions)
    assert not s.orders._orders["tagged_nodes"].ready
    first.close()  # dropped
    rows, total, _, _ = run_to_end(s.orders.page_pass("tagged_nodes", 0, 5))
    assert total == CHUNK + 50 and [r[0] for r in rows] == [f"s{k:04d}" for k in range(5)]


def test_the_owner_pass_survives_a_node_with_a_chunk_of_children_changing_between_its_slices():
    """The close rule's pass reads a node's children and yields after every ``chunk`` of them:
    with exactly ``chunk`` children it yielded inside its walk of the live dict, and a child the
    owner added meanwhile failed it ('dictionary changed size during iteration'; hypothesis found
    it)."""
    from radixtop.gpu_backend.session_rules import exclusive_tokens_pass

    class Node:
        def __init__(self, parent, key):
            self.parent, self.children, self.key, self.lock_ref = parent, {}, key, 0
            self.session_ids = {"s"} if len(key) == 2 else None  # the leaves: the session's tags

    def node(parent, key):
        n = Node(parent, key)
        if parent is not None:
            parent.children[len(parent.children)] = n
        return n

    for change_at in range(8):  # the owner adds a child to the node between two slices: each in turn
        root = node(None, [])
        top = node(root, [1])
        leaves = [node(top, [2, k]) for k in range(4)]  # a chunk of children
        steps = exclusive_tokens_pass(root, {"s": leaves}, chunk=4)
        for turn in range(100):
            try:
                next(steps)
            except StopIteration as done:
                assert done.value["s"] in (8, 9)  # top, changed meanwhile, may count for no one
                break
            if turn == change_at:
                node(top, [3])
        else:
            raise AssertionError("the pass did not end")


def test_no_step_of_an_order_made_or_ranked_works_over_every_session():
    """At 1M nodes and 50k sessions a step that copies, sorts or frees every session's id holds
    the owner 4-116 ms (their objects lie far apart in memory). An order's making and a ranking
    walk the roster a chunk a step, sort runs and merge them a chunk a step; no step keys more
    than a chunk of sessions, and none lists every session again after the orders are made."""
    from radixtop.gpu_backend.ledger import orders as orders_module
    from radixtop.gpu_backend.ledger import paths as paths_module
    from radixtop.gpu_backend.owner.slices import run_to_end
    from tests.support.engines import make_scheduler

    s = make_scheduler(capacity=20_000)
    for k in range(1200):
        s.request(f"r{k}", [1, 2, 3, k % 7, k + 10], [5], f"s{k}")
    orders = s.orders
    orders.everyone = lambda: (_ for _ in ()).throw(AssertionError("every session listed again"))
    calls = [0]

    def counted(table):
        return {order: (lambda *a, _key=key: (calls.__setitem__(0, calls[0] + 1), _key(*a))[1])
                for order, key in table.items()}

    real_end = paths_module.PathSums._re_end

    def counted_end(self, sid):
        calls[0] += 1
        return real_end(self, sid)

    for order, table in (("exclusive_bytes", "KEY_OF"), ("fair_share_bytes", None)):
        if table is None:  # kept on the tree: the sessions re-ended a chunk a step
            paths_module.PathSums._re_end = counted_end
            real = None
        else:
            real = getattr(orders_module, table)
            setattr(orders_module, table, counted(real))
        try:
            steps, most = orders.page_pass(order, 0, 10), 0
            while True:
                calls[0] = 0
                try:
                    next(steps)
                except StopIteration as done:
                    rows, total, listed, _ = done.value
                    break
                finally:
                    most = max(most, calls[0])
        finally:
            if table is None:
                paths_module.PathSums._re_end = real_end
            else:
                setattr(orders_module, table, real)
        assert total == listed == 1200 and len(rows) == 10, order
        assert 0 < most <= max(orders_module.MAKE_CHUNK, orders_module.ROWS_CHUNK, paths_module.CHUNK), (order, most)
    assert [r[0] for r in run_to_end(orders.page_pass("fair_share_bytes", 0, 5))[0]] == \
        [r[0] for r in sorted((orders.row(f"s{k}") for k in range(1200)), key=orders_module.ROW_KEYS["fair_share_bytes"])[:5]]


def test_the_sets_the_orders_drain_by_pop_are_made_anew_once_empty():
    """A set keeps its table when emptied by pop(): drained after the attach (every session), each
    later pop of its few entries scanned the empty slots (64 pops: 2.2 ms, against 9 us)."""
    import sys

    from radixtop.gpu_backend.owner.slices import run_to_end
    from tests.support.engines import make_scheduler

    s = make_scheduler(capacity=20_000)
    for k in range(3000):
        s.request(f"r{k}", [1, 2, k % 7, k + 10], [5], f"s{k}")
    orders = s.orders
    run_to_end(orders.page_pass("exclusive_bytes", 0, 10))  # the attach: every session moved
    small = sys.getsizeof(set())
    assert sys.getsizeof(orders._recount) == small
    assert all(sys.getsizeof(order.pending) == small for order in orders._orders.values())


def test_no_table_the_orders_keep_per_session_is_one_hash_table():
    """A set or dict of every session grows, and (sessions coming and going) fills its deleted
    slots, by rebuilding its whole table in one insert: at 50k sessions under the bundled engine's
    workload a step that added one session held the owner 3-4 ms (a new 4 MiB table, 1,024 page
    faults). The orders' maps of every session are sharded: no one table holds an eighth of them."""
    from radixtop.gpu_backend.owner.slices import run_to_end
    from tests.support.engines import make_scheduler

    s = make_scheduler(capacity=20_000)
    for k in range(3000):
        s.request(f"r{k}", [1, 2, k % 7, k + 10], [5], f"s{k}")
    orders = s.orders
    run_to_end(orders.page_pass("exclusive_bytes", 0, 10))
    assert orders.open_count() == 3000

    def tables(values):
        for value in values:
            if isinstance(value, (set, dict)):
                yield value
            elif hasattr(value, "shards"):
                yield from value.shards

    kept = [getattr(order, name) for order in orders._orders.values() for name in type(order).__slots__]
    biggest = max(map(len, tables([*vars(orders).values(), *kept])))
    assert biggest <= 3000 // 8, biggest
