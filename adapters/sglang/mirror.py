"""The mirror: a copy of an SGLang Python-core tree in radixtop's process beside the scheduler,
made by applying the probe's change records (``adapters.sglang.records``), so that the tree's
index, the sessions' ledger and every read run here, off SGLang's GIL (issue 27).

``MirrorCache`` is shaped as SGLang 0.5.16's ``RadixCache`` as far as radixtop reads it: nodes with
the fields SGLang's have (``id``, ``parent``, ``children`` by SGLang's own child key, ``key`` with
``token_ids``, ``lock_ref``, ``last_access_time``, ``hit_count``, ``session_ids``), the session
mixin's ``_session_leaves`` and ``_closed_session_ids``, and the methods SGLang changes its tree
with (``_split_node``, ``_insert_helper``, ``_delete_leaf``, ``evict``, ``release_radix_session``,
``inc_lock_ref``, ``dec_lock_ref``, ``_tag_session_leaf``, ``reset``), each doing what the record
says SGLang did. So the index and the ledger install on it exactly as they do on SGLang's own cache
(``adapters.sglang.index.install`` wraps those methods), and ``SGLangInProcessAdapter`` reads it as
it reads SGLang's: one code for both places, checked against each other by the tests.

What the records cannot carry is not guessed: a node's KV slots (no read needs them), HiCache's
host copies (the recorder refuses such a cache).
"""

from __future__ import annotations

import contextlib
import time
from array import array
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any

from radixtop.adapters.owned.records import (
    ADD,
    BEGIN,
    CAUSE,
    CLOSE,
    DELETE,
    DROP,
    ENDED,
    EVICT,
    LOCK,
    NODE,
    OP,
    OPENED,
    OPENS,
    PART,
    REOPENED,
    RESET,
    SEEN,
    SPLIT,
    TAG,
    TOMBS,
    TOUCH,
    UNLOCK,
    WHOLE,
    ids_of,
)
from radixtop.gpu_backend.history import CLOSED, EVICTED, FLUSHED, ROOT, CacheHistory

TOMBSTONES = 8192
"""SGLang 0.5.16's ``_CLOSED_SESSION_TOMBSTONE_LIMIT``: closed ids it remembers, oldest dropped first."""


class MirrorKey:
    """A node's key: its token ids, SGLang's ``extra_key`` namespace and (0.5.23) its
    ``cache_salt`` (``RadixKey``'s reads)."""

    __slots__ = ("token_ids", "extra_key", "cache_salt")

    def __init__(self, token_ids: array, extra_key: str | None = None, cache_salt: str | None = None) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, part: slice) -> MirrorKey:
        return MirrorKey(self.token_ids[part], self.extra_key, self.cache_salt)

    def child_key(self, page_size: int = 1) -> Any:
        t = self.token_ids
        plain = t[0] if page_size == 1 else tuple(t[:page_size])
        if self.cache_salt is not None:
            return ((self.extra_key, self.cache_salt), plain)
        return plain if self.extra_key is None else (self.extra_key, plain)


class MirrorNode:
    __slots__ = ("id", "parent", "children", "key", "lock_ref", "last_access_time", "creation_time", "hit_count",
                 "session_ids", "ledger_rec", "value", "host_value")

    def __init__(self, node_id: int, key: MirrorKey, last_access: float, created: float, hits: int = 0,
                 lock_ref: int = 0) -> None:
        self.id = node_id
        self.parent: MirrorNode | None = None
        self.children: dict[Any, MirrorNode] = {}
        self.key = key
        self.lock_ref = lock_ref
        self.last_access_time = last_access
        self.creation_time = created
        self.hit_count = hits
        self.session_ids: set[str] | None = None
        self.ledger_rec = None
        self.value = True  # (on the device: the mirror follows no host tier)
        self.host_value = None


class MirrorError(ValueError):
    """A record the mirror cannot apply (a node it does not have): it no longer equals SGLang's tree."""


class _Slots:
    """The pool's totals as the probe last read them (``stats``): what ``SGLangInProcessAdapter``
    reads of SGLang's allocator."""

    def __init__(self) -> None:
        self.size = 0
        self.available = 0

    def available_size(self) -> int:
        return self.available


class RecordsCopy:
    """What both copies (``MirrorCache``, ``mirror_unified.MirrorUnifiedCache``) keep besides the
    tree: the pool's totals, the session controller, the snapshots received, a long prompt's parts."""

    def __init__(self, page_size: int, sessions: bool) -> None:
        self.page_size = page_size
        self.enable_session_radix_cache = sessions
        self.token_to_kv_pool_allocator = _Slots()
        self.applied = 0
        self.controller = MirrorController()
        """The scheduler's ``SessionController`` as far as radixtop follows it (``OPENED``/``ENDED``)."""
        self.wholes = 0
        """Snapshots received whole (``WHOLE``)."""
        self.receiving = False
        """The whole tree is on its way (a snapshot's ``RESET`` came, its ``WHOLE`` not yet)."""
        self._parts: dict[int, list[bytes]] = {}
        """The first tokens of a node whose ``ADD`` comes next (``PART`` records)."""
        self._apart: dict[int, tuple] | None = None
        """The whole tree on its way (``BEGIN`` came, its ``WHOLE`` not yet): each node as last
        sent, by id; the tree read meanwhile is the one before it."""
        self._after: list[tuple] = []
        """... and what it holds besides its nodes (its root's ``RESET``, tombstones, sessions)."""
        self.history = CacheHistory()
        """What left SGLang's tree, when and why (``gpu_backend.history``: ``why``), kept here
        from the records: nothing of it in the scheduler."""
        """The cause a ``CAUSE`` record set (an action the probe ran), entered until the next one."""

    marks = TAG
    """The record that puts a session's mark on a node (``TAG`` here, ``MARK`` on the unified copy)."""

    def apply(self, records: list[Any]) -> None:
        """Make each record's change (in order). ``MirrorError`` where one names a node this
        tree does not have, or a change SGLang could not have made to it: from there it no
        longer equals SGLang's. The whole tree's records (``BEGIN`` to ``WHOLE``) are kept apart
        and make the tree at once at its ``WHOLE``. The history tells them at one instant
        (``CacheHistory.instant``: they came together, whenever SGLang made them)."""
        with self.history.instant:
            start = 0
            if self._apart is None:
                for i, record in enumerate(records):
                    if record[0] == BEGIN:
                        self._apply(records[start:i])
                        start = i
                        break
                else:
                    self._apply(records)
                    return
            self._collect(records[start:] if start else records)

    def _collect(self, records: list[Any]) -> None:
        for i, record in enumerate(records):
            kind = record[0]
            apart = self._apart
            if kind == BEGIN:
                self._apart, self._after = {}, []
                self._parts.clear()
                self.receiving = True
            elif apart is None:  # (its WHOLE came: the rest are changes again)
                self.apply(records[i:])
                return
            elif kind == NODE:
                node_id = record[1]
                apart[node_id] = (*record[:3], self._tokens(node_id, record[3]), *record[4:])
            elif kind == DROP:
                apart.pop(record[1], None)
            elif kind in (PART, OP):  # (an op is the history's, not the tree's: told as it comes)
                self._shared(kind, record)
            elif kind == WHOLE:
                self._apart = None
                self._apply(self._whole(apart))
            else:
                self._after.append(record)

    def _whole(self, apart: dict[int, tuple]) -> list[tuple]:
        """The records that make the tree sent whole: its root's reset, each node parents first,
        the sessions' marks, the rest as sent, its ``WHOLE``."""
        after, self._after = self._after, []
        if not after or after[0][0] != RESET:
            raise MirrorError("a whole tree came without its root")
        root_id = after[0][1]
        children: defaultdict[int, list[tuple]] = defaultdict(list)
        for record in apart.values():
            children[record[2]].append(record)
        out: list[tuple] = [after[0]]
        marks: list[tuple] = []
        stack = list(children.pop(root_id, ()))
        mark = self.marks
        while stack:
            record = stack.pop()
            node_id = record[1]
            out.append((ADD, *record[1:-1]))
            marks.extend((mark, sid, node_id) for sid in record[-1])
            stack.extend(children.pop(node_id, ()))
        if len(out) - 1 != len(apart):
            raise MirrorError(f"a whole tree came with {len(apart) - len(out) + 1} nodes not under its root")
        out.extend(marks)
        out.extend(after[1:])
        out.extend(self._seen_before(apart, {sid for record in after if record[0] == SEEN for sid in record[1]}))
        out.append((WHOLE, len(apart)))
        return out

    def _seen_before(self, apart: dict[int, tuple], seen: set[str]) -> list[tuple]:
        """The sessions' activity before the walk, where the tree tells it (``SEEN`` records for
        those not active during it); none here."""
        return []

    def _tokens(self, node_id: int, tokens: bytes | array) -> array:
        """An ``ADD``'s tokens, after the ``PART``s of its first ones (a whole tree's node: joined
        as it came)."""
        if isinstance(tokens, array):
            return tokens
        ids = array("q")
        first = self._parts.pop(node_id, None)
        ids.frombytes(b"".join([*first, tokens]) if first else tokens)
        return ids

    def _shared(self, kind: int, record: Any) -> bool:
        """Apply a record both copies apply alike (True), or say it is the tree's own (False)."""
        if kind == OPENED:
            self.controller.open(_Req(record[1]))
        elif kind == ENDED:
            self.controller._close(record[1])
        elif kind == PART:
            self._parts.setdefault(record[1], []).append(record[2])
        elif kind == CAUSE:
            self.history.told(record[1], record[2])  # (an action the probe ran, or "": the tree's own)
        elif kind == OP:  # (the engine's requests, closes and actions: radixtop's own, or SGLang's requests and closes)
            try:
                ids = ids_of(record[4])
            except ValueError:  # (told without them: the op is the history's all the same)
                ids = None
            self.history.did(record[1], record[2], record[3], ids, record[5], record[6], record[7])
        elif kind == WHOLE:
            self.receiving = False
            self.wholes += 1
            self.history.gap()  # (its nodes were stored before: the tree then is known from here)
        elif kind == SEEN:
            for sid, t in zip(record[1], record[2], strict=True):
                self.session_seen(sid, t)
        elif kind == TOMBS:
            for sid in record[1]:
                self._tombstone(sid)
        elif kind == OPENS:
            for sid in record[1]:
                self.controller.open(_Req(sid))
        else:
            return False
        return True

    def _gone(self, node: Any, parent: Any, holders: Any = None) -> None:
        """``node`` (a child of ``parent``) left SGLang's tree: told to the history."""
        key = node.key
        namespace = key.extra_key if key.cache_salt is None else (key.extra_key, key.cache_salt)
        self.history.removed(node.id, ROOT if parent is self.root_node else parent.id, key.token_ids.tobytes(),
                             holders, namespace)

    def _evicting(self) -> Any:
        """Removals not told otherwise (by a close, or a ``CAUSE``): SGLang's own evictions for room,
        with the pool's locked tokens then."""
        if self.history.telling:
            return contextlib.nullcontext()
        size = self.token_to_kv_pool_allocator.size  # (0 until the pool is known)
        return self.history.cause(EVICTED, pool=(self.protected_size(), size) if size else None)

    def _flushed(self) -> None:
        """SGLang's flush drops the whole tree at once (``reset``): each node is told gone, the
        deepest first, as evictions go (the history drops its oldest first past its bounds: the
        leaves, not the prefixes that lead to them)."""
        walked: list[tuple[Any, Any]] = []
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                walked.append((child, node))
                stack.append(child)
        with self.history.cause(FLUSHED):
            for child, parent in reversed(walked):
                self._gone(child, parent, getattr(child, "session_ids", None))

    def _tombstone(self, session_id: str) -> None:
        """A whole tree's closed session: its tombstone, newest last (no close now: no activity)."""
        raise NotImplementedError

    def session_seen(self, session_id: str, t: float) -> None:
        """A session was last active at ``t`` (``time.monotonic()``) during a whole tree's walk:
        nothing here; radixtop's ledger hooks it (``adapters.sglang.index``)."""

    def _begin(self, whole: bool) -> None:
        """A ``RESET``: a snapshot's (``whole``: the controller's open sessions come in it) or a flush's."""
        self._parts.clear()
        self.receiving = whole
        if whole:
            for sid in list(self.controller.sessions):
                self.controller._close(sid)


class MirrorCache(RecordsCopy):
    """A ``RadixCache``-shaped copy of one SGLang tree, changed only by ``apply`` (one thread)."""

    enable_session_radix_cache = True

    def __init__(self, page_size: int = 1, sessions: bool = True, close_policy: str = "free") -> None:
        """``close_policy``: what a close does in the tree copied (``trees.SessionRadixTree``
        reads it): "free", as SGLang 0.5.16's (its exclusive nodes freed), or "deref", as
        radixtop's own engine under ``--close-policy deref`` (its references dropped only): the
        records tell the tree either way; the policy is what a close's plan and the figures say."""
        if close_policy not in ("free", "deref"):
            raise ValueError(f"unknown close policy {close_policy!r}; known: free, deref")
        super().__init__(page_size, sessions)
        self.mirrored_close_policy = close_policy
        self.evictable_size_ = self.protected_size_ = 0
        self.by_id: dict[int, MirrorNode] = {}
        self._fresh: set[MirrorNode] = set()
        """Nodes made since the last ``TOUCH`` (a match's or an insert's walk made them: they keep
        their own stamps, as SGLang's keep their construction time)."""
        self.reset(-1)

    # ----- SGLang's methods, as the records tell them -----

    def _reset_session_radix_state(self) -> None:
        self._session_leaves: defaultdict[str, set[MirrorNode]] = defaultdict(set)
        self._closed_session_ids: OrderedDict[str, None] = OrderedDict()

    def reset(self, root_id: int = -1) -> None:
        root = MirrorNode(root_id, MirrorKey(array("q")), 0.0, 0.0, lock_ref=1)
        self.root_node = root
        self.by_id = {root_id: root}
        self._reset_session_radix_state()

    def _split_node(self, key: MirrorKey, child: MirrorNode, split_len: int, new_id: int = -1,
                    last_access: float = 0.0) -> MirrorNode:
        page = self.page_size
        new = MirrorNode(new_id, child.key[:split_len], last_access, last_access, child.hit_count, child.lock_ref)
        new.parent = child.parent
        new.children = {key[split_len:].child_key(page): child}
        child.parent = new
        child.key = child.key[split_len:]
        new.parent.children[key.child_key(page)] = new  # type: ignore[union-attr]
        self.by_id[new_id] = new
        self.history.split(new_id, child.id, split_len)
        return new

    def _insert_helper(self, parent: MirrorNode, node: MirrorNode) -> tuple[int, MirrorNode]:
        node.parent = parent
        parent.children[node.key.child_key(self.page_size)] = node
        self.by_id[node.id] = node
        self.history.stored(node.id, ROOT if parent is self.root_node else parent.id, len(node.key))
        return 0, node

    def _delete_leaf(self, node: MirrorNode) -> None:
        parent = node.parent
        if parent is None or parent.children.pop(node.key.child_key(self.page_size), None) is not node:
            raise MirrorError(f"node {node.id} is not a child of its parent here")
        held = node.session_ids
        if held:
            closed = self._closed_session_ids
            for sid in tuple(held):
                leaves = self._session_leaves.get(sid)
                if leaves is not None:
                    leaves.discard(node)
                    if not leaves and sid not in closed:
                        self._session_leaves.pop(sid, None)
        node.session_ids = None
        del self.by_id[node.id]
        self._gone(node, parent, held)

    def evict(self, nodes: Iterable[MirrorNode]) -> None:
        with self._evicting():
            for node in nodes:
                self._delete_leaf(node)

    def _seen_before(self, apart: dict[int, tuple], seen: set[str]) -> list[tuple]:
        """SGLang 0.5.16 stamps a node with ``time.monotonic()``: a session not active during the
        walk was last active when its newest tagged node was last accessed (as radixtop attached
        in SGLang's process reads it: ``adapters.sglang.index``)."""
        newest: dict[str, float] = {}
        for record in apart.values():
            for sid in record[-1]:
                if sid not in seen:
                    newest[sid] = max(newest.get(sid, record[5]), record[5])
        return [(SEEN, list(newest), list(newest.values()))] if newest else []

    def _tombstone(self, session_id: str) -> None:
        closed = self._closed_session_ids
        closed[session_id] = None
        closed.move_to_end(session_id)
        while len(closed) > TOMBSTONES:
            closed.popitem(last=False)

    def release_radix_session(self, session_id: str, nodes: Iterable[MirrorNode] = ()) -> None:
        self._tombstone(session_id)
        indexed = self._session_leaves.pop(session_id, set())
        with self.history.cause(CLOSED, session_id=session_id):
            for node in nodes:  # SGLang dropped the session from each, then deleted it
                self._drop_holder(node, session_id)
                self._delete_leaf(node)
        for node in indexed:  # and dropped it from each node it kept
            self._drop_holder(node, session_id)

    @staticmethod
    def _drop_holder(node: MirrorNode, session_id: str) -> None:
        held = node.session_ids
        if held is not None:
            held.discard(session_id)
            if not held:
                node.session_ids = None

    def register_session(self, session_id: str) -> None:
        """The bundled cache's (``REOPENED``): a closed id opened again, its tombstone gone."""
        self._closed_session_ids.pop(session_id, None)

    def _tag_session_leaf(self, req: Any, radix_key: Any = None, node: MirrorNode | None = None) -> None:
        sid = req.session_id
        if not self.enable_session_radix_cache or node is None or node is self.root_node \
                or sid in self._closed_session_ids:
            return  # (as SGLang's: no sessions, nothing tagged)
        if node.session_ids is None:
            node.session_ids = set()
        node.session_ids.add(sid)
        self._session_leaves[sid].add(node)

    def inc_lock_ref(self, node: MirrorNode) -> None:
        root = self.root_node
        while node is not root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: MirrorNode) -> None:
        root = self.root_node
        while node is not root:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    # ----- the records -----

    def _node(self, node_id: int) -> MirrorNode:
        node = self.by_id.get(node_id)
        if node is None:
            raise MirrorError(f"no node {node_id} here")
        return node

    def _apply(self, records: Iterable[Any]) -> None:
        node_of = self._node
        for record in records:
            kind = record[0]
            self.applied += 1
            if kind == TOUCH:
                _, node_id, start_id, t, hits, skip_last = record
                node, start = node_of(node_id), node_of(start_id)
                if skip_last and node is not start:
                    node = node.parent
                fresh = self._fresh
                while node is not start and node is not None:
                    if node not in fresh:  # (a node this walk made keeps its own stamp, as SGLang's)
                        node.last_access_time = t
                    if hits:
                        node.hit_count += 1
                    node = node.parent
                start.last_access_time = t
                fresh.clear()
            elif kind == LOCK:
                self.inc_lock_ref(node_of(record[1]))
            elif kind == UNLOCK:
                self.dec_lock_ref(node_of(record[1]))
            elif kind == ADD:
                _, node_id, parent_id, tokens, extra, last_access, created, hits, lock_ref = record
                node = MirrorNode(node_id, MirrorKey(self._tokens(node_id, tokens), extra), last_access, created, hits, 0)
                self._insert_helper(node_of(parent_id), node)
                self._fresh.add(node)
                if lock_ref:  # (a snapshot's node, locked now: its own count)
                    node.lock_ref = lock_ref
                    self.protected_size_ += len(node.key)
                else:
                    self.evictable_size_ += len(node.key)
            elif kind == SPLIT:
                _, new_id, child_id, split_len, last_access, child_access = record
                child = node_of(child_id)
                self._fresh.add(self._split_node(child.key, child, split_len, new_id=new_id, last_access=last_access))
                child.last_access_time = child_access
            elif kind == DELETE:
                node = node_of(record[1])
                self._delete_leaf(node)
                self._uncount(node)
            elif kind == EVICT:
                nodes = [node_of(i) for i in record[1]]
                self.evict(nodes)
                for node in nodes:
                    self._uncount(node)
            elif kind == CLOSE:
                _, sid, ids = record
                nodes = [node_of(i) for i in ids]
                self.release_radix_session(sid, nodes)
                for node in nodes:
                    self._uncount(node)
            elif kind == TAG:
                _, sid, node_id = record
                self._tag_session_leaf(_Req(sid), None, node_of(node_id))
            elif kind == REOPENED:
                self.register_session(record[1])
            elif kind == RESET:
                if record[2]:  # (a whole tree: what left while it was on its way is not known)
                    self.history.gap()
                else:
                    self._flushed()
                self.evictable_size_ = self.protected_size_ = 0
                self._fresh.clear()
                self._begin(bool(record[2]))
                self.reset(record[1])
            elif self._shared(kind, record):
                if kind == WHOLE:
                    self._fresh.clear()
            else:
                raise MirrorError(f"a record of unknown kind {kind!r}")

    def _uncount(self, node: MirrorNode) -> None:
        if node.lock_ref:
            self.protected_size_ -= len(node.key)
        else:
            self.evictable_size_ -= len(node.key)


class MirrorController:
    """SGLang's ``SessionController`` as the roster reads it (``adapters.sglang.roster``): the
    open sessions, and the methods it hooks (``open``, ``_close``), called as the records say."""

    def __init__(self) -> None:
        self.sessions: dict[str, None] = {}

    def open(self, req: Any) -> None:
        self.sessions[req.session_id] = None

    def _close(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


class _Req:
    __slots__ = ("session_id",)

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


# ----- radixtop's process beside the scheduler: the loop that applies the records, the adapter -----


RESYNC_AGAIN_S = 60.0
"""A copy still incomplete this long after it asked for the whole tree asks again."""


READ_GAP_MS = 2
"""While a read is under way, the mirror's loop waits at most this long for a frame between two of
its slices (3 ms each): the read takes at most about 60% of a core, and leaves the cores to the
server's own threads between slices."""


class MirrorLoop:
    """The mirror's owner thread in radixtop's process: it applies each ``RECORDS`` frame as it
    comes, hands every other frame (a reply) to ``on_other`` in its order among them, and runs the
    adapter's reads between frames (an ``OwnerQueue``, woken by a pipe when one is queued). A lost
    frame or a record that does not apply leaves the mirror unlike SGLang's tree: it says so
    (``incomplete``) and ``on_diverged`` asks the probe for the whole tree again."""

    def __init__(self, mirror: MirrorCache, end: Any, on_other: Any = None, on_gone: Any = None,
                 on_diverged: Any = None) -> None:
        import os
        import threading

        import msgspec

        from radixtop.gpu_backend.owner.queue import OwnerQueue

        self.mirror = mirror
        self.end = end
        self.on_other = on_other
        self.on_gone = on_gone
        self.on_diverged = on_diverged
        self.incomplete: str | None = None
        """Why the mirror is not SGLang's tree now (None: it is, as of the last record)."""
        self.diverged = 0
        self.gone = False
        self._asked_at = 0.0
        self._wholes_asked = 0
        self._decode = msgspec.msgpack.Decoder().decode
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.queue = OwnerQueue("radixtop's mirror of the scheduler's tree", wake=self._wake)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="radixtop-mirror", daemon=True)
        """The mirror's owner thread (a read from it must not wait for a sync: it applies the reply)."""

    def start(self) -> None:
        """Apply the frames from now on (once what reads the mirror has installed its hooks on it)."""
        self.thread.start()

    def _wake(self) -> None:
        import os

        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # (full: it is woken already)

    def _run(self) -> None:
        import os
        import select

        from radixtop.adapters.sglang.probe import RECORDS
        from radixtop.gpu_backend.owner.handover import ProbeGone

        poll = select.poll()
        poll.register(self.end.sock.fileno(), select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        end, queue = self.end, self.queue
        while not self._stop.is_set():
            # a read under way waits READ_GAP_MS at most for a frame before its next slice (it
            # waited up to 200 ms after each slice of 3 ms: a busy server's sessions page took
            # 1-10 s beside it, and a batch of them timed out; with no wait at all, the scheduler's
            # p99 hold at 1M nodes went 0.31 -> 0.48 ms; with 2 ms, 0.32: docs/benchmarks.md)
            busy = bool(queue.slices.pending or queue.pending())
            poll.poll(READ_GAP_MS if busy else 200)
            try:
                os.read(self._wake_r, 4096)
            except (BlockingIOError, OSError):
                pass
            took = False  # (a frame of the whole tree: one MORE for what was taken at once)
            for _ in range(64):  # frames first, then a turn of the reads
                try:
                    frame = end.receive(0)
                except ProbeGone:
                    self.gone = True
                    queue.close("the scheduler's end closed (SGLang exited)")
                    if self.on_gone is not None:
                        self.on_gone()
                    return
                if frame is None:
                    break
                if frame.lost:
                    self._diverge(f"{frame.lost} frames of records lost (radixtop's process fell behind)")
                if frame.kind == RECORDS:
                    try:
                        self.mirror.apply(self._decode(frame.payload))
                    except Exception as exc:  # (MirrorError, or a frame that is not records)
                        self._diverge(f"a record did not apply ({type(exc).__name__}: {exc})")
                    else:
                        if self.incomplete is not None and self.mirror.wholes > self._wholes_asked:
                            self.incomplete = None  # (the whole tree sent after the ask came)
                        took = took or self.mirror.receiving
                elif self.on_other is not None:
                    self.on_other(frame)
            if took:
                self._more()
            if self.incomplete is not None and time.monotonic() - self._asked_at > RESYNC_AGAIN_S:
                self._ask()  # (the ask, or its answer, was lost: again)
            queue.between_steps(idle=True, budget=0.05)

    def _more(self) -> None:
        """A frame of the whole tree taken: tell the probe (``MORE``: it wakes a scheduler that
        sleeps on idle, so the walk goes on). Never waits: a full socket has a wake in it already."""
        from radixtop.adapters.sglang.probe import MORE

        try:
            self.end.send(MORE, b"", timeout=0)
        except Exception:  # (TimeoutError: full; ProbeGone: the receive sees it next)
            pass

    def _diverge(self, why: str) -> None:
        if self.incomplete is None:
            self.diverged += 1
            self.incomplete = why
            self._ask()

    def _ask(self) -> None:
        """Ask the probe for the whole tree; ``incomplete`` stays until a snapshot sent after
        this ask came whole."""
        self._asked_at = time.monotonic()
        self._wholes_asked = self.mirror.wholes + (1 if self.mirror.receiving else 0)
        if self.on_diverged is not None:
            self.on_diverged()

    def close(self) -> None:
        import os

        self._stop.set()
        self._wake()
        if self.thread.is_alive():
            self.thread.join(5)
        self.queue.close("radixtop's process is stopping")
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
