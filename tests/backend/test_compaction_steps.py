"""The evict heap's compaction in slices: what one step of it may do, and that it changes no eviction."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from radixtop.gpu_backend.allocator import TokenToKVPoolAllocator
from radixtop.gpu_backend.radix_cache import RadixCache
from tests.support.engines import CounterClock

CHUNK = 1024  # _compact_pass's default
STEP_BYTES = 64 * 1024
"""What one step may allocate: a chunk's worth of small objects, never a list of every child or
every entry (at 1M nodes such lists are MiBs of fresh memory, their page faults ~3-5 ms)."""


def make_cache(size: int, policy: str = "lru") -> RadixCache:
    return RadixCache(TokenToKVPoolAllocator(size, 1), 1, policy, clock=CounterClock(), ledger=False)


def put(cache: RadixCache, key: list[int]) -> None:
    """Insert with real slots, freeing the duplicates as a caller must."""
    slots = cache.token_to_kv_pool_allocator.alloc(len(key))
    result = cache.insert(key, slots)
    cache.token_to_kv_pool_allocator.free(slots[: result.prefix_len])


def start_compaction(cache: RadixCache, passes: list) -> None:
    """Re-key every leaf (a push each) until the cache hands a compaction to its background."""
    leaves = [n for n in cache.iter_nodes() if not n.children]
    for _ in range(20):
        for leaf in leaves:
            cache._refresh(leaf)
            if passes:
                return
    raise AssertionError("no compaction started")


def wide_cache(children: int) -> tuple[RadixCache, list]:
    """A root of ``children`` leaves, ~4 heap entries for each (all but one stale), and the
    compaction that started."""
    passes: list = []
    cache = make_cache(2 * children + 64)
    for i in range(children):
        cache.insert([i, 1])  # the token ids stand in for slots: nothing here is evicted
    cache.background = passes.append
    start_compaction(cache, passes)
    assert len(cache.root_node.children) == children and len(passes) == 1
    return cache, passes


def heap_entries(cache: RadixCache) -> list[tuple]:
    return sorted((key, seq, node.id) for key, seq, node in cache._evict_heap)


def is_heap(heap: list) -> bool:
    return all(not heap[i] < heap[(i - 1) // 2] for i in range(1, len(heap)))


def live_entries(cache: RadixCache) -> list[tuple]:
    """Each evictable leaf's last push, which its eviction must find."""
    return sorted((cache._evict_key(n), n.heap_seq, n.id) for n in cache.evictable_leaves)


def test_no_step_of_a_compaction_allocates_more_than_a_chunk_of_memory():
    """The compaction of a heap of ~4 entries per leaf under a root of 50,000 children: no step
    lists the root's children at once (the bench's 1M-node tree has a node of 100k) and the pass
    builds no second heap (a list grown to every live entry: its reallocations copied MiBs into
    fresh memory in single steps, 4-5.6 ms with ~1,000-1,500 page faults at 1M nodes)."""
    tracemalloc.start()  # before the cache is built: a block it resizes is then one it traces
    try:
        cache, passes = wide_cache(50_000)
        steps = passes.pop()
        base = tracemalloc.get_traced_memory()[0]
        worst_step = kept = count = 0
        while True:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            try:
                next(steps)
            except StopIteration:
                break
            count += 1
            now, peak = tracemalloc.get_traced_memory()
            worst_step = max(worst_step, peak - before)
            kept = max(kept, now - base)
    finally:
        tracemalloc.stop()
    assert count > 1
    assert worst_step <= STEP_BYTES, f"a step allocated {worst_step:,} bytes"
    assert kept <= STEP_BYTES, f"the pass held {kept:,} bytes more than the cache at its start"
    assert heap_entries(cache) == live_entries(cache)
    assert is_heap(cache._evict_heap)


class _CountedLeaves(set):
    """The evictable leaves, counting membership checks (one per heap entry or node looked at)."""

    checks = 0

    def __contains__(self, node) -> bool:
        _CountedLeaves.checks += 1
        return set.__contains__(self, node)


def test_a_step_of_a_compaction_looks_at_most_at_a_chunk_of_entries():
    cache, passes = wide_cache(20_000)
    cache.evictable_leaves = _CountedLeaves(cache.evictable_leaves)
    per_step = []
    for _ in passes.pop():
        per_step.append(_CountedLeaves.checks)
        _CountedLeaves.checks = 0
    assert len(per_step) > 10 and max(per_step) <= CHUNK


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "priority"])
def test_the_pass_keeps_exactly_the_entries_compact_heap_keeps(policy):
    """Run to its end with nothing between its steps, the pass leaves the heap ``_compact_heap``
    builds on the spot (a twin with no background, at the same push): each evictable leaf's last
    push, nothing else; then both evict alike."""
    rng = random.Random(3)
    prompts = [[rng.randrange(50), rng.randrange(50), 100 + i] for i in range(2000)]
    sliced, inline = make_cache(8192, policy), make_cache(8192, policy)
    for cache in (sliced, inline):
        for p in prompts:
            put(cache, p)
    passes: list = []
    sliced.background = passes.append
    while not passes:  # touches re-key the leaf at each prompt's end, in both, until one compacts
        p = rng.choice(prompts)
        sliced.match_prefix(p)
        inline.match_prefix(p)
    for _ in passes.pop():
        pass
    assert heap_entries(sliced) == heap_entries(inline) == live_entries(sliced)
    assert is_heap(sliced._evict_heap)
    while sliced.evictable_size():
        assert sliced.evict(7) == inline.evict(7)
        assert sorted(n.key for n in sliced.iter_nodes()) == sorted(n.key for n in inline.iter_nodes())


@pytest.mark.parametrize("seed", range(4))
def test_a_compaction_between_other_operations_changes_no_eviction(seed):
    """Touches, inserts, evictions, locks and unlocks between the pass's steps (as the engine
    runs them); the cache evicts exactly as a twin that never compacts, and when the pass ends
    the heap is a heap again holding every evictable leaf's last push."""
    rng = random.Random(seed)
    policy = ["lru", "lfu", "priority", "fifo"][seed]
    sliced, never = make_cache(20_000, policy), make_cache(20_000, policy)
    passes: list = []
    sliced.background = passes.append
    never.background = lambda work: None  # its compactions never run
    prompts = [[rng.randrange(30), rng.randrange(30), 1000 + i] for i in range(800)]
    for cache in (sliced, never):
        for p in prompts:
            put(cache, p)
    locked: list[tuple] = []
    compactions = steps = 0
    for k in range(30_000):
        roll = rng.random()
        if roll < 0.93:
            op = ("touch", rng.choice(prompts))
        elif roll < 0.96:
            op = ("put", [rng.randrange(30), rng.randrange(30), rng.randrange(2000, 9000)])
        elif roll < 0.97:
            op = ("evict", rng.randint(1, 6))
        elif roll < 0.99 or not locked:
            op = ("lock", rng.choice(prompts))
        else:
            op = ("unlock", locked.pop(rng.randrange(len(locked))))
        ends = []
        for cache in (sliced, never):
            if op[0] == "touch":
                cache.match_prefix(op[1])
            elif op[0] == "put":
                put(cache, op[1])
            elif op[0] == "evict":
                ends.append(cache.evict(op[1]))
            elif op[0] == "lock":
                node = cache.match_prefix(op[1]).last_node
                cache.inc_lock_ref(node)
                ends.append(node.id)
            else:
                cache.dec_lock_ref(cache.nodes[op[1][cache is never]])
        if op[0] == "lock":
            locked.append(tuple(ends))
        elif op[0] == "evict":
            assert ends[0] == ends[1], (k, op)
        if passes:  # one step of the compaction between two operations
            steps += 1
            if next(passes[0], StopIteration) is StopIteration:
                passes.pop()
                compactions += 1
                assert is_heap(sliced._evict_heap)
                assert set(live_entries(sliced)) <= set(heap_entries(sliced))
    assert compactions >= 2, (compactions, steps)
    for ids in locked:
        for cache, node_id in zip((sliced, never), ids):
            cache.dec_lock_ref(cache.nodes[node_id])
    while sliced.evictable_size():
        assert sliced.evict(5) == never.evict(5)
    assert never.evictable_size() == 0


def test_a_reset_ends_a_compaction_and_the_next_one_runs():
    cache, passes = wide_cache(5_000)
    steps = passes.pop()
    next(steps)
    cache.reset()
    assert next(steps, None) is None  # it stops at its next step, touching nothing of the new tree
    assert cache._evict_heap == [] and not cache._compacting
    for i in range(3_000):
        cache.insert([i, 1])
    start_compaction(cache, passes)
    for _ in passes.pop():
        pass
    assert heap_entries(cache) == live_entries(cache)
