"""The bundled cache's change records (issue 27, item 3): what a probe on radixtop's own engine
thread captures of its tree as it changes, in the records SGLang 0.5.16's ``RadixCache`` is recorded
in (``adapters.owned.records``), so that one mirror (``adapters.sglang.mirror.MirrorCache``) and one
adapter over it serve both: the reads of ``radixtop serve`` run beside the engine, as they do beside
SGLang's scheduler, and what the bundled cache shows beside equals what SGLang's would.

The bundled cache re-implements SGLang's (``gpu_backend.radix_cache``): its methods are SGLang's
with radixtop's signatures (``_split_node(child, split_len)``, ``insert(key, value, priority)``,
``match_prefix(key)``, ``_tag_session_leaf(session_id, node)``), so the hooks differ where the
signatures do; the records and what the mirror makes of them do not. A node's priority, its KV
slots and the eviction heap are not recorded (no read beside needs them). ``register_session``,
which SGLang 0.5.16 has no path for (a closed id opened again: its tombstone goes), is ``REOPENED``.
"""

from __future__ import annotations

from array import array
from typing import Any

from radixtop.adapters.owned.records import (
    ADD,
    CLOSE,
    ENDED,
    EVICT,
    LOCK,
    NODE,
    OP,
    OPENED,
    OPENS,
    RECORDER,
    REOPENED,
    RESET,
    TAG,
    TOMBS,
    TOUCH,
    UNLOCK,
    _Recorder,
    pieces,
)


def tokens_of(key: tuple[int, ...]) -> bytes:
    """A key's token ids as the bytes of an ``array('q')``, as SGLang's are sent."""
    return array("q", key).tobytes()


class BundledRecorder(_Recorder):
    """Records every change of one bundled ``RadixCache`` (its owner thread only)."""

    def __init__(self, cache: Any, scheduler: Any = None) -> None:
        """``scheduler``: the engine's, whose sessions known and open (a request began or ended, an
        id registered; not closed, not pruned) are told as SGLang's session controller's are
        (``OPENED``, ``ENDED``): a session running its first request holds no node yet, and is
        listed open all the same."""
        if not hasattr(cache, "nodes") or not hasattr(cache, "_tag_session_leaf"):
            raise TypeError(f"{type(cache).__name__} is not the bundled cache")
        super().__init__()
        self.cache = cache
        self.controller = None
        self.scheduler = scheduler
        self._oldest: str | None = None
        self.open: dict[str, None] = {}
        """The scheduler's open sessions as told (the mirror's ``SessionController``), oldest first."""
        self._next_id = cache._next_id
        self._hook()
        setattr(cache, RECORDER, self)

    def root(self) -> Any:
        self._next_id = max(self._next_id, self.cache._next_id)
        return self.cache.root_node

    def state(self, node: Any) -> tuple:
        return (NODE, node.id, node.parent.id, tokens_of(node.key), None, node.last_access_time,
                node.creation_time, node.hit_count, node.lock_ref, tuple(node.session_ids or ()))

    def ends(self) -> list[tuple]:
        cache = self.cache
        return [(RESET, cache.root_node.id, True), *pieces(TOMBS, list(cache._closed_session_ids)),
                *pieces(OPENS, list(self.open))]

    # ----- the hooks -----

    def _hook(self) -> None:
        cache, wrap = self.cache, self._wrap

        def split(head: Any, child: Any, split_len: int, *a: Any, **k: Any) -> None:
            self._split(head, child, split_len)

        def insert(result: Any, key: Any, *a: Any, **k: Any) -> None:
            last, root = result.last_node, cache.root_node
            if last is root:  # (an empty key: nothing walked; the root stamped, as the mirror's TOUCH does)
                self.records.append((TOUCH, root.id, root.id, root.last_access_time, False, False))
                return
            added = last.id >= self._next_id
            if added:
                self._next_id = last.id + 1
                self.records.append((ADD, last.id, last.parent.id, tokens_of(last.key), None,
                                     last.last_access_time, last.creation_time, int(last.hit_count), 0))
            self.records.append((TOUCH, last.id, root.id, root.last_access_time, True, added))
            if self.watch is not None:
                self.watch.append(last)

        def match(result: Any, key: Any, *a: Any, **k: Any) -> None:
            last, root = result.last_node, cache.root_node
            self.records.append((TOUCH, last.id, root.id, root.last_access_time, False, False))
            if self.watch is not None:
                self.watch.append(last)

        def reset(result: Any, *a: Any, **k: Any) -> None:
            self.records.append((RESET, cache.root_node.id, False))
            self._next_id = max(self._next_id, cache._next_id)
            if self.scheduler is not None:  # (its tombstones gone: the sessions the engine knows are open again)
                for sid in self.scheduler.open_session_ids():
                    if sid not in self.open:
                        self.open[sid] = None
                        self.records.append((OPENED, sid))

        def tag(result: Any, session_id: Any, node: Any, *a: Any, **k: Any) -> None:
            if session_id is None:
                return
            if self.active is not None:
                self.active.append(session_id)
            self.records.append((TAG, session_id, node.id))  # (the mirror tags it where the cache did)
            if self.watch is not None:
                self.watch.append(node)

        def reopened(result: Any, session_id: Any, *a: Any, **k: Any) -> None:
            self.records.append((REOPENED, session_id))

        wrap(cache, "_split_node", split)
        wrap(cache, "insert", insert)
        wrap(cache, "match_prefix", match)
        wrap(cache, "_delete_leaf", self._deleted)
        for name, kind in (("evict", EVICT), ("release_radix_session", CLOSE)):
            self._divert(cache, name, kind)
        wrap(cache, "reset", reset)
        wrap(cache, "inc_lock_ref", self._locked(LOCK))
        wrap(cache, "dec_lock_ref", self._locked(UNLOCK))
        wrap(cache, "_tag_session_leaf", tag)
        wrap(cache, "register_session", reopened)
        if self.scheduler is not None:
            self._hook_scheduler(self.scheduler)

    def _hook_scheduler(self, scheduler: Any) -> None:
        cache, opened = self.cache, self.open

        def touched(result: Any, session_id: Any, *a: Any, **k: Any) -> None:
            if session_id is not None and session_id not in opened and not cache.is_session_closed(session_id):
                opened[session_id] = None
                self.records.append((OPENED, session_id))

        def pruned(result: Any, *a: Any, **k: Any) -> None:
            known = scheduler.session_activity
            for sid in [sid for sid in opened if sid not in known]:
                del opened[sid]
                self.records.append((ENDED, sid))

        self._wrap(scheduler, "_touch_session", touched)
        self._wrap(scheduler, "_prune_sessions", pruned)
        opened.update(dict.fromkeys(scheduler.open_session_ids()))
        told = scheduler.told  # (the engine's own history, where it keeps one: told too)
        scheduler.told = self.op if told is None else lambda *a, **k: (told(*a, **k), self.op(*a, **k))

    def op(self, op: str, session_id: str | None = None, request_id: str | None = None,
           tokens: list[int] | None = None, prompt_tokens: int = 0, cached_tokens: int = 0,
           asked_tokens: int = 0) -> None:
        """An op of the engine's (``Scheduler.told``), for the history beside it (``OP``: its tokens
        as the bytes of an ``array('q')``, as a node's are sent)."""
        self.records.append((OP, op, session_id, request_id, None if tokens is None else array("q", tokens).tobytes(),
                             prompt_tokens, cached_tokens, asked_tokens))

    def _closing(self, session_id: Any) -> None:
        closed = self.cache._closed_session_ids  # (the oldest tombstone, which this close may push out)
        self._oldest = next(iter(closed), None) if len(closed) >= self.cache.closed_session_limit else None

    def _closed(self, session_id: Any) -> None:
        if self.open.pop(session_id, 0) is None:  # (closed: no longer the controller's)
            self.records.append((ENDED, session_id))
        oldest, cache = self._oldest, self.cache
        if oldest is not None and oldest != session_id and not cache.is_session_closed(oldest) \
                and self.scheduler is not None and oldest in self.scheduler.session_activity:
            self.open[oldest] = None  # its tombstone pushed out: the engine counts it open again
            self.records.append((OPENED, oldest))
