"""RadixCache: match_prefix's side effects, the read-only lookup, insert, locks, eviction order."""

from __future__ import annotations

import numpy as np
import pytest

from radixtop.gpu_backend.allocator import TokenToKVPoolAllocator
from radixtop.gpu_backend.radix_cache import RadixCache
from tests.support.engines import CounterClock, check_invariants, make_scheduler


def make_cache(size: int = 64, page_size: int = 1, policy: str = "lru", close_policy: str = "free") -> RadixCache:
    return RadixCache(TokenToKVPoolAllocator(size, page_size), page_size, policy, close_policy, clock=CounterClock())


def put(cache: RadixCache, key: list[int]) -> None:
    """Insert with real slots, freeing the duplicates as a caller must."""
    slots = cache.token_to_kv_pool_allocator.alloc(len(key))
    result = cache.insert(key, slots)
    cache.token_to_kv_pool_allocator.free(slots[: result.prefix_len])


def keys(cache: RadixCache) -> list[list[int]]:
    return sorted(list(n.key) for n in cache.iter_nodes())


def test_insert_returns_prefix_len_and_builds_the_tree():
    cache = make_cache()
    assert cache.insert([1, 2, 3]).prefix_len == 0
    assert cache.insert([1, 2, 3]).prefix_len == 3
    assert cache.insert([1, 2, 4, 5]).prefix_len == 2
    assert cache.insert([8, 9]).prefix_len == 0
    assert keys(cache) == [[1, 2], [3], [4, 5], [8, 9]]
    assert cache.total_size() == 7 == cache.evictable_size()
    assert cache.node_count() == 4


def test_match_prefix_splits_inside_a_node_and_tail_keeps_its_id():
    cache = make_cache()
    put(cache, [1, 2, 3, 4])
    (node,) = cache.iter_nodes()
    tail_id = node.id
    m = cache.match_prefix([1, 2, 9])
    assert m.prefix_len == 2
    assert m.last_node.key == (1, 2) and m.last_node.id != tail_id
    assert cache.nodes[tail_id].key == (3, 4) and cache.nodes[tail_id].parent is m.last_node
    assert m.device_indices.tolist() == cache.nodes[m.last_node.id].value.tolist()
    check_invariants_cache(cache)


def test_match_prefix_refreshes_access_time_and_lookup_changes_nothing():
    cache = make_cache()
    put(cache, [1, 2, 3, 4])
    (node,) = cache.iter_nodes()
    before = node.last_access_time
    look = cache.lookup([1, 2, 9])
    assert (look.prefix_len, look.partial_len) == (2, 2)
    assert look.last_node is cache.root_node and look.partial_node is node
    assert node.last_access_time == before and cache.node_count() == 1  # no split, no touch
    assert cache.lookup([1, 2, 3, 4, 5]).prefix_len == 4
    cache.match_prefix([1, 2, 3, 4])
    assert node.last_access_time > before


def test_lock_ref_moves_tokens_between_evictable_and_protected():
    cache = make_cache()
    put(cache, [1, 2, 3])
    put(cache, [1, 2, 3, 4, 5])
    leaf = cache.match_prefix([1, 2, 3, 4, 5]).last_node
    assert cache.inc_lock_ref(leaf) == -5
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    assert cache.inc_lock_ref(leaf) == 0  # already locked: no change in sizes
    assert cache.evict(10).num_tokens_evicted == 0  # nothing unlocked
    cache.dec_lock_ref(leaf)
    assert cache.dec_lock_ref(leaf) == 5
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(leaf)


def test_evict_frees_least_recently_used_leaves_first():
    cache = make_cache()
    for k in ([1, 1], [2, 2], [3, 3]):
        put(cache, k)
    cache.match_prefix([1, 1])  # [1,1] is now the most recently used
    assert cache.evict(1).num_tokens_evicted == 2  # whole leaves only
    assert keys(cache) == [[1, 1], [3, 3]]
    assert cache.evict(2).num_tokens_evicted == 2
    assert keys(cache) == [[1, 1]]
    assert cache.token_to_kv_pool_allocator.available_size() == 62


def test_evict_climbs_to_a_parent_that_becomes_a_leaf():
    cache = make_cache()
    put(cache, [1, 2, 3])
    put(cache, [1, 2, 4])
    put(cache, [9])
    cache.match_prefix([9])  # newest
    result = cache.evict(4)  # [3] then [4], then the parent [1,2] is the oldest leaf
    assert (result.num_tokens_evicted, result.num_nodes_evicted) == (4, 3)
    assert keys(cache) == [[9]]


def test_locked_path_is_never_evicted():
    cache = make_cache()
    put(cache, [1, 2])
    put(cache, [3, 4])
    locked = cache.match_prefix([1, 2]).last_node
    cache.inc_lock_ref(locked)
    assert cache.evict(100).num_tokens_evicted == 2
    assert keys(cache) == [[1, 2]]


@pytest.mark.parametrize(
    ("policy", "survivor"),
    [("lru", [1]), ("mru", [2]), ("fifo", [1]), ("filo", [3]), ("lfu", [1]), ("priority", [2])],
)
def test_eviction_strategies(policy, survivor):
    cache = make_cache(policy=policy)
    put(cache, [3])
    cache.insert([2], cache.token_to_kv_pool_allocator.alloc(1), priority=5)
    put(cache, [1])
    put(cache, [1])  # [1] inserted twice: hit_count 2 (lfu), newest access (lru)
    cache.match_prefix([3])  # touch [3] again
    cache.match_prefix([1])
    # Two of the three one-token leaves go; which one stays is the strategy's whole difference.
    cache.evict(2)
    assert keys(cache) == [survivor]


def test_page_size_two_matches_and_inserts_whole_pages():
    cache = make_cache(page_size=2)
    put(cache, [1, 2, 3, 4])
    assert cache.insert([1, 2, 3, 4, 5]).prefix_len == 4  # the odd tail is cut
    assert cache.match_prefix([1, 2, 3, 9]).prefix_len == 2  # divergence inside page 2
    assert keys(cache) == [[1, 2], [3, 4]]
    assert cache.lookup([1, 2, 3]).prefix_len == 2
    assert set(cache.root_node.children) == {(1, 2)}  # children keyed by first page


def test_reset_and_pretty_print(capsys):
    cache = make_cache()
    put(cache, [1, 2, 3])
    text = cache.pretty_print()
    assert "3 [1, 2, 3] r=0" in text and "#tokens: 3" in text
    assert "#tokens: 3" in capsys.readouterr().out
    cache.reset()
    assert cache.node_count() == 0 and cache.total_size() == 0


def test_deep_chain_does_not_recurse():
    cache = make_cache(size=7_000)
    for depth in range(1, 3001):
        put(cache, list(range(depth)))  # each insert adds one node below the last
    assert cache.node_count() == 3000
    assert len(list(cache.iter_nodes())) == 3000
    assert cache.evict(10_000).num_tokens_evicted == 3000  # climbs the whole chain


def test_scheduler_finish_frees_duplicates_and_unaligned_tail():
    s = make_scheduler(capacity=64, page_size=4)
    assert s.begin("a", list(range(10))) == 0
    s.finish("a", [100, 101, 102])  # 13 tokens: 12 cached, the tail page freed
    check_invariants(s)
    assert s.cache.total_size() == 12
    assert s.pool.allocator.available_size() == 64 - 12
    assert s.begin("b", list(range(10))) == 8  # whole pages only
    s.finish("b", [])
    check_invariants(s)


def check_invariants_cache(cache: RadixCache) -> None:
    nodes = list(cache.iter_nodes())
    assert cache.evictable_size() == sum(len(n.key) for n in nodes if n.lock_ref == 0)
    assert np.unique(np.concatenate([n.value for n in nodes])).size == cache.total_size()


def test_changes_journal_reports_and_resyncs(monkeypatch):
    import radixtop.gpu_backend.radix_cache as rc

    monkeypatch.setattr(rc, "JOURNAL_LIMIT", 8)
    cache = make_cache()
    v0 = cache.version
    put(cache, [1, 2, 3])
    delta = cache.changes(v0)
    (node,) = cache.iter_nodes()
    assert not delta.resync and node.id in delta.added and 0 in delta.changed
    v1 = cache.version
    cache.match_prefix([1, 2, 9])  # splits: a new head, the tail changed
    delta = cache.changes(v1)
    assert node.id in delta.changed and len(delta.added) == 1
    v2 = cache.version
    cache.evict(1)  # the tail [3] goes (the oldest leaf); its parent [1,2] changes
    delta = cache.changes(v2)
    assert delta.removed == (node.id,) and not delta.added and len(delta.changed) >= 1
    for i in range(10):
        put(cache, [50 + i])  # more than the journal keeps
    assert cache.changes(v1).resync
    assert not cache.changes(cache.version - 3).resync
    cache.reset()
    assert cache.changes(v2).resync and not cache.changes(cache.version).resync


class _NoWholeCopy(set):
    """The evictable leaves, refusing a copy of them all (``list(leaves)``: ~30 ms in one step at
    780k leaves); membership, adds and removes as a set's."""

    def __iter__(self):
        raise AssertionError("the whole set of evictable leaves copied in one step")


def test_a_sliced_compaction_neither_copies_every_leaf_nor_frees_the_old_heap_in_one_step():
    """At 1M nodes the compaction's first step copied the 780k evictable leaves (28.6 ms) and its
    last freed the 3.1M-entry heap it replaced (434 ms, and 2.5 s in a bench run): both in one
    step of the owner. It drops the stale entries of the heap in place instead, at most 128 a
    step (each may free an evicted node), and leaves one entry per evictable leaf."""
    passes: list = []
    cache = make_cache(16384)
    cache.background = passes.append
    for i in range(3000):
        put(cache, [7, i % 50, 10_000 + i])  # a wide node: 50 children, each with ~60 leaves
    cache.evictable_leaves = _NoWholeCopy(cache.evictable_leaves)
    leaves = [n for n in cache.iter_nodes() if not n.children]
    rounds = 0
    while not passes:  # touches re-key the leaves until a compaction starts
        for leaf in leaves:
            cache._refresh(leaf)
            if passes:
                break
        rounds += 1
        assert rounds < 20
    heap = cache._evict_heap
    sizes = [len(heap)]
    for _ in passes[0]:
        sizes.append(len(heap))
    assert cache._evict_heap is heap and cache._compacting is None
    assert len(sizes) > 10 and max(a - b for a, b in zip(sizes, sizes[1:])) <= 128  # a step drops at most 128
    assert len(cache._evict_heap) == len(cache.evictable_leaves)  # one entry per evictable leaf
    inline = make_cache(16384)
    for i in range(3000):
        put(inline, [7, i % 50, 10_000 + i])
    while cache.evictable_size():
        assert cache.evict(1).num_tokens_evicted == inline.evict(1).num_tokens_evicted
        assert keys(cache) == keys(inline)


@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
def test_a_compaction_in_slices_evicts_exactly_as_one_at_once(policy):
    """The evict heap's compaction, run in slices between other operations (as the engine runs
    it), leaves eviction choosing the same leaves as a compaction done on the spot; the heap the
    slices build replaces the old one, and no step walks the whole heap."""
    import random

    passes: list = []
    sliced, inline = make_cache(4096, policy=policy), make_cache(4096, policy=policy)
    sliced.background = passes.append  # the engine hands these to its slices
    rng = random.Random(5)
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(300)]
    for cache in (sliced, inline):
        for p in prompts:
            put(cache, p)
    ops = []
    for k in range(8000):  # touches re-key leaves: stale heap entries pile up until compactions
        roll = 0.0 if k % 4000 < 3000 else rng.random()
        ops.append(("touch", rng.choice(prompts)) if roll < 0.9 else ("evict", rng.randint(1, 4)) if roll < 0.95
                   else ("put", [rng.randrange(1000, 5000) for _ in range(3)]))
    started = 0
    for op, arg in ops:
        for cache in (sliced, inline):
            if op == "touch":
                cache.match_prefix(arg)
            elif op == "evict":
                cache.evict(arg)
            else:
                put(cache, arg)
        if passes:  # one slice of the sliced compaction between two operations
            started += 1
            if next(passes[0], StopIteration) is StopIteration:
                passes.pop(0)
        assert keys(sliced) == keys(inline), (op, arg)
    assert started and (sliced._compacting is None or passes)
    while sliced.evictable_size():
        assert sliced.evict(1).num_tokens_evicted == inline.evict(1).num_tokens_evicted
        assert keys(sliced) == keys(inline)
