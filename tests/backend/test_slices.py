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


def test_an_attribution_is_reused_for_its_budget_times_what_the_next_would_cost():
    from radixtop.adapters.owned.attribution import Attribution

    made = Attribution(key=1, taken_at=time.monotonic() - 10.0, cost_s=0.1, sessions={}, beneath={}, holding=100)
    assert made.fresh(1, 0.0, 0.0)  # nothing changed
    assert made.fresh(2, 5.0, 200)  # 10 s old, reused for 200 x 0.1 s
    assert not made.fresh(2, 5.0, 50)  # 50 x 0.1 s = 5 s: stale
    assert made.fresh(2, 5.0, 50, holding=300)  # three times the sessions: the next costs ~3x, 15 s
    assert not made.fresh(2, 5.0, 50, holding=50)  # fewer: never less than its own cost's budget
    assert made.fresh(2, 11.0, 0)  # max_age


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


def test_the_sessions_holding_count_is_kept_and_follows_a_close_shown_at_once():
    """The root's 'sessions beneath' (read by the dashboard's detail every poll) is counted once
    per attribution, and a close shown before the next pass takes its session out of it."""
    from radixtop.adapters.owned.attribution import Attribution, AttributionCache

    rows = {sid: (sid, False, tags, 0, 0, 0, 0, None) for sid, tags in (("a", 2), ("b", 1), ("c", 0))}
    cache = AttributionCache()
    cache.current = Attribution(key=1, taken_at=time.monotonic(), cost_s=0.0, sessions=rows, beneath={})
    assert cache.current.sessions_holding == 2
    cache.invalidate("a")
    assert cache.current.sessions_holding == 1
    cache.invalidate("c")  # holding nothing already: the count stands
    assert cache.current.sessions_holding == 1


def test_a_costly_attribution_is_made_again_in_slices_only_and_a_cheap_one_on_the_spot():
    """A read that finds the attribution stale starts the next pass: on the spot where the last
    one was cheap (a small cache: exact at once), in the owner's slices only where it was not, so
    that the read's own step stays short (it ran 5 ms of a large cache's pass inline)."""
    from radixtop.adapters.owned.attribution import Attribution, AttributionCache
    from radixtop.gpu_backend.owner.slices import Slices

    ran: list[int] = []

    def steps():
        for k in range(3):
            ran.append(k)
            yield
        return Attribution(key=2, taken_at=time.monotonic(), cost_s=0.0, sessions={}, beneath={})

    for cost_s, on_the_spot in ((0.5, False), (0.0001, True)):
        ran.clear()
        slices = Slices()
        cache = AttributionCache(max_age=0.0, budget=0.0, slices=slices)
        cache.current = Attribution(key=1, taken_at=time.monotonic() - 1.0, cost_s=cost_s, sessions={}, beneath={})
        served = cache.get(2, steps)
        assert served.key == (2 if on_the_spot else 1)
        assert (ran == [0, 1, 2]) if on_the_spot else (ran == [] and slices.pending == 1)
        while slices.pending:
            slices.run(idle=True)
        assert cache.current.key == 2


def test_large_maps_are_freed_a_chunk_a_step_and_a_replaced_attribution_once_no_read_holds_it():
    from radixtop.adapters.owned.attribution import Attribution, AttributionCache
    from radixtop.gpu_backend.owner.slices import RELEASE_CHUNK, Slices, released

    big, rows = {k: (k,) for k in range(3 * RELEASE_CHUNK + 1)}, list(range(RELEASE_CHUNK + 5))
    steps = released(big, rows)
    next(steps)
    assert len(big) == 2 * RELEASE_CHUNK + 1  # a chunk, not all of it
    assert sum(1 for _ in steps) == 5 and not big and not rows  # 3 more of the dict, 2 of the list

    def made(key: int) -> Attribution:
        return Attribution(key=key, taken_at=0.0, cost_s=0.0, sessions={str(k): (str(k),) for k in range(10)},
                           beneath={1: 1})

    slices = Slices()
    cache = AttributionCache(slices=slices)
    cache._done(made(1), 0.0)
    kept = cache.current.sessions
    cache._done(made(2), 0.0)
    assert slices.pending == 1  # the replaced one, which nothing holds: handed to the slices
    while slices.pending:
        slices.run(idle=True)
    assert not kept  # emptied there, a chunk a step
    held = cache.current  # a read that holds the current one when it is replaced
    cache._done(made(3), 0.0)
    assert slices.pending == 0 and held.sessions  # left to its reader


def test_after_an_action_a_read_waits_a_while_for_the_figures_made_afresh():
    """After an action (a close, an evict) the next read gets figures made afresh, even where the
    last pass was too costly to run on the spot: it drives the new pass itself, yielding between
    its steps, for up to ``fresh_wait_s``; past that it gets the last figures (stale, refreshing).
    The soak's probe saw a close's dry run differ from the page read right after an evict: the
    last pass had measured over 1 ms on a busy machine, so the page served the figures from
    before the evict."""
    from radixtop.adapters.owned.attribution import Attribution, AttributionCache
    from radixtop.gpu_backend.owner.slices import Slices

    def steps():
        for _ in range(3):
            yield
        return Attribution(key=2, taken_at=time.monotonic(), cost_s=0.0, sessions={}, beneath={})

    def read(cache: AttributionCache) -> tuple[Attribution, int]:
        reader, yields = cache.ready(2, steps), 0
        while True:
            try:
                next(reader)
            except StopIteration as done:
                return done.value, yields
            yields += 1

    for wait_s, want_key in ((60.0, 2), (0.0, 1)):
        slices = Slices()
        cache = AttributionCache(max_age=60.0, budget=0.0, slices=slices)
        cache.fresh_wait_s = wait_s
        cache.current = Attribution(key=1, taken_at=time.monotonic(), cost_s=0.5, sessions={}, beneath={})
        assert read(cache)[0].key == 1  # fresh by age: served, no pass
        cache.invalidate()
        got, yields = read(cache)
        assert got.key == want_key
        if want_key == 2:
            assert yields >= 1 and not cache.stale and not cache.refreshing  # between steps, not in one hold
        else:
            assert cache.stale and cache.refreshing and slices.pending == 1


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


def test_an_order_ranked_at_its_read_is_reused_with_its_age_and_current_rows(kept):
    """Fair share moves for every session under a node when one more joins it, so it is not kept
    sorted: its ranking is made at a read and reused a while (said by its age, not current);
    the rows of the page are made at every read."""
    first = kept.sessions("fair_share_bytes")
    assert first.figures_current and first.figures_age_s == 0.0
    add_to_session(kept, "b")
    again = kept.sessions("fair_share_bytes")
    assert not again.figures_current and again.figures_age_s > 0.0
    assert [v.id for v in again.sessions] == [v.id for v in first.sessions]  # the same ranking
    want = {sid: row[1:7] for sid, row in exact(kept).sessions.items()}
    assert figures(again) == want  # its rows as they are now
    kept.engine.call(lambda s: setattr(s.orders, "rank_min_s", 0.0) or setattr(s.orders, "rank_budget", 0))
    fresh = kept.sessions("fair_share_bytes")
    assert fresh.figures_current
    assert [v.id for v in fresh.sessions] == sorted(want, key=lambda sid: (-want[sid][4], sid))


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
