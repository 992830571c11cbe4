"""TreeIndex: every node of an SGLang tree by id, and each node's subtree tokens, kept exact as SGLang
changes the tree, so that no read has to walk it on the scheduler thread.

SGLang keeps neither (its ``RadixCache`` has no registry and no subtree sizes), and a walk of a
million-node tree holds the scheduler for seconds. The index follows the tree's own mutation
methods instead, wrapped on the cache instance (a method of SGLang's, called by SGLang, on its
scheduler thread; the wrapper adds O(1) work, or O(depth) for a new or removed leaf):

* ``RadixCache`` (0.5.15/0.5.16 with or without sessions; 0.5.17+): ``_split_node`` (a new node
  above a child: the child's subtree moves up, the child keeps the rest), ``_insert_helper`` (the
  node it returns is a new leaf when the index has not seen it: its tokens go to every ancestor),
  ``_delete_leaf`` (eviction and session close both remove leaves only), ``reset``;
* ``UnifiedRadixCache`` with the Python tree core (0.5.17+): ``tree_core._split_node``,
  ``_add_new_node``, ``_remove_leaf_from_parent``, ``insert_host`` (a host-only node) and ``reset``.

Subtree tokens count every node the tree holds (a node whose KV was evicted to the host keeps its
place and its tokens), as a walk of ``node.children`` would. ``verify()`` does that walk and says
where the index differs (the tests call it after every kind of operation).
"""

from __future__ import annotations

import functools
import heapq
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from radixtop.gpu_backend.history import CacheHistory
from radixtop.gpu_backend.ledger import SessionLedger
from radixtop.gpu_backend.owner.shards import SHARD_MASK, ShardedMap

log = logging.getLogger("radixtop.sglang")

INDEX = "_radixtop_index"
KEEP = 256
"""Children kept ranked per node read (at least twice the page asked for)."""
RANK_CHUNK = 1024
"""Children ranked per chunk of a full ranking."""
FORGET_S = 120.0
"""A node's ranking not read for this long is dropped."""


@dataclass
class _Ranked:
    """A node's children ranked by subtree tokens when last read, and those changed since."""

    ids: list[int]
    threshold: tuple[int, int] | None
    """The key of the last kept child: children not kept and not changed rank after it (None: all kept)."""
    dirty: set[int] = field(default_factory=set)
    read_at: float = 0.0


class TreeIndex:
    """Nodes by id and subtree tokens of one SGLang tree (owner thread only)."""

    def __init__(self, root_of: Callable[[], Any]) -> None:
        self._root_of = root_of
        self.nodes: ShardedMap[int, Any] = ShardedMap()
        self.subtree: ShardedMap[int, int] = ShardedMap()
        """Both in shards: a dict of every node rebuilt its whole table in one hooked insert
        (~50 ms per map at 1M nodes, every ~400k inserts at capacity; ``ShardedMap``)."""
        self.changes = 0
        """Mutations seen (a node split, added or removed): the tree's version."""
        self._ranked: dict[int, _Ranked] = {}
        self.ledger: SessionLedger | None = None
        """Every session's figures, kept by the hooks (``install``) where the tree has sessions."""
        self.rebuild()

    # ----- reads -----

    @property
    def root(self) -> Any:
        return self._root_of()

    @property
    def count(self) -> int:
        """Nodes in the tree, the root excluded."""
        return len(self.nodes) - 1

    def get(self, node_id: int) -> Any | None:
        return self.nodes.get(node_id)

    def tokens_below(self, node: Any) -> int:
        """The tokens of ``node`` and everything below it."""
        known = self.subtree.get(node.id)
        if known is not None and self.nodes.get(node.id) is node:
            return known
        return _walk_sizes(node)[1].get(node.id, 0)  # not indexed (never: a hook is missing)

    # ----- the walk: at attach, after a reset, and to verify -----

    def rebuild(self) -> None:
        nodes, subtree = _walk_sizes(self.root)
        self.nodes, self.subtree = ShardedMap(nodes), ShardedMap(subtree)
        self._ranked = {}
        self.changes += 1

    # ----- children ranked by subtree tokens, kept between reads -----

    def top_children(self, node: Any, want: int) -> Generator[None, None, list[Any]]:
        """The ``want`` children of ``node`` with the most subtree tokens (ties: lower id first),
        exactly, as a pass. A node read before re-ranks only its last top children and
        those whose subtree changed since (O(page + changes)); the first read, or one that the
        changes leave short, ranks them all, ``RANK_CHUNK`` a chunk."""
        subtree = self.subtree
        key = lambda n: (-subtree[n.id], n.id)  # noqa: E731
        now = time.monotonic()
        ranked = self._ranked.get(node.id)
        keep = max(KEEP, 2 * want)
        if ranked is not None:
            # Every child outside the kept ids and not changed since ranks after ``threshold``.
            # The changed ones taken now (a change meanwhile marks its child again), ranked with
            # the kept ones ``RANK_CHUNK`` a step: up to 8 x KEEP of them in one step held
            # SGLang's scheduler 6 ms at 1M nodes.
            kept, dirty = ranked.ids, ranked.dirty
            ids = list(dict.fromkeys([*kept, *dirty]))
            ranked.dirty = set()
            top, seen = [], 0
            for start in range(0, len(ids), RANK_CHUNK):
                if start:
                    yield
                chunk = [n for i in ids[start : start + RANK_CHUNK]
                         if (n := self.nodes.get(i)) is not None and n.parent is node]
                seen += len(chunk)
                top = heapq.nsmallest(keep, [*top, *chunk], key=key)
            if self._ranked.get(node.id) is ranked and ranked.ids is kept:  # (no other read kept another)
                exact = ranked.threshold is None or (len(top) >= want and key(top[want - 1]) < ranked.threshold)
                if exact:
                    if seen > keep:  # the dropped rank after the last kept, and the rest
                        last = key(top[-1])
                        ranked.threshold = last if ranked.threshold is None else min(last, ranked.threshold)
                    ranked.ids = [n.id for n in top]
                    ranked.read_at = now
                    return top[:want]
            ranked.dirty |= dirty  # not kept: ranked in full below
        kids = list(node.children.values())
        top: list[Any] = []
        for start in range(0, len(kids), RANK_CHUNK):
            top = heapq.nsmallest(keep, [*top, *kids[start : start + RANK_CHUNK]], key=key)
            if len(kids) > RANK_CHUNK:
                yield
        if node.id in self.nodes:
            threshold = key(top[-1]) if top and len(top) < len(kids) else None
            self._ranked[node.id] = _Ranked([n.id for n in top], threshold, read_at=now)
        if len(self._ranked) > 64:  # forget rankings nobody reads any more
            for node_id in [i for i, r in self._ranked.items() if now - r.read_at > FORGET_S]:
                del self._ranked[node_id]
        return top[:want]

    def _changed_below(self, node: Any) -> None:
        """``node``'s subtree changed: its parent's ranking, if kept, looks at it again."""
        parent = node.parent
        if parent is not None:
            ranked = self._ranked.get(parent.id)
            if ranked is not None:
                ranked.dirty.add(node.id)
                if len(ranked.dirty) > 8 * KEEP:  # rank it all again rather than track this many
                    del self._ranked[parent.id]

    def verify(self) -> list[str]:
        """Where the index differs from a walk of the tree now (empty: it does not)."""
        nodes, subtree = _walk_sizes(self.root)
        problems = []
        if set(nodes) != set(self.nodes):
            problems.append(f"ids: missing {sorted(set(nodes) - set(self.nodes))[:10]}, "
                            f"stale {sorted(set(self.nodes) - set(nodes))[:10]}")
        wrong = {i: (self.subtree.get(i), t) for i, t in subtree.items() if self.subtree.get(i) != t}
        if wrong:
            problems.append(f"subtree tokens (index, walk): {dict(list(wrong.items())[:10])}")
        return problems

    # ----- what the hooks report -----

    def split(self, new_node: Any, child: Any) -> None:
        """``new_node`` now holds the first part of ``child``'s old key, above it."""
        c, n = child.id, new_node.id  # ids are ints: their shards reached inline (a hot path)
        counts = self.subtree.shards
        old = counts[c & SHARD_MASK].get(c)
        if old is None:
            self.rebuild()
            return
        self.nodes.shards[n & SHARD_MASK][n] = new_node
        counts[n & SHARD_MASK][n] = old
        counts[c & SHARD_MASK][c] = old - len(new_node.key)
        self._changed_below(new_node)  # it took the child's place under the parent
        self.changes += 1

    def added(self, node: Any) -> None:
        """``node`` is a new leaf (already attached to its parent)."""
        i = node.id
        ids = self.nodes.shards[i & SHARD_MASK]
        if i in ids:
            return
        tokens = len(node.key)
        ids[i] = node
        self.subtree.shards[i & SHARD_MASK][i] = tokens
        self._carry_up(node, tokens)

    def removed(self, node: Any) -> None:
        """``node``, a leaf, left the tree."""
        if self.nodes.pop(node.id, None) is None:
            return
        tokens = self.subtree.pop(node.id, len(node.key))
        self._ranked.pop(node.id, None)
        self._carry_up(node, -tokens)

    def _carry_up(self, node: Any, delta: int) -> None:
        """``delta`` tokens more in the subtree of each of ``node``'s ancestors, O(depth), each
        ancestor's shard reached inline (ids are ints: a hot path); a removal leaves an ancestor
        the index does not know as it is."""
        shards, ranked, root = self.subtree.shards, self._ranked, self.root
        child, parent = node, node.parent
        while parent is not None:
            i = parent.id
            counts = shards[i & SHARD_MASK]
            if delta > 0 or i in counts:
                counts[i] = counts.get(i, 0) + delta
            if ranked:
                self._changed_below(child)
            if parent is root:
                break
            child, parent = parent, parent.parent
        self.changes += 1


def _walk_sizes(top: Any) -> tuple[dict[int, Any], dict[int, int]]:
    """Every node under ``top`` (itself included) by id, and each one's subtree tokens."""
    order, stack = [], [top]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    nodes: dict[int, Any] = {}
    subtree: dict[int, int] = {}
    for node in reversed(order):  # children before parents
        total = len(node.key) if node.key is not None else 0
        for child in node.children.values():
            total += subtree[child.id]
        subtree[node.id] = total
        nodes[node.id] = node
    return nodes, subtree


def _wrap(owner: Any, name: str, after: Callable[..., None], before: Callable[..., Any] | None = None) -> bool:
    """Wrap ``owner.name`` on the instance: ``after(result, *args)`` runs after each call; with
    ``before``, ``after(kept, *args)`` runs after each call, even one that raised, ``kept`` what
    ``before(*args)`` returned before it."""
    original = getattr(owner, name, None)
    if not callable(original):
        return False

    @functools.wraps(original)
    def observed(*args: Any, **kwargs: Any) -> Any:
        if before is None:
            result = original(*args, **kwargs)
            after(result, *args, **kwargs)
            return result
        kept = before(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            after(kept, *args, **kwargs)

    setattr(owner, name, observed)
    return True


def install(cache: Any) -> TreeIndex | None:
    """The index of ``cache``, installed once per cache (None: a tree this cannot follow, e.g. the
    Rust core, which has no Python nodes)."""
    existing = getattr(cache, INDEX, None)
    if existing is not None:
        return existing
    if hasattr(cache, "tree_core"):
        core = cache.tree_core
        if not hasattr(core, "_node_arena"):
            return None
        index = TreeIndex(lambda: core.root_node)
        hooks = [
            _wrap(core, "_split_node", lambda result, key, child, split_len, *a, **k:
                  index.split(result[0], child)),
            _wrap(core, "_add_new_node", lambda result, *a, **k: index.added(result)),
            _wrap(core, "_remove_leaf_from_parent", lambda result, node, *a, **k: index.removed(node)),
            _wrap(core, "reset", lambda result, *a, **k: index.rebuild()),
        ]
        _wrap(core, "insert_host", lambda result, *a, **k: _host_node(index, core, result))
        full = _full_component(cache)
        if all(hooks) and full is not None and getattr(cache, "enable_session_radix_cache", False):
            hooks.append(_keep_unified_ledger(core, full, index, cache))
    else:
        if not hasattr(cache, "root_node"):
            return None
        index = TreeIndex(lambda: cache.root_node)
        hooks = [
            _wrap(cache, "_split_node", lambda new_node, key, child, split_len, *a, **k:
                  index.split(new_node, child)),
            _wrap(cache, "_insert_helper", lambda result, *a, **k: index.added(result[1])
                  if result[1] is not index.root else None),
            _wrap(cache, "_delete_leaf", lambda result, node, *a, **k: index.removed(node)),
            _wrap(cache, "reset", lambda result, *a, **k: index.rebuild()),
        ]
        if all(hooks) and getattr(cache, "enable_session_radix_cache", False) \
                and hasattr(cache, "release_radix_session"):
            hooks.append(_keep_ledger(cache, index))
    if not all(hooks):
        return None
    setattr(cache, INDEX, index)
    return index


FULL = 0
"""``ComponentType.FULL``: a unified node's ``component_data`` is a list indexed by it."""


def _full_component(cache: Any) -> Any | None:
    components = getattr(cache, "components", None) or ()
    for component in components.values() if isinstance(components, dict) else components:
        if int(getattr(component, "component_type", -1)) == FULL:
            return component
    return None


def _keep_unified_ledger(core: Any, full: Any, index: TreeIndex, cache: Any) -> bool:
    """Keep a ``SessionLedger`` of a 0.5.17+ ``UnifiedRadixCache`` on the Python tree core with
    sessions (the deref policy: a close drops references, frees nothing, so exclusive stays 0 and
    no lock needs following): its full component's mark and unmark of a session leaf are every
    change of a node's holders; the core's split, new node and removal, the tree's."""
    holders = lambda node: node.component_data[FULL].session_ids  # noqa: E731
    try:
        ledger = SessionLedger(core.root_node, frees=False, lock_of=lambda node: node.component_data[FULL].lock_ref,
                               locks_told=False)
    except TypeError as exc:  # nodes that cannot keep its records: the tree without sessions' figures
        log.warning("radixtop: %s; sessions are unavailable on this cache", exc)
        return True
    ledger.rebuild(core.root_node, holders)
    index.ledger = ledger
    _journal_to(ledger, cache)
    hooks = [
        _wrap(core, "_split_node", lambda result, key, child, *a, **k: ledger.split(result[0], child)),
        _wrap(core, "_add_new_node", lambda result, *a, **k: ledger.added(result)),
        _wrap(core, "_remove_leaf_from_parent", lambda result, node, *a, **k: ledger.removed(node, node.parent)),
        _wrap(core, "reset", lambda result, *a, **k: ledger.rebuild(core.root_node, holders)),
        _wrap(full, "_mark_session_leaf", lambda result, sid, leaf, *a, **k: ledger.tag(sid, leaf)),
        _wrap(full, "_unmark_session_leaf", lambda result, sid, leaf, *a, **k: ledger.untag(sid, leaf)),
        _wrap(full, "register_session_leaf", lambda result, sid, *a, **k: ledger.touch(sid)),
        _wrap(full, "release_session", lambda result, sid, *a, **k: ledger.touch(sid)),
    ]
    _activity_told(cache, ledger)

    def crossed(now: int) -> Callable[..., None]:
        """After the full component locked (``now`` 1) or released (0) a path: the nodes on it
        whose count crossed zero."""
        def walk(_returned: Any, *a: Any, **k: Any) -> None:  # (node, result or params, lock_host)
            node = k["node"] if "node" in k else (a[0] if a else None)
            if k.get("lock_host", a[2] if len(a) > 2 else False):
                return  # a host lock: the device slots' locks did not move
            _tell_crossings(ledger, core.root_node, node, now)
        return walk

    def tell_locks() -> bool:
        """Follow the locks from now on (a reader asked for the sessions by locked tokens): a
        walk of the locked path after each of the full component's locks and releases."""
        if not ledger.locks_told:
            ledger.locks_told = (_wrap(full, "acquire_component_lock", crossed(1))
                                 and _wrap(full, "release_component_lock", crossed(0)))
        return ledger.locks_told

    ledger.tell_locks = tell_locks
    return all(hooks)


def _tell_crossings(ledger: SessionLedger, root: Any, node: Any, now: int) -> None:
    """After a lock (``now`` 1) or an unlock (0) of the path from ``node`` to ``root``: the path,
    once, to a reader by locks, and each node on it whose count crossed zero."""
    if ledger.lock_watched:
        ledger.locks_moved(node)
    while node is not None and node is not root:
        if ledger.lock_count(node) == now:
            ledger.lock_changed(node)
        node = node.parent


def _journal_to(ledger: SessionLedger, cache: Any) -> None:
    """Tell the cache's history each move of a session's figures (the sessions' memory at a past
    moment), where it keeps one: radixtop's copy of SGLang's tree beside the scheduler does
    (``mirror.RecordsCopy.history``); SGLang's own cache, in its process, keeps none."""
    history = getattr(cache, "history", None)
    if isinstance(history, CacheHistory):
        ledger.journal = history
        history.tells_figures()


def _holders(node: Any) -> set[str] | None:
    return getattr(node, "session_ids", None)


def _keep_ledger(cache: Any, index: TreeIndex) -> bool:
    """Keep a ``SessionLedger`` of a 0.5.15/0.5.16 ``RadixCache`` with sessions (the free
    policy), after the index's own hooks (wrapped outside them, so it sees the index updated):
    the session mixin's tag and close, and the locks crossing zero. Each adds O(depth)."""
    try:
        ledger = SessionLedger(cache.root_node, frees=getattr(cache, "mirrored_close_policy", "free") == "free")
    except TypeError as exc:  # nodes that cannot keep its records: the tree without sessions' figures
        log.warning("radixtop: %s; sessions are unavailable on this cache", exc)
        return True
    ledger.rebuild(cache.root_node, _holders)
    _journal_to(ledger, cache)
    # what each session did before radixtop came: its newest tagged node's last access (SGLang's
    # RadixCache reads time.monotonic()); from now on, its requests' finishes
    for sid, leaves in list((getattr(cache, "_session_leaves", None) or {}).items()):
        if leaves:
            ledger.seen[sid] = max(node.last_access_time for node in leaves)
    index.ledger = ledger

    def tagged(result: Any, req: Any, radix_key: Any = None, node: Any = None, *a: Any, **k: Any) -> None:
        sid = getattr(req, "session_id", None)
        if sid is None:
            return
        ledger.touch(sid)
        if node is None:  # SGLang matched the node itself (it warns): which one is not known here
            ledger.rebuild(cache.root_node, _holders)
        elif sid in (_holders(node) or ()):
            ledger.tag(sid, node)

    def crossed(now: int) -> Callable[..., None]:
        """After a lock (``now`` 1: from 0) or an unlock (``now`` 0: from 1) of a path: the
        nodes on it whose count crossed zero."""
        def walk(result: Any, node: Any, *a: Any, **k: Any) -> None:
            _tell_crossings(ledger, cache.root_node, node, now)
        return walk

    hooks = [
        _wrap(cache, "_split_node", lambda new_node, key, child, *a, **k: ledger.split(new_node, child)),
        _wrap(cache, "_insert_helper", lambda result, *a, **k: ledger.added(result[1])
              if result[1] is not cache.root_node and result[1].parent is not None else None),
        _wrap(cache, "_delete_leaf", lambda result, node, *a, **k: ledger.removed(node, node.parent)),
        _wrap(cache, "reset", lambda result, *a, **k: ledger.reset(cache.root_node)),
        _wrap(cache, "_tag_session_leaf", tagged),
        _wrap(cache, "inc_lock_ref", crossed(1)),
        _wrap(cache, "dec_lock_ref", crossed(0)),
    ]
    _activity_told(cache, ledger)
    original = cache.release_radix_session

    @functools.wraps(original)
    def release(session_id: str, *a: Any, **k: Any) -> Any:
        leaves = getattr(cache, "_session_leaves", None) or {}
        closed = getattr(cache, "_closed_session_ids", None) or {}
        tagged_nodes = list(leaves.get(session_id, ()))
        oldest = next(iter(closed), None)
        with ledger.batch():  # each node's owner settled once, after the close
            try:
                return original(session_id, *a, **k)
            finally:
                for node in tagged_nodes:  # the holds the close dropped on nodes it kept
                    if session_id not in (_holders(node) or ()):
                        ledger.untag(session_id, node)
                ledger.touch(session_id)  # closed now
                if oldest is not None and oldest not in closed:  # its tombstone fell off: open again
                    ledger.moved.add(oldest)

    cache.release_radix_session = release
    evict = cache.evict

    @functools.wraps(evict)
    def batched_evict(*a: Any, **k: Any) -> Any:
        with ledger.batch():
            return evict(*a, **k)

    cache.evict = batched_evict
    return all(hooks)


def _activity_told(cache: Any, ledger: Any) -> None:
    """On radixtop's copy of a tree (``adapters.sglang.mirror``): the sessions' activity during a
    whole tree's walk, told with it (``session_seen``)."""
    if hasattr(cache, "session_seen"):
        _wrap(cache, "session_seen", lambda result, sid, t, *a, **k: ledger.touch(sid, t))


def _host_node(index: TreeIndex, core: Any, result: Any) -> None:
    node_id = getattr(result, "inserted_host_node", None)
    if node_id is not None and node_id not in index.nodes:
        node = core._node_arena.get(node_id)
        if node is not None:
            index.added(node)
