"""The mirror of SGLang 0.5.17+'s ``UnifiedRadixCache`` on its Python tree core (the full KV
component alone): a copy of the tree in radixtop's process beside the scheduler, made by applying
the ``UnifiedRecorder``'s records (``adapters.sglang.records``), so that the index, the ledger and
every read run there, off SGLang's GIL (issue 27).

``MirrorUnifiedCache`` is shaped as SGLang's cache as far as radixtop reads it: ``tree_core``
(``root_node``, ``_node_arena``, its ``_split_node``, ``_add_new_node``,
``_remove_leaf_from_parent`` and ``reset``), ``components`` (the full component: each node's
``component_data[FULL]`` with ``value``, ``lock_ref``, ``session_ids``, ``session_ref``; the
component's ``_session_leaves``, its locks, marks, ``register_session_leaf`` and
``release_session``) and ``session_refs`` (tombstones and generations). Each method does what
SGLang's does (the session marks and coverage moved as SGLang's full component moves them), so
``index.install`` and the ledger install on it as on SGLang's own cache, and
``SGLangInProcessAdapter`` reads it through the same ``trees.UnifiedTree``.

Not carried: KV slots (a node's ``value`` is ``True`` here: on the device), the host tier, other
components, priorities, LRU lists (the recorder refuses a cache where they would matter).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any

from radixtop.adapters.owned.records import (
    ADD,
    CLOSE,
    DELETE,
    FORGET,
    GEN,
    GENS,
    LOCK,
    MARK,
    MATCHED,
    RELEASED,
    RESET,
    SPLIT,
    STAMP,
    TAG,
    UNLOCK,
    UNMARK,
)
from radixtop.adapters.sglang.mirror import MirrorError, MirrorKey, RecordsCopy
from radixtop.adapters.sglang.records import FULL
from radixtop.gpu_backend.history import ROOT

TOMBSTONES = 8192
"""SGLang 0.5.23's ``_CLOSED_SESSION_TOMBSTONE_LIMIT``."""
MATCH_STEP = 0.00001
"""How much older SGLang stamps each ancestor of a match's best node (``_match_post_processor``)."""


class FullData:
    """A node's full-component data (SGLang's ``ComponentData``, as radixtop reads it)."""

    __slots__ = ("value", "host_value", "lock_ref", "session_ids", "session_ref")

    def __init__(self, lock_ref: int = 0, session_ref: int = 0) -> None:
        self.value: Any = True
        self.host_value = None
        self.lock_ref = lock_ref
        self.session_ids: set[str] | None = None
        self.session_ref = session_ref


class UnifiedMirrorNode:
    __slots__ = ("id", "parent", "children", "key", "component_data", "last_access_time", "creation_time",
                 "hit_count", "ledger_rec")

    def __init__(self, node_id: int, key: MirrorKey, last_access: float, created: float, hits: int = 0,
                 lock_ref: int = 0, session_ref: int = 0) -> None:
        self.id = node_id
        self.parent: UnifiedMirrorNode | None = None
        self.children: dict[Any, UnifiedMirrorNode] = {}
        self.key = key
        self.component_data = [FullData(lock_ref, session_ref)]
        self.last_access_time = last_access
        self.creation_time = created
        self.hit_count = hits
        self.ledger_rec = None


class MirrorTreeCore:
    """``UnifiedTreeCore`` as the records change it."""

    def __init__(self, page_size: int, sessions: bool) -> None:
        self.page_size = page_size
        self.enable_session_radix_cache = sessions
        self.reset()

    def reset(self, root_id: int = -1, last_access: float = 0.0) -> None:
        root = UnifiedMirrorNode(root_id, MirrorKey(array("q")), last_access, last_access, lock_ref=1)
        root.component_data[FULL].value = []
        self.root_node = root
        self._node_arena: dict[int, UnifiedMirrorNode] = {root_id: root}
        self.component_evictable_size_ = {FULL: 0}
        self.component_protected_size_ = {FULL: 0}

    def node_by_id(self, node_id: int) -> UnifiedMirrorNode:
        return self._node_arena[node_id]

    def evictable_size(self) -> int:
        return self.component_evictable_size_[FULL]

    def protected_size(self) -> int:
        return self.component_protected_size_[FULL]

    def _split_node(self, key: MirrorKey, child: UnifiedMirrorNode, split_len: int, new_id: int = -1,
                    last_access: float = 0.0, child_access: float = 0.0) -> tuple[UnifiedMirrorNode, None]:
        if new_id in self._node_arena or not 0 < split_len < len(child.key) or child.parent is None:
            raise MirrorError(f"node {child.id} cannot be split at {split_len} into a node {new_id} here")
        data = child.component_data[FULL]
        new = UnifiedMirrorNode(new_id, child.key[:split_len], last_access, child.creation_time, child.hit_count,
                                data.lock_ref, data.session_ref)
        new.children = {key[split_len:].child_key(self.page_size): child}
        new.parent = child.parent
        child.parent = new
        child.key = child.key[split_len:]
        new.parent.children[key.child_key(self.page_size)] = new  # type: ignore[union-attr]
        child.last_access_time = child_access
        self._node_arena[new_id] = new
        return new, None

    def _add_new_node(self, parent: UnifiedMirrorNode, node: UnifiedMirrorNode) -> UnifiedMirrorNode:
        if node.id in self._node_arena or node.key.child_key(self.page_size) in parent.children:
            raise MirrorError(f"node {node.id}, or its place under node {parent.id}, is taken here")
        node.parent = parent
        parent.children[node.key.child_key(self.page_size)] = node
        self._node_arena[node.id] = node
        data = node.component_data[FULL]
        if data.lock_ref:  # (a snapshot's node, locked now)
            self.component_protected_size_[FULL] += len(node.key)
        else:
            self.component_evictable_size_[FULL] += len(node.key)
        return node

    def _remove_leaf_from_parent(self, node: UnifiedMirrorNode) -> None:
        """SGLang's eviction took the node's slots off the evictable count first; the full
        component then moved its session marks to the nearest ancestor it may reuse."""
        parent = node.parent
        if parent is None or parent.children.get(node.key.child_key(self.page_size)) is not node:
            raise MirrorError(f"node {node.id} is not a child of its parent here")
        if node.children:
            raise MirrorError(f"node {node.id} is not a leaf here")
        sizes = self.component_protected_size_ if node.component_data[FULL].lock_ref else \
            self.component_evictable_size_
        sizes[FULL] -= len(node.key)
        self.full.discard_deleted_session_leaf(node)
        del parent.children[node.key.child_key(self.page_size)]
        del self._node_arena[node.id]

    full: MirrorFull


class MirrorFull:
    """SGLang's full component (``components/base.py``, ``components/full.py``): its session
    marks and coverage, and its device locks, as SGLang's code moves them."""

    component_type = FULL

    def __init__(self, core: MirrorTreeCore) -> None:
        self.tree_core = core
        core.full = self
        self.reset_session_state()

    def reset_session_state(self) -> None:
        self._session_leaves: defaultdict[str, set[UnifiedMirrorNode]] = defaultdict(set)

    def _mark_session_leaf(self, session_id: str, leaf: UnifiedMirrorNode) -> None:
        self._session_leaves[session_id].add(leaf)
        data = leaf.component_data[FULL]
        if data.session_ids is None:
            data.session_ids = set()
        data.session_ids.add(session_id)

    def _unmark_session_leaf(self, session_id: str, leaf: UnifiedMirrorNode) -> None:
        leaves = self._session_leaves.get(session_id)
        data = leaf.component_data[FULL]
        if leaves is None or leaf not in leaves or data.session_ids is None or session_id not in data.session_ids:
            raise MirrorError(f"session {session_id!r} holds no mark on node {leaf.id} here")
        leaves.remove(leaf)
        data.session_ids.remove(session_id)
        if not data.session_ids:
            data.session_ids = None
        if not leaves:
            self._session_leaves.pop(session_id, None)

    def _walk(self, leaf: UnifiedMirrorNode, stop: UnifiedMirrorNode | None, by: int) -> None:
        root = self.tree_core.root_node
        stop = root if stop is None else stop
        node: UnifiedMirrorNode | None = leaf
        while node is not None and node is not stop and node is not root:
            data = node.component_data[FULL]
            data.session_ref += by
            if data.session_ref < 0:
                raise MirrorError(f"node {node.id}'s session count would go below 0 here")
            node = node.parent

    def _nearest_session_ancestor(self, leaf: UnifiedMirrorNode, current: set[UnifiedMirrorNode]) -> Any:
        node = leaf.parent
        while node is not None and node is not self.tree_core.root_node:
            if node in current:
                return node
            node = node.parent
        return None

    def _find_reusable_session_leaf(self, node: UnifiedMirrorNode | None) -> UnifiedMirrorNode | None:
        root = self.tree_core.root_node
        while node is not None and node is not root:
            data = node.component_data[FULL]
            if data.value is not None or data.host_value is not None:
                return node
            node = node.parent
        return None

    def register_session_leaf(self, session_id: str, leaf: UnifiedMirrorNode | None) -> None:
        if not self.tree_core.enable_session_radix_cache or leaf is None or leaf is self.tree_core.root_node:
            return
        current = self._session_leaves[session_id]
        if leaf in current:
            return
        old = self._nearest_session_ancestor(leaf, current)
        self._walk(leaf, old, +1)
        self._mark_session_leaf(session_id, leaf)
        if old is not None:
            self._unmark_session_leaf(session_id, old)

    def release_session(self, session_id: str) -> int:
        leaves = tuple(self._session_leaves.get(session_id, ()))
        for leaf in leaves:
            self._walk(leaf, None, -1)
            self._unmark_session_leaf(session_id, leaf)
        return len(leaves)

    def discard_deleted_session_leaf(self, node: UnifiedMirrorNode) -> None:
        for session_id in tuple(node.component_data[FULL].session_ids or ()):
            fallback = self._find_reusable_session_leaf(node.parent)
            if fallback is not None and fallback in self._session_leaves.get(session_id, ()):
                fallback = None
            self._walk(node, fallback, -1)
            self._unmark_session_leaf(session_id, node)
            if fallback is not None:
                self._mark_session_leaf(session_id, fallback)

    def acquire_component_lock(self, node: UnifiedMirrorNode, result: Any = None, lock_host: bool = False) -> Any:
        core = self.tree_core
        root = core.root_node
        while node is not root:
            data = node.component_data[FULL]
            if data.lock_ref == 0:
                core.component_evictable_size_[FULL] -= len(node.key)
                core.component_protected_size_[FULL] += len(node.key)
            data.lock_ref += 1
            node = node.parent  # type: ignore[assignment]
        return result

    def release_component_lock(self, node: UnifiedMirrorNode, params: Any = None, lock_host: bool = False) -> None:
        core = self.tree_core
        root = core.root_node
        while node is not root:
            data = node.component_data[FULL]
            if data.lock_ref <= 0:
                raise MirrorError(f"node {node.id} is not locked here")
            if data.lock_ref == 1:
                core.component_evictable_size_[FULL] += len(node.key)
                core.component_protected_size_[FULL] -= len(node.key)
            data.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]


class MirrorRefs:
    """SGLang's ``UnifiedSessionRefTracker``: tombstones of closed sessions, generations of open ones."""

    def __init__(self, full: MirrorFull, sessions: bool) -> None:
        self.full = full
        self.enable_session_radix_cache = sessions
        self.reset()

    def reset(self) -> None:
        self._closed_session_ids: OrderedDict[str, None] = OrderedDict()
        self._session_generations: dict[str, int] = {}
        self.full.reset_session_state()

    def open_radix_session(self, session_id: str, generation: int = 0) -> int:
        self._closed_session_ids.pop(session_id, None)
        self._session_generations[session_id] = generation
        return generation

    def tombstone(self, session_id: str) -> None:
        closed = self._closed_session_ids
        closed[session_id] = None
        closed.move_to_end(session_id)
        while len(closed) > TOMBSTONES:
            closed.popitem(last=False)
        self._session_generations.pop(session_id, None)

    def release_radix_session(self, session_id: str) -> int:
        if not self.enable_session_radix_cache or session_id is None or session_id in self._closed_session_ids:
            return 0
        self.tombstone(session_id)
        self.full.release_session(session_id)
        return 0


class MirrorUnifiedCache(RecordsCopy):
    """A ``UnifiedRadixCache``-shaped copy of one SGLang tree, changed only by ``apply`` (one thread)."""

    _tree_core_backend = "python"
    marks = MARK

    def _tombstone(self, session_id: str) -> None:
        self.session_refs.tombstone(session_id)

    def __init__(self, page_size: int = 1, sessions: bool = True) -> None:
        super().__init__(page_size, sessions)
        self.tree_core = MirrorTreeCore(page_size, sessions)
        full = MirrorFull(self.tree_core)
        self.components = {FULL: full}
        self.session_refs = MirrorRefs(full, sessions)

    @property
    def root_node(self) -> UnifiedMirrorNode:
        return self.tree_core.root_node

    @property
    def by_id(self) -> dict[int, UnifiedMirrorNode]:
        """Every node by its id (the tree core's arena; ``MirrorCache``'s name for it)."""
        return self.tree_core._node_arena

    def evictable_size(self) -> int:
        return self.tree_core.evictable_size()

    def protected_size(self) -> int:
        return self.tree_core.protected_size()

    def release_radix_session(self, session_id: str) -> int:
        return self.session_refs.release_radix_session(session_id)

    def _node(self, node_id: int) -> UnifiedMirrorNode:
        node = self.tree_core._node_arena.get(node_id)
        if node is None:
            raise MirrorError(f"no node {node_id} here")
        return node

    def _apply(self, records: Iterable[Any]) -> None:
        node_of, core, full, refs = self._node, self.tree_core, self.components[FULL], self.session_refs
        for record in records:
            kind = record[0]
            self.applied += 1
            if kind == STAMP:
                _, node_id, t, hits = record
                node = node_of(node_id)
                node.last_access_time, node.hit_count = t, hits
            elif kind == MATCHED:
                t = record[2]
                node: UnifiedMirrorNode | None = node_of(record[1])
                while node is not None:
                    node.last_access_time = t
                    t -= MATCH_STEP
                    node = node.parent
            elif kind == LOCK:
                full.acquire_component_lock(node=node_of(record[1]), result=None)
            elif kind == UNLOCK:
                full.release_component_lock(node=node_of(record[1]), params=None)
            elif kind == ADD:
                _, node_id, parent_id, tokens, extra, last_access, created, hits, lock_ref, session_ref, salt = record
                parent = node_of(parent_id)
                added = core._add_new_node(parent, UnifiedMirrorNode(
                    node_id, MirrorKey(self._tokens(node_id, tokens), extra, salt), last_access, created, hits,
                    lock_ref, session_ref))
                self.history.stored(node_id, ROOT if parent is core.root_node else parent_id, len(added.key))
            elif kind == SPLIT:
                _, new_id, child_id, split_len, last_access, child_access = record
                child = node_of(child_id)
                core._split_node(child.key, child, split_len, new_id, last_access, child_access)
                self.history.split(new_id, child_id, split_len)
            elif kind == DELETE:  # (the unified tree frees nodes by eviction only: a close dereferences)
                node = node_of(record[1])
                parent = node.parent
                core._remove_leaf_from_parent(node)
                with self._evicting():
                    self._gone(node, parent)
            elif kind == MARK:
                full._mark_session_leaf(record[1], node_of(record[2]))
            elif kind == UNMARK:
                full._unmark_session_leaf(record[1], node_of(record[2]))
            elif kind == TAG:
                full.register_session_leaf(record[1], None if record[2] is None else node_of(record[2]))
            elif kind == RELEASED:
                full.release_session(record[1])
            elif kind == CLOSE:
                refs.release_radix_session(record[1])
            elif kind == GEN:
                refs.open_radix_session(record[1], record[2])
            elif kind == GENS:
                for sid, generation in zip(record[1], record[2], strict=True):
                    refs.open_radix_session(sid, generation)
            elif kind == FORGET:
                refs.reset()
            elif kind == RESET:
                _, root_id, whole, root_access = record
                if whole:  # (what left while the whole tree was on its way is not known)
                    self.history.gap()
                else:
                    self._flushed()
                self._begin(bool(whole))
                if whole:  # a snapshot: the sessions' state comes in it
                    refs.reset()
                core.reset(root_id, root_access)
            elif not self._shared(kind, record):
                raise MirrorError(f"a record of unknown kind {kind!r}")
