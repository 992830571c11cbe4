"""The TreeIndex over the REAL SGLang 0.5.16 RadixCache: after every operation SGLang itself does
(inserts that split nodes, evictions, session closes, aborts, a reset), the nodes by id and every
subtree's tokens equal a walk of the tree; and what the adapter counts equals SGLang's own calls."""

from __future__ import annotations

import pytest

from radixtop.adapters.model import ROOT_ID
from radixtop.adapters.sglang.index import INDEX
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from tests.on_sglang.ref.replay_sglang import SGLangReplayer, _parse, import_sglang
from tests.support.engines import stepped
from tests.support.trace_gen import capacity_for, generate_trace

SEEDS = range(8)


@pytest.fixture(scope="module")
def sgl():
    return import_sglang()


def replay_checked(sgl, lines: list[str], size: str) -> tuple[SGLangReplayer, SGLangInProcessAdapter]:
    replayer = SGLangReplayer(sgl, capacity_for(lines, size), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    adapter = SGLangInProcessAdapter(replayer.cache, model="tiny")  # installs the index on the empty tree
    index = getattr(replayer.cache, INDEX)
    for line_no, op in _parse(lines):
        replayer.apply(line_no, op)
        assert index.verify() == [], (line_no, op)
    return replayer, adapter


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_index_follows_every_operation(sgl, seed, size):
    lines = generate_trace(seed, n_ops=150, max_in_flight=4, vocab=6 if seed % 2 else 400, abort_weight=3)
    replayer, adapter = replay_checked(sgl, lines, size)
    counters = replayer.counters
    assert counters["splits"] > 0 or seed % 2 == 0
    index = getattr(replayer.cache, INDEX)
    assert adapter.stats().node_count == index.count == len(replayer.tree_rows())
    replayer.cache.reset()
    assert index.verify() == [] and index.count == 0


def test_subtree_sizes_come_from_the_index_without_a_walk(sgl, monkeypatch):
    lines = generate_trace(3, n_ops=120, max_in_flight=3, vocab=6)
    replayer, adapter = replay_checked(sgl, lines, "large")
    import radixtop.adapters.sglang.index as index_module

    def no_walk(top):
        raise AssertionError("a read walked the tree")

    monkeypatch.setattr(index_module, "_walk_sizes", no_walk)
    stack, seen = [ROOT_ID], 0
    while stack:
        node_id = stack.pop()
        page = adapter.children(node_id, 0, 1000)
        for child in page.children:
            below = adapter.children(child.id, 0, 1000).children
            assert child.subtree_tokens == child.tokens + sum(c.subtree_tokens for c in below)
            seen += 1
            stack.append(child.id)
    assert seen == adapter.stats().node_count
    total = adapter.node(ROOT_ID).node.subtree_tokens
    assert total == replayer.cache.total_size()


def test_evictions_and_closes_sglang_makes_are_counted(sgl):
    lines = generate_trace(5, n_ops=200, max_in_flight=4, vocab=400)
    replayer, adapter = replay_checked(sgl, lines, "small")
    st = adapter.stats()
    evicted_by_sglang = sum(r.get("evicted_tokens", 0) for r in replayer.results if r["op"] == "evict")
    assert st.evicted_tokens >= evicted_by_sglang and st.evicted_tokens > 0
    closes = [r for r in replayer.results if r["op"] == "close"]
    assert st.closes == len(closes)
    assert st.freed_by_close_tokens == sum(r["freed_tokens"] for r in closes)


@pytest.mark.parametrize("rank_chunk", [None, 3])
def test_kept_rankings_of_children_equal_a_full_sort_after_every_operation(sgl, rank_chunk, monkeypatch):
    """Each node's children by subtree tokens, read through the index's kept rankings (re-ranking
    only the last top and what changed), equal a sort of all of them, after every operation of
    a trace that keeps splitting, growing, evicting and closing under the nodes read. With a
    small ``RANK_CHUNK`` the kept ones and the changed ones are ranked in steps (up to 8 x KEEP
    of them in one step held SGLang's scheduler 6 ms at 1M nodes)."""
    from radixtop.adapters.sglang import index as index_module

    if rank_chunk:
        monkeypatch.setattr(index_module, "RANK_CHUNK", rank_chunk)
    kept_in_steps = 0  # reads of a kept ranking that took more than one step
    lines = generate_trace(11, n_ops=300, max_in_flight=4, vocab=6, abort_weight=2)
    replayer = SGLangReplayer(sgl, capacity_for(lines, "small"), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    SGLangInProcessAdapter(replayer.cache, model="tiny")
    index = getattr(replayer.cache, INDEX)
    keep = index_module.KEEP
    index_module.KEEP = 2  # small kept rankings: the thresholds matter at once
    try:
        for line_no, op in _parse(lines):
            replayer.apply(line_no, op)
            for node in list(index.nodes.values()):
                if not node.children:
                    continue
                want = min(1 + line_no % 2, len(node.children))
                kept = index._ranked.get(node.id)
                got, steps = stepped(index.top_children(node, want))
                got = [n.id for n in got]
                kept_in_steps += kept is not None and index._ranked.get(node.id) is kept and steps > 0
                full = sorted(node.children.values(), key=lambda n: (-index.subtree[n.id], n.id))
                assert got == [n.id for n in full[:want]], (line_no, node.id)
    finally:
        index_module.KEEP = keep
    assert kept_in_steps > 0 or not rank_chunk  # a kept ranking re-ranked in steps


def test_pages_and_details_are_decoded_on_the_readers_thread_not_the_schedulers(sgl):
    """What a read needs of the tree is taken on the scheduler thread; the views are built, and
    their text decoded with the server's tokenizer, on the reader's thread (the tokenizer costs
    tens of microseconds a row: 100 rows a page, each poll). The figures are those of one step."""
    import threading

    from radixtop.gpu_backend.owner.queue import OwnerQueue

    lines = generate_trace(3, n_ops=120, max_in_flight=3, vocab=400)
    replayer, _ = replay_checked(sgl, lines, "large")
    decoded_on: set[int] = set()

    class Tokenizer:
        def decode(self, ids):
            decoded_on.add(threading.get_ident())
            return " ".join(f"w{i}" for i in ids)

    owner = OwnerQueue("test scheduler")
    adapter = SGLangInProcessAdapter(replayer.cache, owner, model="tiny", tokenizer=Tokenizer())
    stop = threading.Event()
    scheduler = threading.Thread(target=lambda: [owner.between_steps() or stop.wait(0.001) for _ in iter(stop.is_set, True)])
    scheduler.start()
    try:
        page = adapter.children(ROOT_ID, 0, 100)
        first = page.children[0]
        detail = adapter.node(first.id)
        many = adapter.read_many([("children", (first.id, 0, 1000)), ("node", (first.id,))])
    finally:
        stop.set()
        scheduler.join(10)
    assert first.text == " ".join(f"w{i}" for i in first.first_tokens)
    assert detail.text is not None and detail.node.text == first.text
    assert many[0].children and many[1].node.id == first.id
    assert decoded_on == {threading.get_ident()}
    assert first.subtree_tokens == first.tokens + sum(c.subtree_tokens for c in many[0].children)


def test_the_index_keeps_its_maps_in_shards_so_no_insert_rebuilds_them_all(sgl):
    """A dict of every node rebuilds its whole table when it grows, and again whenever a cache at
    capacity has used up its deleted slots: at 1M nodes one hooked insert held SGLang's scheduler
    ~50 ms, per map, every ~400k inserts. In shards each rebuild is a 64th of that."""
    from radixtop.gpu_backend.owner.shards import SHARDS, ShardedMap

    lines = generate_trace(4, n_ops=200, max_in_flight=4, vocab=400)
    replayer, _ = replay_checked(sgl, lines, "large")
    index = getattr(replayer.cache, INDEX)
    assert isinstance(index.nodes, ShardedMap) and isinstance(index.subtree, ShardedMap)
    assert index.count > SHARDS and max(len(s) for s in index.nodes.shards) < index.count
    replayer.cache.reset()
    assert isinstance(index.nodes, ShardedMap) and index.verify() == []


def test_a_tree_whose_hooks_cannot_install_says_sessions_are_unavailable(sgl, monkeypatch):
    """Session figures come from the ledger the index's hooks keep; where they cannot install (an
    SGLang whose methods radixtop does not know) no pass stands in: sessions are unavailable and
    say why, never a list of zeros."""
    from radixtop.adapters.errors import Unsupported
    from radixtop.adapters.sglang import inproc

    lines = generate_trace(3, n_ops=40, max_in_flight=4, vocab=6)
    replayer = SGLangReplayer(sgl, capacity_for(lines, "small"), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    for line_no, op in _parse(lines):
        replayer.apply(line_no, op)
    monkeypatch.setattr(inproc, "install", lambda cache: None)
    adapter = SGLangInProcessAdapter(replayer.cache, model="tiny")
    caps = adapter.capabilities()
    assert not caps.sessions and not caps.close and "cannot follow this SGLang version" in caps.reason
    for read in (adapter.sessions, lambda: adapter.session("s0"), lambda: adapter.plan_close("s0")):
        with pytest.raises(Unsupported, match="cannot follow"):
            read()
    assert adapter.stats().open_sessions is None  # unknown, not 0
    assert adapter.node(ROOT_ID).sessions_beneath is None
    assert adapter.children(ROOT_ID).total > 0  # the tree itself is still read (by a walk)


@pytest.mark.parametrize("order", ["bytes", "recency", "tokens"])
def test_any_page_of_a_wide_node_is_exact_and_read_in_bounded_steps(sgl, order):
    """A page far down a wide node (a few-shot prompt with thousands of continuations) is the
    exact slice of the order, and no step of SGLang's scheduler ranks more than a few chunks of
    children: a running nsmallest of offset + limit redid that many children every step (at
    offset 150,000 of a 200k-child root, 150,000 a step)."""
    import json

    from radixtop.adapters.owned.common import SORT_CHUNK
    from radixtop.adapters.owned.reads import finished

    n = 6 * SORT_CHUNK
    lines = [json.dumps({"op": "request", "input": [10_000 + k, 1 + k % 7], "output": [2] * (k % 5 + 1)})
             for k in range(n)]
    replayer = SGLangReplayer(sgl, 12 * n, eviction_policy="lru", max_running=8, max_context_len=512)
    adapter = SGLangInProcessAdapter(replayer.cache, model="tiny")
    for line_no, op in _parse(lines):
        replayer.apply(line_no, op)
    assert adapter.children(ROOT_ID, 0, 1).total == n
    root = replayer.cache.root_node
    kids = list(root.children.values())
    index = getattr(replayer.cache, INDEX)
    keys = {"bytes": lambda c: (-index.subtree[c.id], c.id), "recency": lambda c: (-c.last_access_time, c.id),
            "tokens": lambda c: (-len(c.key), c.id)}
    expected = [c.id for c in sorted(kids, key=keys[order])]
    calls, most = [0], [0]
    real = adapter._child_key

    def counting(o, sizes):
        key = real(o, sizes)

        def counted(node):
            calls[0] += 1
            return key(node)
        return counted

    adapter._child_key = counting
    for offset in (0, 3 * SORT_CHUNK, n - 100):
        steps = adapter._children_pass(ROOT_ID, offset, 100, order)
        try:
            while True:
                calls[0] = 0
                next(steps)
                most[0] = max(most[0], calls[0])
        except StopIteration as done:
            page = finished(done.value)
        assert [c.id for c in page.children] == expected[offset : offset + 100], (order, offset)
    assert most[0] <= 2 * SORT_CHUNK, f"a step computed {most[0]} keys"
