"""Shared builders and checks for the tests: the installed SGLang's version, a deterministic
clock, a small scheduler, the contract suite's known engine, and the bundled cache's invariants."""

from __future__ import annotations

import importlib.metadata
import itertools
import time

import numpy as np

from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler

try:  # from the installed metadata: importing sglang itself takes seconds
    SGLANG_VERSION: str | None = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    SGLANG_VERSION = None


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


def build_engine(born_before_s: float = 0.0) -> Engine:
    """A known cache: shared prompt [1,2,3,4]; sessions a (two turns), b, c (shares a's node);
    one request running (locks [1,2,3,4,9,9]); one closed session; no workload. ``born_before_s``:
    a pause between the cache's birth (its history's reach) and its first request (a past moment
    is told as of the end of its millisecond: the reach then holds nothing for sure)."""
    s = Scheduler(get_geometry("tiny"), 256, device="cpu", clock=CounterClock())
    time.sleep(born_before_s)
    s.request("r1", [1, 2, 3, 4, 5, 6], [7, 8], "a")
    s.request("r2", [1, 2, 3, 4, 5, 6, 7, 8, 10], [11], "a")
    s.request("r3", [1, 2, 3, 4, 20], [21, 22], "b")
    s.request("r4", [1, 2, 3, 4, 5, 6], [7, 8], "c")
    s.request("r5", [30, 31], [32], "gone")
    s.close_session("gone")
    s.begin("running", [1, 2, 3, 4, 9, 9], "d")
    s.request("r6", [40, 41, 42], [43], None)
    for k, prompt in enumerate(([50, 51], [50, 51, 52, 53], [50, 51, 52, 53, 54, 55])):
        s.request(f"run{k}", prompt, [prompt[-1] + 1], None)  # a run of single children
    check_invariants(s)
    return Engine(s, None).start()


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
    if cache.ledger is not None:
        check_ledger_records(cache)


class _Copy:
    """A copy of a tree node as the ledger reads it (its holders, key, lock count, children)."""

    __slots__ = ("id", "key", "lock_ref", "session_ids", "parent", "children", "ledger_rec")

    @classmethod
    def of(cls, root) -> _Copy:
        made = cls(root, None)
        stack = [(root, made)]
        while stack:
            node, copy = stack.pop()
            for key, child in node.children.items():
                copy.children[key] = mine = cls(child, copy)
                stack.append((child, mine))
        return made

    def __init__(self, node, parent) -> None:
        self.id, self.key, self.lock_ref = node.id, node.key, node.lock_ref
        self.session_ids = set(node.session_ids) if node.session_ids else None
        self.parent, self.children, self.ledger_rec = parent, {}, None


def check_ledger_records(cache) -> None:
    """The ledger's records as the changes left them (each node's sessions beneath with their
    reasons, holders, owner, its children's owners; no empty record) and its per-session counts
    equal those of a ledger rebuilt from the tree as it is: no stale owner or count that a later
    change would turn into a wrong figure."""
    from radixtop.gpu_backend.ledger import SessionLedger

    kept = cache.ledger
    copy = _Copy.of(cache.root_node)  # (a node has one ledger's record: the fresh one's on a copy)
    fresh = SessionLedger(copy, frees=kept.frees)
    fresh.rebuild(copy, lambda n: n.session_ids)

    def records(ledger):
        return {node.id: (dict(rec.below), frozenset(rec.held or ()), rec.owner, dict(rec.kids or {}))
                for node, rec in ledger.records()}

    assert records(kept) == records(fresh)
    assert (kept.exclusive, kept.path, kept.tags) == (fresh.exclusive, fresh.path, fresh.tags)


def stepped(read, most: int = 10_000):
    """A pass driven to its end: (its value, how many times it yielded). At most ``most`` steps:
    a pass that waits for another forever fails here instead of hanging."""
    for steps in range(most):
        try:
            next(read)
        except StopIteration as done:
            return done.value, steps
    raise AssertionError(f"no end after {most} steps")
