"""The session ledger kept on the REAL SGLang 0.5.23 UnifiedRadixCache (Python tree core, sessions
on: the deref policy) through the index's hooks: after every operation the cache does itself
(requests that split nodes, aborts, evictions, closes), every session's kept figures equal a
from-scratch attribution of the tree, and every node's sessions beneath. Collected only beside
sglang 0.5.23."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixtop.adapters.owned.attribution import attribute
from radixtop.adapters.sglang.index import INDEX
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.sglang.trees import FULL
from radixtop.gpu_backend.ledger.orders import ROW_KEYS
from radixtop.gpu_backend.owner.slices import run_to_end
from tests.on_sglang.ref import drive23


def check_kept(cache, adapter: SGLangInProcessAdapter) -> None:
    orders, tree = adapter._orders, adapter.tree
    orders.rank_min_s = orders.rank_budget = 0  # an order ranked at its read: ranked anew each time
    ledger = getattr(cache, INDEX).ledger
    adapter._known_now()
    want = attribute(tree.root, tree.session_leaves(), tree.closed(), set(adapter._roster.ids()), ledger.seen, adapter.bpt,
                     False, lock_ref=tree.lock_ref)
    listed = {sid for sid in orders.everyone() if orders.listed(sid)}
    assert listed == set(want.sessions)
    for sid, row in want.sessions.items():
        assert orders.row(sid) == row, sid
    beneath = {n.id: ledger.beneath(n) for n in drive23.iter_nodes(cache) if ledger.beneath(n)}
    assert beneath == dict(want.beneath.items())
    for order in ROW_KEYS:
        rows, total, _, _ = run_to_end(orders.page_pass(order, 0, 1000))
        assert (rows, total) == want.page(order, 0, 1000), order


def drive(seed: int, steps: int = 150, n_sessions: int = 5) -> None:
    rng = random.Random(seed)
    cache, pools = drive23.build_unified_cache23(600, tree_core_backend="python")
    adapter = SGLangInProcessAdapter(cache, model="tiny")
    assert adapter._orders is not None, "the ledger is kept on a UnifiedRadixCache with sessions"
    assert cache.components[FULL] is not None
    prompts = [[rng.randrange(2, 40) for _ in range(rng.randint(4, 20))] for _ in range(6)]
    running = []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.55 or not running:
            tokens = rng.choice(prompts)[: rng.randint(1, 20)] + [rng.randrange(2, 60) for _ in range(rng.randint(1, 12))]
            sid = f"s{rng.randrange(n_sessions)}" if rng.random() < 0.7 else None
            try:
                running.append(drive23.begin_request(cache, pools, tokens, session_id=sid))
            except RuntimeError:
                pass
        elif roll < 0.85:
            req = running.pop(rng.randrange(len(running)))
            drive23.finish_request(cache, pools, req, [rng.randrange(2, 60) for _ in range(rng.randint(1, 5))],
                                   abort=rng.random() < 0.1)
        elif roll < 0.93:
            drive23.evict(cache, rng.randint(1, 60))
        else:
            drive23.close_session(cache, f"s{rng.randrange(n_sessions)}")
        check_kept(cache, adapter)
    for req in running:
        drive23.finish_request(cache, pools, req, [7])
    check_kept(cache, adapter)
    drive23.evict(cache, 10_000)
    check_kept(cache, adapter)


@pytest.mark.parametrize("seed", range(4))
def test_the_ledger_follows_every_operation(seed):
    drive(seed)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_sessions=st.integers(1, 8))
def test_the_ledger_follows_random_runs(seed, n_sessions):
    drive(seed, steps=80, n_sessions=n_sessions)
