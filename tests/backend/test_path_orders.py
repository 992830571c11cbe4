"""The fair-share and locked-tokens orders kept on the tree (``ledger.paths.PathSums``): a page of
the top K makes K rows, not one per session, and is current after every change."""

from __future__ import annotations

import random

import pytest

from radixtop.adapters.owned.attribution import attribute
from radixtop.gpu_backend.ledger import orders as orders_module
from radixtop.gpu_backend.owner.slices import run_to_end
from tests.support.engines import make_scheduler, stepped

SYSTEMS = [[100 + k, 200 + k, 300 + k] for k in range(5)]


def _busy(sessions: int = 400, seed: int = 7):
    """``sessions`` sessions over 5 shared system prompts, one or two turns each, some branching
    (a second turn that does not extend the first), one in three still running (locked)."""
    rng = random.Random(seed)
    s = make_scheduler(capacity=60_000)
    tok = iter(range(1000, 10**7))
    for k in range(sessions):
        sid = f"s{k:04d}"
        first = rng.choice(SYSTEMS) + [next(tok) for _ in range(rng.randint(1, 6))]
        s.request(f"{sid}-1", first, [next(tok)], sid)
        if rng.random() < 0.5:
            again = first + [next(tok) for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.2:  # a branch: the session's paths no longer one
                again = first[:4] + [next(tok) for _ in range(3)]
            s.request(f"{sid}-2", again, [next(tok)], sid)
        if k % 3 == 0:
            s.begin(f"{sid}-run", first + [next(tok)], sid)
    for k in range(20):
        s.register_session(f"idle{k:02d}")  # listed, holding nothing: figure 0
    return s


def _oracle(s):
    cache = s.cache
    return attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids,
                     s.session_activity, s.session_activity, s.orders.bpt, cache.close_policy != "deref")


def _page(s, order, offset=0, limit=20, reverse=False):
    return run_to_end(s.orders.page_pass(order, offset, limit, reverse=reverse))


def _counting_rows(orders):
    made = []
    row = orders.row

    def counted(sid):
        made.append(sid)
        return row(sid)

    orders.row = counted
    return made


LLAMA_3_8B = 131_072
"""llama-3-8b's KV bytes per token (the tests' tiny model has 256): fair shares of 10^8-10^9 bytes."""


@pytest.mark.parametrize("order", ["fair_share_bytes", "locked_tokens"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("bpt", [None, LLAMA_3_8B])
def test_a_page_makes_its_rows_only_and_equals_a_ranking_from_scratch(order, reverse, bpt):
    """(At a real model's bytes per token too: a sum in bytes is near a half only where it truly
    is, so the walk keys its sessions by the sums, not by each one's row.)"""
    s = _busy()
    if bpt:
        s.orders.bpt = bpt
    _page(s, order, reverse=reverse)  # the first read makes the order (every session once)
    s.request("late", SYSTEMS[0] + [9_000_001, 9_000_002], [9_000_003], "s0001")  # moves every s on SYSTEMS[0]
    made = _counting_rows(s.orders)
    rows, total, listed, age = _page(s, order, 0, 20, reverse)
    want_rows, want_total = _oracle(s).page(order, 0, 20, reverse=reverse)
    assert (rows, total) == (want_rows, want_total)
    assert age == 0.0 and listed == total
    assert len(made) <= 40, f"{len(made)} rows made for a page of 20 of {total} sessions"


@pytest.mark.parametrize("order", ["fair_share_bytes", "locked_tokens"])
def test_every_page_is_current_as_the_tree_changes(order):
    s = _busy(sessions=200, seed=3)
    rng = random.Random(5)
    tok = iter(range(20_000_000, 30_000_000))
    running = []
    for step in range(60):
        what = rng.random()
        sid = f"s{rng.randrange(200):04d}"
        if what < 0.3:
            rid = f"x{step}"
            s.begin(rid, rng.choice(SYSTEMS) + [next(tok) for _ in range(rng.randint(0, 3))], sid)
            running.append(rid)
        elif what < 0.5 and running:
            s.finish(running.pop(rng.randrange(len(running))), [next(tok)])
        elif what < 0.65:
            s.close_session(sid)
        elif what < 0.8:
            s.evict(rng.randint(1, 40))
        else:  # an insert that splits a shared node
            s.request(f"y{step}", rng.choice(SYSTEMS)[:2] + [next(tok)], [next(tok)], sid)
        want = _oracle(s)
        for reverse in (False, True):
            offset = rng.choice((0, 0, 7, 150))
            rows, total, _, age = _page(s, order, offset, 25, reverse)
            assert (rows, total) == want.page(order, offset, 25, reverse=reverse), (step, reverse, offset)
            assert age == 0.0


@pytest.mark.parametrize("order", ["fair_share_bytes", "locked_tokens"])
def test_deep_and_filtered_pages_are_walked_current_and_exact(order):
    """A page far down the order, or of the sessions that match a filter, is exact and current
    (age 0) with no ranking of every session (which made every listed session's row and was
    reused with its age): walked on the tree, making the page's rows only, or, where few
    sessions match, those sessions' rows ranked."""
    s = _busy(sessions=420)
    _page(s, order)  # the order made
    made = _counting_rows(s.orders)
    want = _oracle(s)
    for offset, limit, contains, reverse in ((300, 25, "", False), (60, 20, "", True), (0, 10, "s01", False),
                                             (5, 10, "s02", True), (0, 50, "closed", False), (0, 5, "idle", True)):
        made.clear()
        rows, total, listed, age = run_to_end(s.orders.page_pass(order, offset, limit, contains, reverse))
        assert (rows, total) == want.page(order, offset, limit, contains, reverse=reverse), (offset, contains)
        assert listed == len(want.sessions) and age == 0.0
        if total * total <= (offset + limit) * listed:
            assert len(made) == total, (offset, contains)  # the matching sessions' rows
        else:
            assert len(made) == len(rows), (offset, contains)  # only the page's rows
    assert not s.orders._ranked


@pytest.mark.parametrize("bpt", [None, LLAMA_3_8B])
def test_a_walk_in_steps_keeps_the_order_it_settled_while_the_tree_moves(monkeypatch, bpt):
    """A deep page's walk runs in steps; the owner changes the tree between them. The page is
    the order as of the step that settled it (the oracle then), its rows as of their own steps.
    Another read meanwhile does not wait for it (a read run in one hold could not): it answers
    at once from the same settled sums, saying their age; the next read after the walk settles
    and is current again."""
    s = _busy(sessions=300)
    if bpt:
        s.orders.bpt = bpt
    _page(s, "fair_share_bytes")
    monkeypatch.setattr(orders_module, "STEP_S", 0.0)  # a step after every 8 sessions walked
    read = s.orders.page_pass("fair_share_bytes", 150, 40)
    sums = s.orders._paths["fair_share_bytes"]
    while not sums.walking:
        next(read)  # settled (nothing moved), then the walk begun
    oracle = _oracle(s)
    want = oracle.page("fair_share_bytes", 150, 40)
    s.request("late", SYSTEMS[0] + [9_999_990], [9_999_991], "s0001")  # the tree moves between steps
    s.close_session("s0002")
    rows, total, _, age = stepped(s.orders.page_pass("fair_share_bytes", 0, 10))[0]  # another read
    assert [r[0] for r in rows] == [r[0] for r in oracle.page("fair_share_bytes", 0, 10)[0]]
    assert age > 0.0  # the order as of the walk's settle, said so
    rows, total, _, age = stepped(read)[0]
    assert age == 0.0
    assert [r[0] for r in rows] == [r[0] for r in want[0]] and total == want[1]
    assert not sums.walking
    rows, total, _, age = stepped(s.orders.page_pass("fair_share_bytes", 0, 10))[0]
    assert (rows, total) == _oracle(s).page("fair_share_bytes", 0, 10) and age == 0.0


def test_a_walk_left_paused_too_long_is_started_again(monkeypatch):
    """A walk whose reader stopped driving it (never resumed, never closed) keeps the sums as
    they were for at most ``WALK_HOLD_S``: then a read settles them, and the walk, resumed, starts
    again over the new sums (exact as of that settle)."""
    from radixtop.gpu_backend.ledger import paths as paths_module

    s = _busy(sessions=200)
    _page(s, "fair_share_bytes")
    monkeypatch.setattr(orders_module, "STEP_S", 0.0)
    read = s.orders.page_pass("fair_share_bytes", 100, 30)
    sums = s.orders._paths["fair_share_bytes"]
    while not sums.walking:
        next(read)
    s.close_session("s0003")
    monkeypatch.setattr(paths_module, "WALK_HOLD_S", 0.0)  # held too long
    assert stepped(s.orders.page_pass("fair_share_bytes", 0, 10))[0][3] == 0.0  # settled: current
    want = _oracle(s).page("fair_share_bytes", 100, 30)
    rows, total, _, age = stepped(read)[0]
    assert (rows, total) == want and age == 0.0


def test_a_costly_walk_is_reused_a_while_with_its_age_and_its_rows_current(monkeypatch):
    """A page whose walk cost more than ``WALK_REUSE_S`` (far down the order at 1M nodes: ~250 ms)
    keeps its ids for ``rank_budget`` times that work: the same read again walks nothing, says
    its order's age, and makes its rows anew; a cheap walk is never reused."""
    s = _busy(sessions=300)
    _page(s, "fair_share_bytes")
    first = _page(s, "fair_share_bytes", 150, 20)
    s.close_session(first[0][0][0])  # the page's first session closes
    assert _page(s, "fair_share_bytes", 150, 20)[3] == 0.0  # cheap: walked again, current
    monkeypatch.setattr(orders_module, "WALK_REUSE_S", 0.0)  # every walk costly
    kept = _page(s, "fair_share_bytes", 150, 20)
    s.close_session(kept[0][1][0])
    made = _counting_rows(s.orders)
    rows, total, _, age = _page(s, "fair_share_bytes", 150, 20)
    assert age > 0.0 and len(made) == len(rows) == 20
    assert [r[0] for r in rows] == [r[0] for r in kept[0]]  # the same ids...
    assert rows[1][1] is True and not kept[0][1][1]  # ...their rows made anew: this one closed since
    s.orders.rank_budget = 0  # reused for no time: walked again
    assert _page(s, "fair_share_bytes", 150, 20)[3] == 0.0


def test_a_dropped_walk_lets_the_next_read_settle(monkeypatch):
    s = _busy(sessions=200)
    _page(s, "fair_share_bytes")
    monkeypatch.setattr(orders_module, "STEP_S", 0.0)
    read = s.orders.page_pass("fair_share_bytes", 100, 50, contains="s0")
    sums = s.orders._paths["fair_share_bytes"]
    while not sums.walking:
        next(read)
    read.close()
    assert not sums.walking
    s.close_session("s0003")
    assert _page(s, "fair_share_bytes")[:2] == _oracle(s).page("fair_share_bytes", 0, 20)


def test_a_wide_node_keeps_its_children_sorted_and_pages_exact():
    s = make_scheduler(capacity=20_000)
    for k in range(300):  # 300 children of the root, one session each, of different lengths
        s.request(f"w{k}", [5_000 + k] + list(range(10_000 + 10 * k, 10_000 + 10 * k + k % 9)), [1], f"w{k:03d}")
    for reverse in (False, True):
        rows, total, _, _ = _page(s, "fair_share_bytes", 0, 30, reverse)
        assert (rows, total) == _oracle(s).page("fair_share_bytes", 0, 30, reverse=reverse)
    entry = s.orders._paths["fair_share_bytes"].entries.get(s.cache.root_node)
    assert entry is not None and entry.by_hi is not None and len(entry.by_hi) == 300


def test_a_path_order_dropped_while_made_stops_listening():
    s = _busy(sessions=50)
    ledger = s.cache.ledger
    before = len(ledger.watches)
    read = s.orders.page_pass("fair_share_bytes", 0, 10)
    next(read)  # its making started, then the reader went away
    read.close()
    assert "fair_share_bytes" not in s.orders._paths
    assert len(ledger.watches) == before
    rows, total, _, _ = _page(s, "fair_share_bytes")
    assert (rows, total) == _oracle(s).page("fair_share_bytes", 0, 20)
