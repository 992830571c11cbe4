"""ChildOrders: a wide node's children kept in each order a reader asked for (owner thread only).

A node with more than SORT_CHUNK children (a few-shot prompt with 200k continuations) is ranked
once, a step a slice, into a ``SortedList`` per order; from then on the cache names the children
that may have moved (``RadixCache.child_watch``: added, removed, resized, refreshed), and a read
re-keys those (O(log n) each, a step a slice) and slices its page by index: O(log n + page) plus
what moved since, at any offset. Before, every read ranked the first offset + limit of all of
them: a page at offset 150,000 of 200k children took minutes (504 after 10 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from radixtop.gpu_backend.radix_cache import RadixCache, TreeNode

CHILD_KEYS: dict[str, Callable[[TreeNode], tuple[Any, int]]] = {
    "bytes": lambda n: (-n.subtree_tokens, n.id),
    "recency": lambda n: (-n.last_access_time, n.id),
    "tokens": lambda n: (-len(n.key), n.id),
}
"""Each order's key: the largest (or newest) first, ties by id."""
STEP_S = 0.001
"""A loop over children yields once it has run this long (checked every CHECK_EVERY children): a
child costs 2-5 us per order kept, so a count alone would not bound a step."""
CHECK_EVERY = 32
MAX_KEPT = 16
"""Parents kept at once; the one read longest ago goes first."""
FORGET_S = 600.0
"""A parent's orders nobody read for this long are dropped (and the cache stops naming its children)."""


SHARDS = 64


@dataclass
class _Order:
    """One order: the children's keys sorted, and each child's key by its id, in SHARDS dicts (one
    dict of 200k ids stalls a step for milliseconds each time it grows)."""

    keys: SortedList = field(default_factory=SortedList)
    key_of: list[dict[int, tuple[Any, int]]] = field(default_factory=lambda: [{} for _ in range(SHARDS)])
    ready: bool = False


@dataclass
class _Kept:
    """One parent's orders, and the children not yet keyed into a new one."""

    parent: TreeNode
    orders: dict[str, _Order] = field(default_factory=dict)
    read_at: float = 0.0


class ChildOrders:
    """The kept orders of one cache's wide nodes. Every method runs on the cache's owner thread;
    ``page_pass`` is a pass (it yields between slices, and may see the tree change there)."""

    def __init__(self) -> None:
        self._kept: dict[int, _Kept] = {}
        self.rankings = 0
        """Orders ranked from every child (a first read, a dropped tree, or a move not named)."""

    def page_pass(self, cache: RadixCache, parent: TreeNode, order: str, offset: int,
                  limit: int) -> Generator[None, None, list[TreeNode] | None]:
        """``parent``'s children ``[offset, offset + limit)`` in ``order``, exact as of the slice
        that returns them; None if ``parent`` left the tree meanwhile."""
        for _ in range(2):
            kept = self._kept.get(parent.id)
            if kept is None or kept.parent is not parent or parent.id not in cache.child_watch:
                kept = self._watch(cache, parent)
            kept.read_at = time.monotonic()
            entry = kept.orders.setdefault(order, _Order())
            if not entry.ready:
                yield from self._build(cache, kept, order, entry)
            yield from self._settle(cache, kept)
            if not self._still_watched(cache, kept):
                return None
            if len(entry.keys) == len(parent.children):
                nodes = cache.nodes
                return [nodes[key[-1]] for key in entry.keys[offset : offset + limit]]
            self._forget(cache, parent.id)  # (a move the cache did not name: ranked again, once)
        raise RuntimeError(f"the kept order of node {parent.id}'s children does not hold them all")

    def _watch(self, cache: RadixCache, parent: TreeNode) -> _Kept:
        self._forget(cache, parent.id)
        now = time.monotonic()
        for stale in [i for i, k in self._kept.items() if now - k.read_at > FORGET_S]:
            self._forget(cache, stale)
        while len(self._kept) >= MAX_KEPT:
            self._forget(cache, min(self._kept, key=lambda i: self._kept[i].read_at))
        kept = self._kept[parent.id] = _Kept(parent)
        cache.child_watch[parent.id] = set()  # from now on the cache names what moves
        return kept

    def _forget(self, cache: RadixCache, parent_id: int) -> None:
        if self._kept.pop(parent_id, None) is not None:
            cache.child_watch.pop(parent_id, None)

    def _still_watched(self, cache: RadixCache, kept: _Kept) -> bool:
        parent = kept.parent
        alive = cache.nodes.get(parent.id) is parent and parent.id in cache.child_watch
        if not alive:
            self._forget(cache, parent.id)
        return alive

    def _build(self, cache: RadixCache, kept: _Kept, order: str,
               entry: _Order) -> Generator[None, None, None]:
        """Key every child into ``entry``, a step at a time. What moves meanwhile is named in the
        watch (the settle that follows re-keys it); a child gone before its step is skipped."""
        key = CHILD_KEYS[order]
        parent = kept.parent
        children = list(parent.children.values())
        self.rankings += 1
        until = time.perf_counter() + STEP_S
        for i, node in enumerate(children):
            if i % CHECK_EVERY == 0 and time.perf_counter() > until:
                yield
                if not self._still_watched(cache, kept):
                    return
                until = time.perf_counter() + STEP_S
            if node.parent is parent and node.id not in (shard := entry.key_of[node.id % SHARDS]):
                k = shard[node.id] = key(node)
                entry.keys.add(k)
        entry.ready = True
        yield  # (the page is sliced in a step of its own)

    def _settle(self, cache: RadixCache, kept: _Kept) -> Generator[None, None, None]:
        """Re-key in every order the children the cache named since, a step at a time, until
        none is left (what moves meanwhile is named again)."""
        parent = kept.parent
        until = time.perf_counter() + STEP_S
        while self._still_watched(cache, kept):
            moved = cache.child_watch[parent.id]
            if not moved:
                return
            cache.child_watch[parent.id] = set()  # (a set drained by pop() stays slow: a new one)
            for i, node in enumerate(list(moved)):
                if i % CHECK_EVERY == 0 and time.perf_counter() > until:
                    yield
                    if not self._still_watched(cache, kept):
                        return
                    until = time.perf_counter() + STEP_S
                there = node.parent is parent and cache.nodes.get(node.id) is node
                for order, entry in kept.orders.items():  # (one being built too: it skips what is keyed)
                    shard = entry.key_of[node.id % SHARDS]
                    old = shard.pop(node.id, None)
                    if old is not None:
                        entry.keys.remove(old)
                    if there:
                        k = shard[node.id] = CHILD_KEYS[order](node)
                        entry.keys.add(k)
