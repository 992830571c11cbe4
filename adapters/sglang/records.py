"""Change records: what the probe in SGLang's scheduler captures of a Python-core tree as it
changes (issue 27's split, the Python cores), for the mirror in radixtop's process beside it
(``adapters.sglang.mirror``) to make the same changes to a tree of its own.

On SGLang 0.5.15/0.5.16's ``RadixCache`` (sessions on or off) the recorder wraps, on the cache
instance, the methods that change the tree, as the index does in process (``adapters.sglang.index``):
each wrapper appends one small tuple (a node's id and a few numbers; a new node's tokens as the
bytes of SGLang's own ``array('q')``, one copy) to a list, and nothing else. No node registry, no
sizes, no sessions' figures: those are kept beside. ``take()`` hands the list over once a
scheduler loop; the probe encodes it (``msgspec`` msgpack) and sends it without waiting.

The records (each a tuple, its first item the kind):

* ``(ADD, id, parent_id, tokens, extra_key, last_access, created, hits, lock_ref)``: a new node
  under ``parent_id`` (``tokens``: the key's ``array('q')`` bytes);
* ``(SPLIT, new_id, child_id, split_len, new_last_access, child_last_access)``: SGLang's
  ``_split_node``: a new node above ``child`` with its first ``split_len`` tokens (its lock count
  and hits copied, as SGLang's); the child's stamp (a match or an insert stamped it just before);
* ``(DELETE, id)``: ``_delete_leaf`` (outside an eviction or a close);
* ``(EVICT, ids)``: an eviction, the leaves it deleted in their order;
* ``(CLOSE, sid, ids)``: ``release_radix_session``: the nodes it deleted, in their order;
* ``(TAG, sid, id)``: a session's request ended at node ``id`` (SGLang tags it, unless closed);
* ``(LOCK, id)``, ``(UNLOCK, id)``: ``inc_lock_ref``/``dec_lock_ref`` of the path from ``id`` up;
* ``(TOUCH, id, start_id, t, hits, skip_last)``: a match or an insert went from ``start_id``
  down to ``id``: each node on the way stamped ``t``; with ``hits``, each below ``start_id`` hit
  once more (``skip_last``: ``id`` is a node just added, its own stamp and hit in its ``ADD``);
* ``(RESET, root_id, whole)``: a new, empty tree (``whole``: the start of a snapshot, the
  controller's sessions in it too);
* ``(OPENED, sid)``, ``(ENDED, sid)``: the scheduler's ``SessionController`` opened a session
  (SGLang's /open_session), or ended one (/close_session, its timeout);
* ``(WHOLE, nodes)``: the end of a snapshot (its ``nodes``: the tree is whole again);
* ``(PART, id, tokens)``: the first tokens of the next ``ADD`` of ``id``, which comes with the rest
  (a prompt longer than a frame holds: ``split_long``).

``snapshot()`` gives the records that build the tree as it is now (at the first start, or a
restart of radixtop's process after a crash): one walk of the tree on the scheduler thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("radixtop.sglang")

ADD, SPLIT, DELETE, EVICT, CLOSE, TAG, LOCK, UNLOCK, TOUCH, RESET, PART, OPENED, ENDED, WHOLE = range(14)
RECORDER = "_radixtop_recorder"


def tokens_of(key: Any) -> bytes:
    """A key's token ids as the bytes of an ``array('q')`` (SGLang 0.5.16 keeps them so: one copy)."""
    from array import array

    ids = key.raw_token_ids() if hasattr(key, "raw_token_ids") else key.token_ids
    if not isinstance(ids, array) or ids.typecode != "q":
        ids = array("q", ids)
    return ids.tobytes()


def can_record(cache: Any) -> str | None:
    """Why the recorder cannot follow ``cache`` (None: it can): SGLang's own ``RadixCache`` (or a
    subclass that keeps its tree) with SGLang's ``TreeNode``s only. Not a cache SGLang wraps
    (0.5.16's ``StreamingSession`` forwards to an inner cache whose own calls would go
    unrecorded), not another tree (SWA, Mamba: other fields), not HiCache's host tier, not bigram
    keys, not the unified tree (not yet)."""
    if hasattr(cache, "tree_core"):
        return "a UnifiedRadixCache (its Python core's records are not built yet)"
    try:
        from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode
    except ImportError as exc:  # (an SGLang without that module: nothing here to follow)
        return f"SGLang's RadixCache cannot be imported ({exc})"
    if not isinstance(cache, RadixCache) or not isinstance(getattr(cache, "root_node", None), TreeNode):
        return f"{type(cache).__name__} is not SGLang's RadixCache"
    if hasattr(cache, "cache_controller") or "HiRadix" in type(cache).__name__:
        return "HiCache's host tier is not recorded yet"
    if getattr(cache, "is_eagle", False):
        return "bigram keys (EAGLE) are not recorded yet"
    return None


class ChangeRecorder:
    """Records every change of one SGLang ``RadixCache`` (scheduler thread only)."""

    def __init__(self, cache: Any, controller: Any = None) -> None:
        """``controller``: the scheduler's ``SessionController``, whose sessions' opening and
        ending are recorded too (a session opened through SGLang holds no node at first)."""
        why = can_record(cache)
        if why is not None:
            raise TypeError(why)
        self.cache = cache
        self.records: list[tuple] = []
        self._diverted: list[int] | None = None
        """Inside an eviction or a close: the ids its ``_delete_leaf`` calls deleted."""
        self._next_id = type(cache.root_node).counter
        """Every node with an id below this one existed when last looked (a node
        ``_insert_helper`` returns with a higher one is the leaf it added)."""
        self.controller = controller
        self.failed: str | None = None
        """Why a hook could not record (None: every change so far is recorded)."""
        self._hook()
        if controller is not None:
            self._hook_controller(controller)
        setattr(cache, RECORDER, self)

    def stop(self) -> None:
        """Record nothing from now on (radixtop's process is gone for good): the hooks stay, each
        appending to a list that keeps nothing."""
        self.records = _Nothing()

    def take(self) -> list[tuple]:
        records = self.records
        if isinstance(records, _Nothing):
            return []
        self.records = []
        return records

    def snapshot(self) -> list[tuple]:
        """Records that build the tree as it is now: a reset, each node parents first, the
        sessions' tags, the closed sessions' tombstones, the controller's open sessions. One walk
        (scheduler thread); a node's tokens are SGLang's own array, not copied (SGLang replaces a
        key's array when it splits a node, never changes one): ``wire_record`` makes the bytes
        when the record is sent."""
        cache = self.cache
        root = cache.root_node
        out: list[tuple] = [(RESET, root.id, True)]
        tags: list[tuple] = []
        stack = list(root.children.values())
        append, extend, pop = out.append, stack.extend, stack.pop
        while stack:
            node = pop()
            key = node.key
            append((ADD, node.id, node.parent.id,
                    key.token_ids if getattr(key, "limit", None) is None else key.raw_token_ids(),
                    key.extra_key, node.last_access_time, getattr(node, "creation_time", node.last_access_time),
                    node.hit_count, node.lock_ref))
            held = getattr(node, "session_ids", None)
            if held:
                tags.extend((TAG, sid, node.id) for sid in held)
            extend(node.children.values())
        out.extend(tags)
        out.extend((CLOSE, sid, []) for sid in getattr(cache, "_closed_session_ids", None) or ())
        if self.controller is not None:
            out.extend((OPENED, sid) for sid in list(getattr(self.controller, "sessions", None) or ()))
        out.append((WHOLE, len(out)))
        self._next_id = max(self._next_id, type(root).counter)
        return out

    # ----- the hooks -----

    def _failed(self, where: str, exc: Exception) -> None:
        """A hook that could not record: SGLang's own call goes on (its result returned as it
        was); from now on nothing is recorded, and the probe reports radixtop's process down
        (``failed``): a copy that missed a change would be wrong, silently."""
        if self.failed is None:
            self.failed = f"recording {where} failed: {type(exc).__name__}: {exc}"
            log.error("radixtop: %s; radixtop's copy of the tree stops here, SGLang goes on", self.failed)
        self.stop()

    def _wrap(self, owner: Any, name: str, after: Callable[..., None]) -> None:
        """``owner.name`` wrapped on the instance: ``after(result, *args)`` once it returned,
        whatever ``after`` raises kept out of SGLang's call (``_failed``)."""
        original = getattr(owner, name, None)
        if not callable(original):
            return

        @functools.wraps(original)
        def recorded(*a: Any, **k: Any) -> Any:
            result = original(*a, **k)
            try:
                after(result, *a, **k)
            except Exception as exc:
                self._failed(name, exc)
            return result

        setattr(owner, name, recorded)

    def _hook_controller(self, controller: Any) -> None:
        sessions = lambda: getattr(controller, "sessions", None) or {}  # noqa: E731

        def opened(result: Any, req: Any, *a: Any, **k: Any) -> None:
            sid = getattr(req, "session_id", None)
            if sid is not None and sid in sessions():
                self.records.append((OPENED, sid))

        def ended(result: Any, sid: Any, *a: Any, **k: Any) -> None:
            if sid not in sessions():
                self.records.append((ENDED, sid))

        self._wrap(controller, "open", opened)
        self._wrap(controller, "_close", ended)

    def _hook(self) -> None:
        cache, wrap = self.cache, self._wrap

        def split(new: Any, key: Any, child: Any, split_len: int, *a: Any, **k: Any) -> None:
            self.records.append((SPLIT, new.id, child.id, int(split_len), new.last_access_time,
                                 child.last_access_time))
            self._next_id = max(self._next_id, new.id + 1)

        def insert(result: Any, node: Any, *a: Any, **k: Any) -> None:
            last = result[1]
            added = last is not node and last.id >= self._next_id
            if added:
                self._next_id = last.id + 1
                self.records.append((ADD, last.id, last.parent.id, tokens_of(last.key), last.key.extra_key,
                                     last.last_access_time, getattr(last, "creation_time", last.last_access_time),
                                     int(last.hit_count), 0))
            chunked = k.get("chunked", a[3] if len(a) > 3 else False)
            self.records.append((TOUCH, last.id, node.id, node.last_access_time, not chunked, added))

        def match(result: Any, node: Any, *a: Any, **k: Any) -> None:
            self.records.append((TOUCH, result[1].id, node.id, node.last_access_time, False, False))

        def delete(result: Any, node: Any, *a: Any, **k: Any) -> None:
            if self._diverted is not None:
                self._diverted.append(node.id)
            else:
                self.records.append((DELETE, node.id))

        def reset(result: Any, *a: Any, **k: Any) -> None:
            self.records.append((RESET, cache.root_node.id, False))
            self._next_id = max(self._next_id, type(cache.root_node).counter)

        def lock(kind: int) -> Callable[..., None]:
            return lambda result, node, *a, **k: self.records.append((kind, node.id))

        def tag(result: Any, req: Any, *a: Any, **k: Any) -> None:
            sid = getattr(req, "session_id", None)
            if sid is None:
                return
            node = k.get("node", a[1] if len(a) > 1 else None)
            if node is not None:  # (tagged or not: a closed session's request is its activity too)
                self.records.append((TAG, sid, node.id))
            else:  # SGLang matched the node itself (it warns): each node the session holds, again
                leaves = (getattr(cache, "_session_leaves", None) or {}).get(sid) or (cache.root_node,)
                self.records.extend((TAG, sid, leaf.id) for leaf in leaves)

        wrap(cache, "_split_node", split)
        wrap(cache, "_insert_helper", insert)
        wrap(cache, "_match_prefix_helper", match)
        wrap(cache, "_delete_leaf", delete)
        for name, kind in (("evict", EVICT), ("release_radix_session", CLOSE)):
            self._divert(name, kind)
        wrap(cache, "reset", reset)
        wrap(cache, "inc_lock_ref", lock(LOCK))
        wrap(cache, "dec_lock_ref", lock(UNLOCK))
        wrap(cache, "_tag_session_leaf", tag)

    def _divert(self, name: str, kind: int) -> None:
        """An eviction's or a close's deletions recorded as one record after it (``EVICT``,
        ``CLOSE``), in their order."""
        cache = self.cache
        original = getattr(cache, name, None)
        if not callable(original):
            return

        @functools.wraps(original)
        def recorded(*a: Any, **k: Any) -> Any:
            outer, self._diverted = self._diverted, []
            try:
                return original(*a, **k)
            finally:
                ids, self._diverted = self._diverted, outer
                try:
                    if outer is not None:  # (nested: the outer one records them)
                        outer.extend(ids)
                    elif kind == CLOSE:
                        self.records.append((CLOSE, a[0] if a else k.get("session_id"), ids))
                    else:
                        self.records.append((EVICT, ids))
                except Exception as exc:
                    self._failed(name, exc)

        setattr(cache, name, recorded)

def wire_record(record: tuple) -> tuple:
    """A snapshot's record as it is sent (an ``ADD``'s tokens as bytes)."""
    if record[0] == ADD and not isinstance(record[3], bytes):
        return (*record[:3], tokens_of(SimpleKey(record[3])), *record[4:])
    return record


class SimpleKey:
    __slots__ = ("token_ids",)

    def __init__(self, token_ids: Any) -> None:
        self.token_ids = token_ids


def split_long(record: tuple, most: int) -> list[tuple]:
    """A record over ``most`` bytes as several, each under it, applied in order to the same end:
    an ``ADD``'s tokens as ``PART`` records and the ``ADD`` with the last part; an eviction's or a
    close's deleted ids over several ``EVICT`` or ``CLOSE`` records (a close's first drops the
    session from every node it held, the rest delete); any other record as it is."""
    kind = record[0]
    if kind in (EVICT, CLOSE):
        ids = record[-1]
        step = max(1, most // 10)  # (msgpack: at most 9 bytes an id)
        if len(ids) <= step:
            return [record]
        return [(*record[:-1], ids[i : i + step]) for i in range(0, len(ids), step)]
    tokens = record[3] if kind == ADD else b""
    if len(tokens) <= most:
        return [record]
    step = max(8, most // 8 * 8)
    cut = (len(tokens) - 1) // step * step
    return [(PART, record[1], tokens[i : i + step]) for i in range(0, cut, step)] + \
        [(*record[:3], tokens[cut:], *record[4:])]


class _Nothing(list):
    """A list that keeps nothing (a stopped recorder's)."""

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass
