"""A wide node's kept child orders (``adapters.bundled.child_order``) stay exact while the tree
changes: between reads and between the slices of one read, whatever the change (a new child, a
split, a refreshed access time, an eviction, a session closed, the tree dropped)."""

from __future__ import annotations

import random
import threading

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.bundled.child_order import CHILD_KEYS
from radixtop.adapters.model import ROOT_ID
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler

WIDTH = 3000
"""Root children: wider than SORT_CHUNK, so its pages come from the kept orders."""


@pytest.fixture
def engine():
    s = Scheduler(get_geometry("tiny"), 40 * WIDTH, device="cpu")
    for i in range(WIDTH):
        s.request(f"r{i}", [10_000 + i, i % 7], [1 + i % 3], f"s{i % 50}")
    engine = Engine(s, None).start()
    yield engine
    engine.stop()


def mutate(s: Scheduler, rng: random.Random, step: int) -> None:
    """A few changes of every kind that moves a root child in some order."""
    for k in range(8):
        i = rng.randrange(WIDTH + 500)
        kind = rng.randrange(6)
        if kind == 0:  # a new child, or a longer prompt under one (its subtree grows)
            s.request(f"m{step}-{k}", [10_000 + i, i % 7, rng.randrange(50)], [3], f"s{rng.randrange(60)}")
        elif kind == 1:  # a prompt that diverges inside a child: a split, the head takes its place
            s.request(f"d{step}-{k}", [10_000 + i, 99, 98], [4], None)
        elif kind == 2:  # a read of a prefix: access times refreshed (not journaled)
            s.cache.match_prefix([10_000 + i])
        elif kind == 3:
            s.evict(rng.randrange(1, 40))
        elif kind == 4:
            s.close_session(f"s{rng.randrange(60)}")
        else:  # a child of its own
            s.request(f"n{step}-{k}", [30_000 + rng.randrange(10**6)], [5], None)


def checked_page(adapter: BundledAdapter, order: str, offset: int, limit: int):
    """A page read as the adapter reads it, and the oracle ranked in the same slice it ends in."""

    def read(s):
        page = yield from adapter._children_pass(s, ROOT_ID, offset, limit, order)
        oracle = sorted(s.cache.root_node.children.values(), key=CHILD_KEYS[order])
        return ([v.id for v in page.children], page.total), ([n.id for n in oracle[offset: offset + limit]],
                                                             len(oracle))

    return adapter.engine.owner.call_pass(lambda: read(adapter.engine.scheduler), 60)


@pytest.mark.parametrize("order", ["bytes", "recency", "tokens"])
def test_kept_orders_stay_exact_between_reads(engine, order):
    adapter, rng = BundledAdapter(engine), random.Random(order)
    for step in range(40):
        offset = rng.choice([0, 5, WIDTH // 2, WIDTH - 50, rng.randrange(WIDTH)])
        got, expected = checked_page(adapter, order, offset, 100)
        assert got == expected, (step, offset)
        engine.call(lambda s, step=step: mutate(s, rng, step))
    assert engine.call(lambda s: ROOT_ID in s.cache.child_watch)  # (the kept order was the one read)
    assert adapter._child_orders.rankings == 1  # ranked once: every move since was named and re-keyed


def test_kept_orders_stay_exact_while_the_tree_changes_between_slices(engine):
    adapter, rng, stop = BundledAdapter(engine), random.Random(7), threading.Event()

    def churn() -> None:
        step = 0
        while not stop.is_set():
            engine.call(lambda s, step=step: mutate(s, rng, step))
            step += 1

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        for step in range(60):
            order = ("bytes", "recency", "tokens")[step % 3]
            got, expected = checked_page(adapter, order, random.Random(step).randrange(WIDTH), 50)
            assert got == expected, (step, order)
        assert adapter._child_orders.rankings == 3  # one per order
    finally:
        stop.set()
        churner.join(30)


def test_a_dropped_tree_and_a_forgotten_order_are_ranked_again(engine):
    adapter = BundledAdapter(engine)
    assert checked_page(adapter, "bytes", 10, 20)[0] == checked_page(adapter, "bytes", 10, 20)[1]

    def drop(s):
        s.cache.reset()
        s.pool.allocator.clear()
        for i in range(WIDTH):
            s.request(f"again{i}", [20_000 + i], [1], None)

    engine.call(drop, 60)
    got, expected = checked_page(adapter, "bytes", 10, 20)
    assert got == expected and expected[1] == WIDTH
    adapter._child_orders._forget(engine.scheduler.cache, ROOT_ID)
    assert not engine.call(lambda s: s.cache.child_watch)  # nothing watched: the hot paths pay nothing
    got, expected = checked_page(adapter, "recency", 0, 20)
    assert got == expected
