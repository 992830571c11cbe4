"""The tree at a past moment, node by node (``CacheAdapter.then_children``: the dashboard
timeline's tree), against the tree's own walk at each moment (``tree_nodes``, kept as it was):
browsed page by page from the root, it holds exactly the token prefixes the tree held then, and
each node's figures then (its subtree's tokens, its children) are the walk's."""

from __future__ import annotations

import pytest

from radixtop.adapters.bundled.child_order import ChildOrders
from radixtop.adapters.errors import UnknownNode, Unsupported
from radixtop.adapters.model import ROOT_ID
from tests.backend.test_history import bundled
from tests.backend.test_history_then import prefixes, run


def browsable(s):
    """The bundled adapter over ``s`` with its calls run here, at once (no engine thread), whole
    enough to read pages of the tree."""
    adapter = bundled(s)
    adapter.tokenizer, adapter.read_only, adapter._child_orders = None, False, ChildOrders()
    adapter._init_owner_reads()
    return adapter


def browse(then_children, at, tokens_of, limit=10_000):
    """Every node of the tree at ``at``, read page by page from the root: id -> (its path's
    tokens, its own tokens' count, its view), and each node's children as listed."""
    out, listed, stack = {}, {}, [(ROOT_ID, ())]
    while stack:
        node_id, path = stack.pop()
        page = then_children(at, node_id, 0, limit)
        assert page.total == len(page.children) and page.parent_id == node_id
        listed[node_id] = page.children
        sizes = [v.subtree_tokens for v in page.children]
        assert sizes == sorted(sizes, reverse=True)  # (the largest subtree then first)
        for v in page.children:
            assert v.id not in out, "a node listed twice"
            own = tokens_of(v)
            assert len(own) == v.tokens and tuple(own[:16]) == v.first_tokens
            out[v.id] = (path + tuple(own), v.tokens, v)
            stack.append((v.id, path + tuple(own)))
    return out, listed


def check_browse(h, k, walk_then, now_ids, then_children, tokens_now, lives=False):
    """``browse`` at ``k`` against the tree's walk then: the same token prefixes; each node's
    subtree tokens and children then; a node that left, as its ghost says. ``lives``: a block's
    id may be in the tree now again (a life since): a node that left is its last leaving."""
    ghosts = {}
    for g in h.ghosts():
        if g.at > k:
            ghosts.setdefault(g.node_id, g)  # (its first leaving since: the life it had then)

    def tokens_of(v):
        if v.left_at is None:
            return tokens_now(v.id)
        return [int(t) for t in memoryview(ghosts[v.id].tokens).cast("q")]

    nodes, listed = browse(then_children, k, tokens_of)
    assert prefixes(nodes) == prefixes(walk_then), k
    cached = prefixes(walk_then)
    for node_id, (path, own, v) in nodes.items():
        if lives:  # (blocks, whole: two siblings may start alike; no split since, the ids are the walk's)
            below = sum(o for q, o, _ in walk_then.values() if q[:len(path)] == path)
        else:
            start = len(path) - own
            below = sum(1 for p in cached if len(p) > start and p[:start + 1] == path[:start + 1])
        assert v.subtree_tokens == below, (k, node_id)
        assert v.num_children == len(listed[node_id]), (k, node_id)
        if v.left_at is None:
            assert node_id in now_ids and v.holders is None and v.lock_ref is None
        else:
            g = ghosts[node_id]
            assert (lives or node_id not in now_ids) and k < g.at == v.left_at
            assert (v.left_cause, v.holders) == (g.cause, g.holders)
    if lives:
        assert nodes.keys() == walk_then.keys(), k
        assert sum(v.subtree_tokens for v in listed[ROOT_ID]) == sum(o for _, o, _ in walk_then.values())
    else:
        assert sum(v.subtree_tokens for v in listed[ROOT_ID]) == len(cached)
    return nodes


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("size,flush_every", [("small", 0), ("small", 30)])
def test_the_tree_then_browsed_node_by_node_is_the_tree_as_it_was(seed, size, flush_every):
    s, walks = run(seed, size, flush_every)
    adapter = browsable(s)
    now = walks[-1]
    left = 0
    for k in range(0, len(walks), 11):
        nodes = check_browse(s.cache.history, k, walks[k], now.keys(), adapter.then_children,
                             lambda i: list(s.cache.nodes[i].key))
        left += sum(1 for _, _, v in nodes.values() if v.left_at is not None)
    assert left, "nothing left: the test proves nothing"


@pytest.mark.parametrize("seed", range(4))
def test_the_tree_then_kept_between_reads_follows_the_tree_now_as_it_changes(seed):
    """One moment browsed again and again while the trace goes on (the tree then kept between reads,
    fed the changes since the last: stores, splits, removals, flushes): each time, it is the tree
    as it was then."""
    import random

    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler
    from radixtop.gpu_backend.traces.ops import Replayer, read_trace
    from tests.backend.test_history import tree_nodes
    from tests.support.trace_gen import capacity_for, generate_trace

    lines = generate_trace(seed, n_ops=240, max_in_flight=4, vocab=60, abort_weight=2)
    s = Scheduler(get_geometry("tiny"), capacity_for(lines, "small"), device="cpu", write_kv=False)
    clock = [0]
    h = s.cache.history
    h.clock = lambda: clock[0]
    h.since = h.stores_since = 0
    replayer, rng, adapter = Replayer(s), random.Random(seed), browsable(s)
    moments, walks, reads, left_first = {}, [tree_nodes(s.cache.root_node)], 0, 0
    left_of: dict[float, list] = {}  # (a moment's nodes that left, from its last read)
    for op in read_trace(lines):
        clock[0] += 1
        if rng.randrange(40) == 0:
            s.flush()
        replayer.apply(op)
        walks.append(tree_nodes(s.cache.root_node))
        if clock[0] % 30 == 0:
            moments[clock[0]] = walks[-1]
        for k, then in moments.items():  # (each moment asked again after every op: kept, fed, read)
            if clock[0] % 7 == k % 7:
                first = None
                if left_of.get(k):  # (a node that left read first, before the root: the fold fed there too)
                    first = left_of[k][0]
                    first_page = adapter.then_children(k, first.id, 0, 10_000)
                nodes = check_browse(h, k, then, walks[-1].keys(), adapter.then_children,
                                     lambda i: list(s.cache.nodes[i].key))
                if first is not None:
                    assert [c.id for c in first_page.children] == \
                        [c.id for c in adapter.then_children(k, first.id, 0, 10_000).children]
                    left_first += 1
                left_of[k] = [v for _, _, v in nodes.values() if v.left_at is not None and v.num_children]
                reads += 1
    assert reads > 50 and left_first > 5 and len(adapter._then_trees.kept) == 2


def test_a_node_stored_since_is_not_in_the_tree_then_and_a_target_without_history_says_so():
    s, walks = run(0, "small", 0)
    adapter = browsable(s)
    k = len(walks) // 2
    stored_since = next(i for i in walks[-1] if i not in walks[k])
    with pytest.raises(UnknownNode) as e:
        adapter.then_children(k, stored_since)
    assert "stored since" in str(e.value) and "\n" not in str(e.value)
    s.cache.history = None
    fresh = browsable(s)
    with pytest.raises(Unsupported):
        fresh.then_children(k, ROOT_ID)


# ----- what a read-back found (each failed before its fix) -----


def small_tree():
    """A scheduler on the test's clock (1.0 now), its history reaching back to 0."""
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler

    s = Scheduler(get_geometry("tiny"), 1 << 20, device="cpu", write_kv=False)
    clock = [1.0]
    h = s.cache.history
    h.clock = lambda: clock[0]
    h.since = h.stores_since = 0
    return s, clock


def test_a_node_stored_since_and_gone_again_leaves_its_parents_subtree_then_as_it_was():
    s, clock = small_tree()
    s.cache.insert([1, 2, 3, 4])
    clock[0] = 2.0
    s.cache.insert([1, 2, 3, 4, 9, 9, 9, 9, 9, 9])  # (stored since: 6 tokens below it)
    adapter = browsable(s)
    assert [c.subtree_tokens for c in adapter.then_children(1.5, 0, 0, 10).children] == [4]
    clock[0] = 3.0
    s.cache._delete_leaf(next(iter(s.cache.root_node.children[1].children.values())))
    s.cache._flush_subtree()  # (evicted again: no node stored since is left)
    assert [c.subtree_tokens for c in adapter.then_children(1.5, 0, 0, 10).children] == [4]


def test_a_node_stored_since_that_leaves_while_the_page_is_read_is_not_among_the_nodes_then():
    s, clock = small_tree()
    s.cache.insert([1, 2, 3, 4])
    s.cache.insert([5, 6, 7, 8])
    clock[0] = 2.0
    s.cache.insert([9, 9, 9, 9, 9, 9])
    new = s.cache.root_node.children[9]
    adapter = browsable(s)
    real = adapter.children

    def children(node_id, offset, limit, order):  # (an engine step after the page: evicted)
        page = real(node_id, offset, limit, order)
        if new.id in s.cache.nodes:
            clock[0] = 3.0
            s.cache._delete_leaf(new)
            s.cache._flush_subtree()
        return page

    adapter.children = children
    ids = sorted(c.id for c in adapter.then_children(1.5, 0, 0, 100).children)
    assert new.id not in ids and len(ids) == 2


def test_a_node_there_then_that_leaves_before_its_page_is_read_is_answered_as_a_node_that_left():
    s, clock = small_tree()
    s.cache.insert([1, 2, 3, 4])
    s.cache.insert([1, 2, 3, 4, 5, 6])
    x = s.cache.root_node.children[1]
    leaf = next(iter(x.children.values()))
    clock[0] = 2.0
    adapter = browsable(s)
    adapter.then_children(1.5, 0, 0, 10)  # (the moment kept)
    real = adapter.children

    def children(node_id, offset, limit, order):  # (an engine step between the feed and the page)
        if leaf.id in s.cache.nodes:
            clock[0] = 3.0
            s.cache._delete_leaf(leaf)
            s.cache._delete_leaf(x)
            s.cache._flush_subtree()
        return real(node_id, offset, limit, order)

    adapter.children = children
    page = adapter.then_children(1.5, x.id, 0, 10)
    assert [(c.id, c.tokens, c.left_at) for c in page.children] == [(leaf.id, 2, 3.0)]


def test_a_kept_moment_the_history_no_longer_reaches_is_refused_as_a_new_one_is():
    from radixtop.adapters.errors import BadRequest
    from radixtop.adapters.events.wire import Batch, Stored
    from tests.backend.test_history_events import VLLMLike

    adapter = VLLMLike(name="v", bytes_per_token=1, capacity_tokens=4096)
    adapter._tree.history.since = adapter._tree.history.stores_since = 0
    adapter.apply_batch(0, Batch(1.0, None, [Stored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), 4)]))
    adapter.apply_batch(1, Batch(2.0, None, [Stored((21,), None, (9, 9, 9, 9), 4)]))
    assert len(adapter.then_children(1.5, 0, 0, 100).children) == 1
    adapter._restart()  # (the stream started again: a gap in the history)
    adapter.apply_batch(0, Batch(3.0, None, [Stored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), 4)]))
    with pytest.raises(BadRequest) as refused:
        adapter.then_children(1.5, 0, 0, 100)
    assert "reaches back to" in str(refused.value)
    assert 1.5 not in adapter._then_trees.kept


def test_a_long_chain_that_left_is_told_whole():
    """A chain of 3,000 blocks (a page size of 1) that left with its top: one branch, its figures
    whole (the indexes are one pass over it: their time is in the note of the change, not asserted)."""
    from radixtop.adapters.events.wire import Batch, Removed, Stored
    from tests.backend.test_history_events import VLLMLike

    n = 3000
    adapter = VLLMLike(name="v", bytes_per_token=1, capacity_tokens=1 << 20)
    adapter._tree.history.since = adapter._tree.history.stores_since = 0
    adapter.apply_batch(0, Batch(1.0, None, [Stored(tuple(range(1, n + 1)), None, tuple(range(n)), 1)]))
    adapter.apply_batch(1, Batch(2.0, None, [Removed((1,))]))  # (the top: the chain out of reach with it)
    [top] = adapter.then_children(1.5, 0, 0, 10).children
    assert (top.left_cause, top.subtree_tokens, top.num_children) == ("evicted", n, 1)
    [second] = adapter.then_children(1.5, top.id, 0, 10).children
    assert second.subtree_tokens == n - 1


def test_the_first_read_of_one_moment_never_holds_a_read_of_another():
    """A moment's first read (every change since it, read from the history: a second and more on
    a large tree) runs while another moment, kept, is read: that read waits for nothing of it.
    Each moment is then its own tree, as a read of it alone gives."""
    import threading

    from radixtop.adapters.owned.then_tree import ThenTrees, then_children
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler
    from radixtop.gpu_backend.traces.ops import Replayer, read_trace
    from tests.support.trace_gen import capacity_for, generate_trace

    lines = generate_trace(4, n_ops=160, max_in_flight=4, vocab=60, abort_weight=2)
    s = Scheduler(get_geometry("tiny"), capacity_for(lines, "small"), device="cpu", write_kv=False)
    clock = [0]
    h = s.cache.history
    h.clock = lambda: clock[0]
    h.since = h.stores_since = 0
    replayer, adapter = Replayer(s), browsable(s)
    for op in read_trace(lines):
        clock[0] += 1
        replayer.apply(op)
    more, trees = adapter._then_more(), ThenTrees()
    entered, gate = threading.Event(), threading.Event()

    def slow(at, start):  # (the first read of moment 100 waits at the gate)
        if at == 100 and start is None:
            entered.set()
            gate.wait(30)
        return more(at, start)

    def page(at):
        return [(c.id, c.subtree_tokens) for c in then_children(adapter, trees, slow, at, ROOT_ID, 0, 1000).children]

    kept = page(40)  # (moment 40 read once: kept)
    first: list = []
    reader = threading.Thread(target=lambda: first.append(page(100)), daemon=True)
    reader.start()
    assert entered.wait(10)
    other: list = []
    meanwhile = threading.Thread(target=lambda: other.append(page(40)), daemon=True)
    meanwhile.start()
    meanwhile.join(5)
    held = meanwhile.is_alive()
    gate.set()
    reader.join(30)
    meanwhile.join(30)
    assert not held, "a read of a kept moment waited for another moment's first read"
    assert other == [kept] and first == [page(100)]
    alone = ThenTrees()
    assert first[0] == [(c.id, c.subtree_tokens)
                        for c in then_children(adapter, alone, more, 100, ROOT_ID, 0, 1000).children] and first[0] != kept


def test_a_streams_batches_are_applied_between_the_slices_of_a_long_read_of_its_history(monkeypatch):
    """On a KV-event stream a read of the history (the tree then's first read: every change since
    the moment) takes the stream's lock a slice at a time: a batch that waits for it meanwhile is
    applied between two slices, not after the whole read (a second and more on a large tree, while
    the engine's events pile up)."""
    import threading
    import time

    from radixtop.adapters.events import adapter as module
    from radixtop.adapters.events.wire import Batch, Stored
    from tests.backend.test_history_events import VLLMLike

    adapter = VLLMLike(name="v", bytes_per_token=1, capacity_tokens=4096)
    adapter._tree.history.since = adapter._tree.history.stores_since = 0
    adapter.apply_batch(0, Batch(1.0, None, [Stored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), 4)]))
    adapter.apply_batch(1, Batch(2.0, None, [Stored((21,), None, (9, 9, 9, 9), 4)]))
    real, between, done, seen = module.then_more, threading.Event(), threading.Event(), []

    def sliced(history, at, start):
        if start is None:  # (the first read: its first slice lasts until the batch waits for the lock)
            between.set()
            time.sleep(0.3)
            yield
            seen.append(done.is_set())  # (its second slice: the batch applied already?)
        return (yield from real(history, at, start))

    def batch() -> None:
        adapter.apply_batch(2, Batch(3.0, None, [Stored((31,), None, (5, 5, 5, 5), 4)]))
        done.set()

    monkeypatch.setattr(module, "then_more", sliced)
    pages: list = []
    reader = threading.Thread(target=lambda: pages.append(adapter.then_children(1.5, 0, 0, 100)), daemon=True)
    reader.start()
    assert between.wait(10)
    applying = threading.Thread(target=batch, daemon=True)
    applying.start()
    reader.join(30)
    applying.join(30)
    assert seen == [True], "the batch waited for the whole read of the history"
    assert len(pages) == 1 and len(pages[0].children) == 1  # (the tree at 1.5: the first prompt only)
    assert adapter.stats().total_tokens == 16


def test_a_gap_in_the_stream_between_two_slices_of_a_read_of_its_history_refuses_the_read(monkeypatch):
    """A gap comes while the history is read a slice at a time for ``then`` (a batch that never
    came, a restart of the stream: what left meanwhile is not known): the read is refused in one
    line, never answered as if the history had no hole (the tree then's pages read the history
    again after their first read, and are refused there)."""
    import threading
    import time

    from radixtop.adapters.errors import BadRequest
    from radixtop.adapters.events import adapter as module
    from radixtop.adapters.events.wire import Batch, Removed, Stored
    from radixtop.adapters.owned import why
    from tests.backend.test_history_events import VLLMLike

    adapter = VLLMLike(name="v", bytes_per_token=1, capacity_tokens=4096)
    adapter._tree.history.since = adapter._tree.history.stores_since = 0
    adapter.apply_batch(0, Batch(1.0, None, [Stored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), 4),
                                             Stored((21, 22), None, (9, 9, 9, 9, 8, 8, 8, 8), 4)]))
    adapter.apply_batch(1, Batch(2.0, None, [Removed((12,)), Removed((22,))]))
    monkeypatch.setattr(why, "STORY_SLICE", 1)  # (a removal a slice: the read takes several)
    real, between = module.then_pass, threading.Event()

    def sliced(*args, **kwargs):
        passing, first = real(*args, **kwargs), True
        while True:
            try:
                next(passing)
            except StopIteration as done:
                return done.value
            if first:  # (after its first slice, until the gap's thread waits for the lock)
                first = False
                between.set()
                time.sleep(0.3)
            yield

    monkeypatch.setattr(module, "then_pass", sliced)
    refused: list = []

    def read() -> None:
        try:
            refused.append(adapter.then(1.5).tokens_then)
        except BadRequest as exc:
            refused.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert between.wait(10)
    gap = threading.Thread(target=lambda: adapter.missed(3), daemon=True)
    gap.start()
    reader.join(30)
    gap.join(30)
    assert len(refused) == 1 and "gap" in str(refused[0]) and "\n" not in str(refused[0]), refused
