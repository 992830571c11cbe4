"""The session ledger kept on the REAL SGLang 0.5.16 RadixCache (sessions on) through the index's
hooks: after every operation SGLang itself does (requests that split nodes, evictions under
pressure, aborts, closes, re-registrations, a reset), every session's kept figures equal a
from-scratch attribution of SGLang's tree, every node's sessions beneath too, and a close frees
exactly the exclusive figure kept for it just before."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixtop.adapters.model import ROOT_ID
from radixtop.adapters.owned.attribution import attribute
from radixtop.adapters.sglang.index import INDEX
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.ledger.orders import ROW_KEYS
from radixtop.gpu_backend.owner.slices import run_to_end
from tests.on_sglang.ref.replay_sglang import SGLangReplayer, _parse, import_sglang
from tests.support.trace_gen import capacity_for, generate_trace


@pytest.fixture(scope="module")
def sgl():
    return import_sglang()


def check_kept(cache, adapter: SGLangInProcessAdapter) -> None:
    orders = adapter._orders
    orders.rank_min_s = orders.rank_budget = 0  # an order ranked at its read: ranked anew each time
    ledger = getattr(cache, INDEX).ledger
    adapter._known_now()
    want = attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids, set(adapter._roster.ids()),
                     ledger.seen, adapter.bpt, getattr(cache, "mirrored_close_policy", "free") == "free")
    listed = {sid for sid in orders.everyone() if orders.listed(sid)}
    assert listed == set(want.sessions)
    for sid, row in want.sessions.items():
        assert orders.row(sid) == row, sid
    assert adapter.stats().open_sessions == sum(1 for row in want.sessions.values() if not row[1])
    stack, beneath = list(cache.root_node.children.values()), {}
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if ledger.beneath(node):
            beneath[node.id] = ledger.beneath(node)
    assert beneath == dict(want.beneath.items())
    assert ledger.beneath(cache.root_node) == want.sessions_holding
    for order in ROW_KEYS:  # last activity: each session's last finished request or close, as told
        rows, total, _, _ = run_to_end(orders.page_pass(order, 0, 1000))
        assert (rows, total) == want.page(order, 0, 1000), order


def replay_kept(sgl, lines: list[str], size: str) -> tuple[SGLangReplayer, SGLangInProcessAdapter, int]:
    replayer = SGLangReplayer(sgl, capacity_for(lines, size), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    replayer.cache.enable_session_radix_cache = True
    adapter = SGLangInProcessAdapter(replayer.cache, model="tiny")
    assert adapter._orders is not None, "the ledger is kept on a RadixCache with sessions"
    ledger = getattr(replayer.cache, INDEX).ledger
    closes = 0
    for line_no, op in _parse(lines):
        before = ledger.exclusive.get(op["session"], 0) if op.get("op") == "close" else None
        result = replayer.apply(line_no, op)
        if before is not None:
            assert result["freed_tokens"] == before, (line_no, op)  # the kept figure is what it frees
            closes += 1
        check_kept(replayer.cache, adapter)
    return replayer, adapter, closes


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", range(6))
def test_the_ledger_follows_every_operation(sgl, seed, size):
    lines = generate_trace(seed, n_ops=150, max_in_flight=4, vocab=6 if seed % 2 else 400, abort_weight=3)
    replayer, adapter, closes = replay_kept(sgl, lines, size)
    assert closes > 0
    assert replayer.counters["splits"] > 0 or seed % 2 == 0
    page = adapter.sessions("exclusive_bytes", 0, 5)
    assert page.figures_age_s == 0.0 and page.figures_current
    replayer.cache.reset()
    check_kept(replayer.cache, adapter)
    assert adapter.node(ROOT_ID).sessions_beneath == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), vocab=st.sampled_from([4, 6, 40]), in_flight=st.integers(1, 6))
def test_the_ledger_follows_random_traces(seed, vocab, in_flight):
    sgl = import_sglang()
    lines = generate_trace(seed, n_ops=80, max_in_flight=in_flight, vocab=vocab, abort_weight=2)
    replay_kept(sgl, lines, "small")
