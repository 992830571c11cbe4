"""Change records: what a probe on a cache's owner thread (SGLang's scheduler, radixtop's own
engine) captures of a tree as it changes (issue 27's split), for the mirror in radixtop's process
beside it (``adapters.sglang.mirror``) to make the same changes to a tree of its own.

A recorder wraps, on the cache instance, the methods that change the tree: each wrapper appends one
small tuple (a node's id and a few numbers; a new node's tokens as the bytes of an ``array('q')``,
one copy) to a list, and nothing else. No node registry, no sizes, no sessions' figures: those are
kept beside. ``take()`` hands the list over once a step of the owner's loop; the probe encodes it
(``msgspec`` msgpack) and sends it without waiting. The recorders: SGLang's Python cores'
(``adapters.sglang.records``), the bundled cache's (``adapters.bundled.recorder``); this module
holds what they share: the records' kinds, the recorder's base, the whole tree's walk.

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

On 0.5.17+'s ``UnifiedRadixCache`` on its Python tree core (0.5.23 with sessions) the
``UnifiedRecorder`` follows the tree core, its full component and its session tracker instead,
with records of its own (its docstring); ``recorder_for`` picks the one a cache needs.

The whole tree (at the first start, a restart of radixtop's process after a crash, a resync) is
walked in slices, a step's worth at a time, while SGLang goes on changing it (``Walk``):

* ``(BEGIN,)``: a whole tree starts (the copy keeps what it had until its ``WHOLE``);
* ``(NODE, id, parent_id, tokens, ..., sessions)``: a node as it is now, whole (an ``ADD``'s fields,
  the ids of the sessions that mark it last); sent again, once the walk is through, where it
  changed after it was sent;
* ``(DROP, id)``: a node sent before was deleted since;
* then the tree's root and what is not a node's, as it is at the walk's end: ``RESET`` with
  ``whole``; ``(TOMBS, sids)``, the tombstones oldest first (a closed session's, not a close now);
  ``(GENS, sids, generations)``; ``(OPENS, sids)``, the controller's open sessions (each list in
  pieces: C-speed copies, so the last step stays short); then ``(SEEN, sids, times)``: the
  sessions active during the walk (a request of it ended, it closed) in the order of their last
  activity (``times``: each one's step's ``time.monotonic()``, the clock every process here
  reads, a microsecond apart where one step's), and ``WHOLE``.
"""

from __future__ import annotations

import functools
import logging
import time
from array import array
from collections.abc import Callable
from typing import Any

log = logging.getLogger("radixtop.records")

ADD, SPLIT, DELETE, EVICT, CLOSE, TAG, LOCK, UNLOCK, TOUCH, RESET, PART, OPENED, ENDED, WHOLE = range(14)
STAMP, MATCHED, MARK, UNMARK, GEN, FORGET, RELEASED = range(14, 21)
"""The unified tree's own records (``UnifiedRecorder``)."""
BEGIN, NODE, DROP, SEEN, TOMBS, GENS, OPENS = range(21, 28)
"""The whole tree's records, walked in slices (``Walk``)."""
REOPENED = 28
"""``(REOPENED, sid)``: a closed session's id opened again, its tombstone gone (the bundled cache's
``register_session``: its requests tag again)."""
CAUSE = 29
"""``(CAUSE, cause, who)``: the removals after it, up to the next ``CAUSE``, are for ``cause``
(``gpu_backend.history``: ``flushed``, ``evict_action``; ``""``: back to the tree's own, an
eviction for room or a close); the probe brackets the actions it runs with them."""
OP = 30
"""``(OP, op, session_id, request_id, tokens, prompt_tokens, cached_tokens, asked_tokens)``: an op of
radixtop's own engine (``gpu_backend.history.OPS``: a request's begin with its prompt's token ids as
the bytes of an ``array('q')`` and its hit, its finish with its output's, an abort, a session's
close or register, an evict or flush asked), for the history beside it (``CacheHistory.did``: a
session's hits over time, what a recording replays)."""
def ids_of(tokens: Any) -> array | None:
    """Token ids sent as the bytes of an ``array('q')`` (an ``OP`` record's, a ``probe.SERVED``
    frame's); None: none sent. ValueError: bytes that are not an ``array('q')``'s."""
    if tokens is None:
        return None
    if not isinstance(tokens, bytes) or len(tokens) % 8:
        raise ValueError("token ids that are not an array('q')'s bytes")
    return array("q", tokens)


PIECE = 4096
"""Sessions a ``TOMBS``, ``GENS``, ``OPENS`` or ``SEEN`` record at most."""
FLOOR = 256
"""Marked nodes a step sends at least once the walk is through, whatever the time (as many as the
step marked, up to this: about a millisecond more at most)."""
RECORDER = "_radixtop_recorder"



def wrap_after(owner: Any, name: str, after: Callable[..., None], failed: Callable[[str, Exception], None]) -> None:
    """``owner.name`` wrapped on the instance: ``after(result, *args)`` once it returned, whatever
    ``after`` raises kept out of the owner's call (``failed(name, exc)``); nothing where
    ``owner`` has no such method."""
    original = getattr(owner, name, None)
    if not callable(original):
        return

    @functools.wraps(original)
    def wrapped(*a: Any, **k: Any) -> Any:
        result = original(*a, **k)
        try:
            after(result, *a, **k)
        except Exception as exc:
            failed(name, exc)
        return result

    setattr(owner, name, wrapped)

class _Recorder:
    """What both recorders share: the list of records, its hand-over, a hook's wrapping, the
    session controller's hooks."""

    cache: Any
    controller: Any

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self.failed: str | None = None
        """Why a hook could not record (None: every change so far is recorded)."""
        self.watch: list[Any] | None = None
        """While the whole tree is walked (``Walk``): each node a change was made at or below (its
        path up to the root may differ from what was sent of it); None otherwise."""
        self.gone: list[int] | None = None
        """While the whole tree is walked: the ids of the nodes deleted."""
        self.active: list[str] | None = None
        """While the whole tree is walked: the sessions whose activity radixtop's ledger counts
        (a request's end tagged, a close), in their order."""
        self._diverted: list[int] | None = None
        """Inside an eviction or a close (``_divert``): the ids its deletions deleted."""
        self._next_id = 0
        """Every node with an id below this one existed when last looked (an insert returning a
        node with a higher one added it)."""
        self.begun: set[str] = set()
        """The requests whose begin was told at their admission, not yet given back (SGLang's:
        ``sglang.records.hook_admissions``)."""

    def root(self) -> Any:
        raise NotImplementedError

    def state(self, node: Any) -> tuple:
        """``node`` as it is now: a ``NODE`` record."""
        raise NotImplementedError

    def ends(self) -> list[tuple]:
        """What the whole tree holds besides its nodes, as it is now: the root's ``RESET`` (whole),
        the tombstones and generations, the controller's open sessions."""
        raise NotImplementedError

    def snapshot(self) -> list[tuple]:
        """The whole tree's records in one walk (what ``Walk`` sends over many steps)."""
        walk = Walk(self)
        out = walk.step(most=None)
        while not walk.done:
            out.extend(walk.step(most=None))
        return out

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
        wrap_after(owner, name, after, self._failed)

    # ----- hooks both of a tree's recorders (SGLang 0.5.16's, the bundled cache's) use -----

    def _split(self, head: Any, child: Any, split_len: int) -> None:
        """A node split: ``head`` new above ``child``, its first ``split_len`` tokens (``SPLIT``)."""
        self.records.append((SPLIT, head.id, child.id, int(split_len), head.last_access_time,
                             child.last_access_time))
        self._next_id = max(self._next_id, head.id + 1)
        if self.watch is not None:
            self.watch.append(child)

    def _deleted(self, result: Any, node: Any, *a: Any, **k: Any) -> None:
        """A leaf deleted: ``DELETE``, or one of the ids of the eviction or close it is part of."""
        if self.gone is not None:
            self.gone.append(node.id)
        if self._diverted is not None:
            self._diverted.append(node.id)
        else:
            self.records.append((DELETE, node.id))

    def _locked(self, kind: int) -> Callable[..., None]:
        """A lock count moved on the path from a node up: ``LOCK`` or ``UNLOCK``."""
        def told(result: Any, node: Any, *a: Any, **k: Any) -> None:
            self.records.append((kind, node.id))
            if self.watch is not None:
                self.watch.append(node)
        return told

    def _closing(self, session_id: Any) -> None:
        """Before a close (nothing here)."""

    def _closed(self, session_id: Any) -> None:
        """After a close's ``CLOSE`` record: what else it ended (nothing here)."""

    def _divert(self, cache: Any, name: str, kind: int) -> None:
        """An eviction's or a close's deletions recorded as one record after it (``EVICT``,
        ``CLOSE``), in their order."""
        original = getattr(cache, name, None)
        if not callable(original):
            return

        @functools.wraps(original)
        def recorded(*a: Any, **k: Any) -> Any:
            sid = (a[0] if a else k.get("session_id")) if kind == CLOSE else None
            if kind == CLOSE:
                self._closing(sid)
            if kind == CLOSE and self.watch is not None:  # the nodes it drops the session from
                self.watch.extend((getattr(cache, "_session_leaves", None) or {}).get(sid, ()))
                if self.active is not None:
                    self.active.append(sid)
            outer, self._diverted = self._diverted, []
            try:
                return original(*a, **k)
            finally:
                ids, self._diverted = self._diverted, outer
                try:
                    if outer is not None:  # (nested: the outer one records them)
                        outer.extend(ids)
                    elif kind == CLOSE:
                        self.records.append((CLOSE, sid, ids))
                        self._closed(sid)
                    else:
                        self.records.append((EVICT, ids))
                except Exception as exc:
                    self._failed(name, exc)

        setattr(cache, name, recorded)

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

    def _controller_sessions(self) -> list[tuple]:
        if self.controller is None:
            return []
        return pieces(OPENS, list(getattr(self.controller, "sessions", None) or ()))


class IdSet:
    """A set of node ids as a bytearray indexed by id (SGLang numbers its nodes from a class
    counter: dense, from 0). A Python set of a million ids grows by rehashing all of them at once,
    30-110 ms of the scheduler's thread each time at 0.25-1M (found by ``bench_beside_holds``);
    this grows by a copy of bytes. An id outside it (negative, or past ``DENSE_MOST``) goes in a set."""

    DENSE_MOST = 1 << 30

    def __init__(self, size: int = 0) -> None:
        self._bits = bytearray(max(1024, size))
        self._other: set[int] = set()
        self.count = 0

    def __contains__(self, node_id: int) -> bool:
        bits = self._bits
        if 0 <= node_id < len(bits):
            return bits[node_id] == 1
        return node_id in self._other

    def add(self, node_id: int) -> None:
        bits = self._bits
        if not 0 <= node_id < len(bits):
            if not 0 <= node_id < self.DENSE_MOST:
                if node_id not in self._other:
                    self._other.add(node_id)
                    self.count += 1
                return
            bits.extend(bytes(max(node_id + 1 - len(bits), len(bits) // 2)))
        if not bits[node_id]:
            bits[node_id] = 1
            self.count += 1

    def discard(self, node_id: int) -> None:
        bits = self._bits
        if 0 <= node_id < len(bits):
            if bits[node_id]:
                bits[node_id] = 0
                self.count -= 1
        elif node_id in self._other:
            self._other.discard(node_id)
            self.count -= 1


class Walk:
    """The whole tree, sent over many scheduler steps while SGLang goes on changing it, so that no
    step holds the scheduler for long (a tree of a million nodes is seconds of walking).

    A depth-first walk with a stack of nodes, a slice a step (``step``): each node popped is sent
    as it is then (``NODE``), its children stacked. What SGLang changes meanwhile is not sent as
    the records say (a delta to a node radixtop's side may not have yet): the recorder tells the
    nodes each change was made at (``watch``) and the ids it deleted (``gone``). At the next step
    each sent node on their paths up to the root is marked changed (``dirty``), a node new under a
    sent one marked too (the walk would not reach it: its parent's children were stacked before
    it), a sent node deleted dropped (``DROP``), a stacked one deleted skipped when popped. Once
    the stack is empty the marked nodes go as they are then, a slice a step (a node changed many
    times during the walk goes once more, not once a change), and when none is left the rest
    (``ends``) goes with ``WHOLE``: every node of the tree sent as it is now. A reset of the tree
    meanwhile starts the walk again. Scheduler thread only."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder
        self._ops = [record for record in recorder.take() if record[0] == OP]
        """The engine's ops waiting when the walk began (the rest, older than the walk, is in it):
        they are not the tree's, and go with its first step."""
        recorder.watch, recorder.gone, recorder.active = [], [], []
        self.seen: dict[str, float] = {}
        """The sessions active during the walk, by their last activity's step, oldest first."""
        self._seen_last = 0.0
        self.root = recorder.root()
        self.stack: list[Any] = list(self.root.children.values())
        self.sent = IdSet(int(getattr(type(self.root), "counter", 0) or 0) + 4096)
        """The nodes sent, or marked to go (``dirty``)."""
        self.dirty: dict[int, Any] = {}
        self.gone: set[int] = set()
        self.done = False
        self._begun = False

    def step(self, most: int | None = 256, until: float | None = None) -> list[tuple]:
        """This step's records: the changes since the last one, then at most ``most`` nodes of the
        walk (None: all), fewer where ``time.monotonic()`` passes ``until``."""
        recorder = self.recorder
        watched, deleted, active = recorder.watch, recorder.gone, recorder.active
        if self.done or watched is None or deleted is None or active is None:  # (stopped: the records are the changes')
            return []
        taken = recorder.take()
        seen = self.seen
        if active:
            now = time.monotonic()
            for sid in active:  # (their order kept: one step's a microsecond apart)
                now = max(now, self._seen_last + 1e-6)
                self._seen_last = now
                seen.pop(sid, None)
                seen[sid] = now
        ops = [*self._ops, *(record for record in taken if record[0] == OP)]  # (the requests' ops go as they came)
        self._ops = []
        if any(record[0] == RESET for record in taken):  # a new tree: walked again
            last = self._seen_last
            self.__init__(recorder)  # type: ignore[misc]
            self.seen, self._seen_last, self._ops = seen, last, ops
            return self.step(most, until)
        recorder.watch, recorder.gone, recorder.active = [], [], []
        out: list[tuple] = []
        if not self._begun:
            out.append((BEGIN,))
            self._begun = True
        out.extend(ops)
        sent, dirty, gone, root, state = self.sent, self.dirty, self.gone, self.root, recorder.state
        for node_id in deleted:
            gone.add(node_id)
            if node_id in sent:
                sent.discard(node_id)
                dirty.pop(node_id, None)
                out.append((DROP, node_id))
        marked = 0
        if watched:
            visited: set[int] = set()
            path: list[Any] = []
            for node in watched:
                while node is not None and node is not root and node.id not in visited:
                    visited.add(node.id)
                    path.append(node)
                    node = node.parent
                while path:  # top down: a node made under one marked in this same step is marked too
                    node = path.pop()
                    node_id, parent = node.id, node.parent
                    if node_id not in gone and (node_id in sent or parent is root or
                                                (parent is not None and parent.id in sent)):
                        sent.add(node_id)
                        if node_id not in dirty:
                            dirty[node_id] = node
                            marked += 1
        stack, pop, extend = self.stack, self.stack.pop, self.stack.extend
        n = popped = 0
        while stack and (most is None or n < most):
            node = pop()
            popped += 1
            if until is not None and not popped & 7 and time.monotonic() > until:
                stack.append(node)
                return out
            node_id = node.id
            if node_id in gone:
                continue
            extend(node.children.values())
            if node_id not in sent:
                sent.add(node_id)
                out.append(state(node))
                n += 1
        # the marked nodes once the stack is empty: at least as many a step as this step marked (up
        # to FLOOR), whatever the time, so their number goes down and the walk ends on a busy server
        flushed, least = 0, min(marked + 1, FLOOR)
        while dirty and not stack and (most is None or flushed < most + marked):
            out.append(state(dirty.popitem()[1]))
            flushed += 1
            if until is not None and flushed >= least and not flushed & 7 and time.monotonic() > until:
                return out
        if not stack and not dirty:
            out.extend(recorder.ends())
            out.extend(pieces(SEEN, list(seen), list(seen.values())))
            out.append((WHOLE, sent.count))
            self.stop()
        return out

    def stop(self) -> None:
        self.done = True
        self.recorder.watch = self.recorder.gone = self.recorder.active = None
        self.stack, self.sent, self.dirty, self.gone = [], IdSet(), {}, set()


def pieces(kind: int, *lists: list) -> list[tuple]:
    """``(kind, *lists)`` as records of ``PIECE`` items at most (slices: no Python loop an item)."""
    n = len(lists[0])
    return [(kind, *(items[i : i + PIECE] for items in lists)) for i in range(0, n, PIECE)]


def split_long(record: tuple, most: int) -> list[tuple]:
    """A record over ``most`` bytes as several, each under it, applied in order to the same end:
    an ``ADD``'s tokens as ``PART`` records and the ``ADD`` with the last part; an eviction's or a
    close's deleted ids over several ``EVICT`` or ``CLOSE`` records (a close's first drops the
    session from every node it held, the rest delete); an ``OP`` whose tokens are over it without
    them; any other record as it is."""
    kind = record[0]
    if kind in (TOMBS, GENS, OPENS, SEEN):
        size = sum(len(str(sid)) + 12 for sid in record[1])  # (msgpack: a string's bytes and a few more, a generation)
        if size <= most or len(record[1]) <= 1:
            return [record]
        step = max(1, len(record[1]) * most // size)
        return [(kind, *(items[i : i + step] for items in record[1:])) for i in range(0, len(record[1]), step)]
    if kind in (EVICT, CLOSE):
        ids = record[-1]
        step = max(1, most // 10)  # (msgpack: at most 9 bytes an id)
        if len(ids) <= step:
            return [record]
        return [(*record[:-1], ids[i : i + step]) for i in range(0, len(ids), step)]
    if kind == OP:  # (its tokens over a frame: told without them)
        return [record] if len(record[4] or b"") <= most else [(*record[:4], None, *record[5:])]
    tokens = record[3] if kind == ADD or kind == NODE else b""
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
