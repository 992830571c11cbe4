"""Shared helpers: a deterministic clock, a small scheduler, and the cache's invariants."""

from __future__ import annotations

import importlib.metadata
import itertools

import numpy as np
import pytest

from radixtop.adapters.http.server.audit import AuditLog
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler

try:  # from the installed metadata: importing sglang itself takes seconds
    SGLANG_VERSION: str | None = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    SGLANG_VERSION = None

# The SGLang 0.5.23 tests (tests/on_sglang23/) belong to .venv-sglang23 (.ci/test runs that folder
# there); beside any other sglang they are not collected at all rather than skipped.
collect_ignore = [] if SGLANG_VERSION == "0.5.23" else ["on_sglang23"]


class CounterClock:
    """A clock that ticks once per read: no two stamps are equal, so LRU order is exact."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)

    def __call__(self) -> float:
        return float(next(self._ticks))


def make_scheduler(capacity: int = 256, page_size: int = 1, eviction_policy: str = "lru",
                   close_policy: str = "free", device: str = "cpu") -> Scheduler:
    return Scheduler(
        get_geometry("tiny", page_size), capacity, device=device,
        eviction_policy=eviction_policy, close_policy=close_policy, clock=CounterClock(),
    )


@pytest.fixture
def audit(tmp_path):
    """An audit journal in a file of the test's own."""
    log = AuditLog(tmp_path / "audit.jsonl")
    yield log
    log.close()


@pytest.fixture
def scheduler() -> Scheduler:
    return make_scheduler()


def check_invariants(s: Scheduler) -> None:
    """Everything that must hold between any two operations."""
    cache, allocator = s.cache, s.pool.allocator
    nodes = list(cache.iter_nodes())

    # Registry and tree agree; parents and child keys are consistent.
    assert {n.id for n in nodes} | {0} == set(cache.nodes)
    for n in nodes:
        assert n.parent is not None and n.parent.children[cache._child_key(n.key)] is n
        assert len(n.key) == len(n.value) > 0
        assert len(n.key) % cache.page_size == 0

    # Subtree sizes: each node's own tokens plus its children's subtrees.
    for n in [*nodes, cache.root_node]:
        assert n.subtree_tokens == len(n.key) + sum(c.subtree_tokens for c in n.children.values())
    assert cache.root_node.subtree_tokens == cache.total_size()
    assert not cache._pending_subtree

    # Sizes: recomputed from the tree.
    evictable = sum(len(n.key) for n in nodes if n.lock_ref == 0)
    protected = sum(len(n.key) for n in nodes if n.lock_ref > 0)
    assert cache.evictable_size() == evictable
    assert cache.protected_size() == protected

    # lock_ref: exactly the running requests whose locked path goes through the node.
    expected_locks: dict[int, int] = {}
    for req in s.running.values():
        node = req.last_node
        while node is not cache.root_node:
            expected_locks[node.id] = expected_locks.get(node.id, 0) + 1
            node = node.parent
    assert {n.id: n.lock_ref for n in nodes if n.lock_ref} == expected_locks

    # Slots: every tree slot and every running request's own slot is allocated, none twice,
    # and nothing else is allocated (no leak).
    tree_slots = np.concatenate([n.value for n in nodes]) if nodes else np.empty(0, np.int64)
    own = [r.slots[r.cache_protected_len:] for r in s.running.values()]
    own_slots = np.concatenate(own) if own else np.empty(0, np.int64)
    everything = np.concatenate([tree_slots, own_slots])
    assert np.unique(everything).size == everything.size, "a slot is used twice"
    if everything.size:
        assert allocator.is_allocated(everything).all(), "a slot in use is free"
    page = cache.page_size
    own_pages = own_slots.size
    assert allocator.used_size() == tree_slots.size + own_pages, "allocated slots leaked"

    # Pool accounting: free + evictable + protected (+ running requests' own slots) = capacity.
    stats = s.stats()
    assert stats.available_size + stats.evictable_size + stats.protected_size + own_slots.size == stats.capacity
    assert stats.request_size == own_slots.size
    assert own_slots.size % page == 0

    # Evictable leaves are exactly the unlocked childless nodes.
    assert cache.evictable_leaves == {n for n in nodes if n.lock_ref == 0 and not n.children}

    # The session index equals the holder sets, and closed sessions hold nothing.
    holders: dict[str, set[int]] = {}
    for n in nodes:
        assert n.session_ids is None or n.session_ids, "empty holder set left on a node"
        for sid in n.session_ids or ():
            holders.setdefault(sid, set()).add(n.id)
    index = {sid: {n.id for n in leaves} for sid, leaves in cache._session_leaves.items() if leaves}
    assert index == holders
    for sid in cache.closed_session_ids():
        assert sid not in holders, f"closed session {sid} still holds nodes"
