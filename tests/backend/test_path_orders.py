"""The fair-share and locked-tokens orders kept on the tree (``ledger.paths.PathSums``): a page of
the top K makes K rows, not one per session, and is current after every change."""

from __future__ import annotations

import random

import pytest

from radixtop.adapters.owned.attribution import attribute
from radixtop.gpu_backend.ledger import orders as orders_module
from radixtop.gpu_backend.owner.slices import run_to_end
from tests.support.engines import make_scheduler

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


@pytest.mark.parametrize("order", ["fair_share_bytes", "locked_tokens"])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_page_makes_its_rows_only_and_equals_a_ranking_from_scratch(order, reverse):
    s = _busy()
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


def test_a_deep_page_is_ranked_and_still_exact(monkeypatch):
    s = _busy(sessions=120)
    monkeypatch.setattr(orders_module, "PATH_PAGE_MAX", 50)
    rows, total, _, _ = _page(s, "fair_share_bytes", 60, 20)
    assert (rows, total) == _oracle(s).page("fair_share_bytes", 60, 20)


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
