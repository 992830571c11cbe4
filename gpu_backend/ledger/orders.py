"""SessionOrders: the sessions kept in order for a page, as of the read (owner thread only).

Each order a reader asked for is a sorted list of keys (``sortedcontainers.SortedList``), made
once at its first read; afterwards a session whose figures, activity or state moved is re-keyed
at the next read (O(log n) each), so a page costs O(log n + page) plus the sessions that moved
since. Orders by a figure the ledger sums at read time (fair share, locked tokens) are made at
the tree by ``paths.PathSums`` (a page of the top K is a best-first walk of the tree, O(K x depth
x log n), in steps for a page that lies deep or asks for a filter); where the ledger cannot keep
them (locks the tree does not follow) they are ranked at their read from every session's figures
(``ranked_pass``).
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sortedcontainers import SortedKeyList, SortedList

from radixtop.gpu_backend.ledger.paths import PathSums
from radixtop.gpu_backend.owner.shards import ShardedMap, ShardedSet
from radixtop.gpu_backend.owner.slices import released


class Ledger(Protocol):
    """What the orders read of a ledger: ``SessionLedger`` (a tree of nodes) or the KV events'
    ``BlockLedger`` (a tree of blocks)."""

    moved: set[str]
    moves: int
    locks_told: bool

    @property
    def tags(self) -> Mapping[str, int]: ...
    @property
    def exclusive(self) -> dict[str, int]: ...
    def figures(self, sid: str) -> tuple[int, int, int]: ...
    def shares(self, sid: str, leaves: Iterable[Any]) -> tuple[float, int]: ...


# (id, closed, tagged_nodes, exclusive_bytes, shared_bytes, fair_share_bytes, locked_tokens,
#  last activity as a monotonic time or None)
SessionRow = tuple[str, bool, int, int, int, int, int, "float | None"]

KEPT_ORDERS = ("exclusive_bytes", "shared_bytes", "tagged_nodes", "last_activity", "state", "id")
"""Orders kept sorted between reads; the others are kept on the tree (``PATH_ORDERS``) or ranked
at their read."""
PATH_ORDERS = ("fair_share_bytes", "locked_tokens")
"""Orders by a sum over each session's path, kept on the tree where the ledger can (``PathSums``)."""
RANK_BUDGET = 100
"""A ranking of every session (an order not kept) is reused for this many times its cost."""
RANK_MIN_S = 1.0
RANK_FORGET_S = 600.0
WALK_REUSE_S = 0.05
"""A path page whose walk took more work than this (a page far down the order: 16-25 µs a session
walked past at 1M nodes) keeps its ids, reused by the same ask for ``RANK_BUDGET`` times that
work, with their age (its rows made at every read): a dashboard parked 10,000 rows down costs
the owner ~1%, not a quarter of its time."""
CHUNK = 512
"""Sessions keyed or matched per step of a pass."""
RECOUNT_AT_ONCE = 4096
"""Sessions a stats read recounts at once (a few ms at most)."""
STEP_S = 0.001
"""A loop over sessions yields once it has run this long (``_spent``, checked every 8 sessions),
as well as after its count: at 1M nodes under the demo workload, steps bounded by a count alone
ran 5-7 ms; those that still did were a set or dict of every session rebuilding its table, now
in shards (docs/benchmarks.md)."""
TAKE_CHUNK = 512
"""Sessions that moved taken into the orders per step (set operations; all of them at attach)."""
PRUNE_CHUNK = 4096
"""Roster entries kept or dropped per step of a prune."""
MAKE_CHUNK = 128
"""Sessions keyed and added per step of an order's making (512 a step held the owner 4-8 ms at 50k)."""
SORT_RUN = 2048
"""Keys sorted per step of a ranking (a run; the runs are merged after)."""
IDS_CHUNK = 1024
"""Ids merged from the runs per step of a ranking."""
REKEY_CHUNK = 64
"""Sessions re-keyed per step of a read (a remove and an add in the sorted keys each)."""
ROWS_CHUNK = 64
"""Rows made per step of a pass (a row sums its session's path: the first page of a read is of
one step)."""


def row_matches(sid: str, closed: bool, needle: str) -> bool:
    """``needle`` (lower case) in the session's id, or the session's state (``open``, ``closed``)."""
    return needle in sid.lower() or needle == ("closed" if closed else "open")


class SessionOrders:
    """The listed sessions of one cache and their orders.

    A session is listed while it is ``known`` (seen by the server: open, running, registered),
    closed (``is_closed``: tombstoned), or holds a node. ``seen_at(sid)``: its last activity
    (``time.monotonic()``) or None; ``leaves_of(sid)``: the nodes it tags, in the cache's order;
    ``everyone()``: every session that may be listed when the orders are made (each of them
    then moved once). The owner calls ``dirty(sid)`` whenever a session's state, activity or
    listing moves; the ledger's own changes come through ``SessionLedger.moved``.

    Every session that ever moved is on the roster (a list: appended to as sessions come, never
    copied whole), which the passes over every session (an order made, a ranking) walk a chunk a
    step: at 1M nodes a copy of 100k ids touches 100k objects far apart in memory, 4-34 ms in one
    step. A ranking drops those no longer listed from it.

    A set the orders drain by ``pop()`` (the pending re-keys, the recount) is made anew once
    empty: an emptied set keeps its table, and each later ``pop()`` of its few entries scans the
    empty slots from where the last stopped (64 pops from a drained table of 100k: 2.2 ms, from a
    new set 9 us).
    """

    def __init__(self, ledger: Ledger, bytes_per_token: int,
                 known: Callable[[str], bool], is_closed: Callable[[str], bool],
                 seen_at: Callable[[str], float | None], leaves_of: Callable[[str], Collection[Any]],
                 everyone: Callable[[], Iterable[str]]):
        self.ledger = ledger
        self.bpt = bytes_per_token
        self.known, self.is_closed, self.seen_at = known, is_closed, seen_at
        self.leaves_of, self.everyone = leaves_of, everyone
        self._orders: dict[str, _Order] = {}
        self._ranked: dict[tuple[str, str, bool], _Ranking] = {}
        self._walked: dict[tuple[str, int, int, str, bool], _Walked] = {}
        self._paths: dict[str, PathSums] = {}
        self.rank_min_s, self.rank_budget = RANK_MIN_S, RANK_BUDGET
        self._open: ShardedSet[str] = ShardedSet()  # sharded: no add rebuilds a table of every session
        self._recount: set[str] = set()
        self._roster: list[str] = []
        self._on_roster: ShardedSet[str] = ShardedSet()
        ledger.moved.update(everyone())  # what the owner knows already: counted as it moves from now on
        self.moves = 0

    # ----- what the owner tells -----

    def dirty(self, sid: str) -> None:
        self.moves += 1
        self.ledger.moved.add(sid)

    def dirty_all(self, sids: set[str]) -> None:
        """``dirty`` for many at once (a set union: no loop in Python)."""
        self.moves += 1
        self.ledger.moved |= sids

    def _take_moved(self) -> bool:
        """The sessions that moved since the last read go to every kept order's pending set and
        to the roster, and the count of open listed sessions follows them; ``TAKE_CHUNK`` of them
        at a call (at attach, every session has moved). False while some are left."""
        moved = self.ledger.moved
        if not moved:
            return True
        if len(moved) <= TAKE_CHUNK:
            self.ledger.moved = set()
            part = moved
        else:  # popped: a set's pop goes on from where the last ended, an islice from its start
            # steps over every slot emptied before (50k ids taken 512 a time: the longest take
            # 3.25 ms by islice, 0.15 ms by pop)
            pop = moved.pop
            part = {pop() for _ in range(TAKE_CHUNK)}
        for order in self._orders.values():
            order.pending |= part
        for sums in self._paths.values():
            sums.pending |= part
        self._recount |= part
        on_roster = self._on_roster
        fresh = [sid for sid in part if sid not in on_roster]
        if fresh:
            on_roster.update(fresh)
            self._roster.extend(fresh)
        return not self.ledger.moved

    def _take_all_moved(self) -> Generator[None, None, None]:
        while not self._take_moved():
            yield

    def _recount_some(self, most: int) -> None:
        opened, listed, closed, recount = self._open, self.listed, self.is_closed, self._recount
        for _ in range(min(most, len(recount))):
            sid = recount.pop()
            if listed(sid) and not closed(sid):
                opened.add(sid)
            else:
                opened.discard(sid)
        if not recount:
            self._recount = set()  # a set drained by pop() is made anew (see SessionOrders)

    def open_count(self) -> int | None:
        """Listed sessions that are open, now (kept as sessions move: O(those that moved)); None
        while more moved than one read recounts (at attach: a sessions read drains them)."""
        self._take_moved()
        self._recount_some(RECOUNT_AT_ONCE)
        return None if self._recount or self.ledger.moved else len(self._open)

    # ----- reads -----

    def listed(self, sid: str) -> bool:
        return self.known(sid) or self.is_closed(sid) or sid in self.ledger.tags

    def row(self, sid: str) -> SessionRow:
        """``sid``'s figures now (tokens to bytes at the cache's bytes per token)."""
        tagged, exclusive, path = self.ledger.figures(sid)
        leaves = self.leaves_of(sid)
        fair, locked = self.ledger.shares(sid, leaves) if leaves else (0.0, 0)
        bpt = self.bpt
        return (sid, self.is_closed(sid), tagged, exclusive * bpt, max(0, path - exclusive) * bpt,
                round(fair * bpt), locked, self.seen_at(sid))

    def page_pass(self, order: str, offset: int, limit: int, contains: str = "", reverse: bool = False,
                  ) -> Generator[None, None, tuple[list[SessionRow], int, int, float]]:
        """Rows ``offset:offset+limit`` of the listed sessions that match ``contains`` (''
        all) in ``order`` (``reverse``: from its other end), how many match, how many are
        listed, and how old their order is (0: as of the read; see ``ranked_pass``); a pass that yields every ``CHUNK`` sessions it re-keys or matches."""
        yield from self._take_all_moved()
        while self._recount:  # the open count, for the sessions that moved (all of them at attach)
            self._recount_some(CHUNK)
            if self._recount:
                yield
        if order == "locked_tokens" and not getattr(self.ledger, "has_locks", True):
            order = "id"  # no locks in this tree: every session's figure is 0, so the order is by id
        if order not in KEPT_ORDERS:
            if self._keeps_path(order):
                return (yield from self._path_page(order, offset, limit, contains, reverse))
            return (yield from self.ranked_pass(order, offset, limit, contains, reverse))
        kept = yield from self._ready(self._orders, order, self._made)
        yield from kept.catch_up(self)
        keys = kept.keys
        needle = contains.strip().lower()
        if not needle:
            total = len(keys)
            if reverse:
                start, stop = max(total - offset - limit, 0), max(total - offset, 0)
                ids = [k[-1] for k in keys.islice(start, stop)][::-1]
            else:
                ids = [k[-1] for k in keys.islice(offset, offset + limit)]
            return (yield from self.rows_pass(ids)), total, total, 0.0
        matching: list[str] = []
        total = 0
        want = offset + limit
        closed = self.is_closed
        for k, key in enumerate(reversed(keys) if reverse else keys):
            sid = key[-1]
            if row_matches(sid, closed(sid), needle):
                if offset <= total < want:
                    matching.append(sid)
                total += 1
            if k % CHUNK == CHUNK - 1:
                yield
        return (yield from self.rows_pass(matching)), total, len(keys), 0.0

    def rows_pass(self, ids: list[str]) -> Generator[None, None, list[SessionRow]]:
        """The rows of ``ids``, ``ROWS_CHUNK`` a step (each sums its session's path)."""
        rows: list[SessionRow] = []
        started = time.perf_counter()
        for k, sid in enumerate(ids):
            if k and (k % ROWS_CHUNK == 0 or _spent(k, started)):
                yield
                started = time.perf_counter()
            rows.append(self.row(sid))
        return rows

    def ranked_pass(self, order: str, offset: int, limit: int, contains: str = "", reverse: bool = False,
                    ) -> Generator[None, None, tuple[list[SessionRow], int, int, float]]:
        """A page in an order not kept between reads (fair share, locked tokens): every listed session's row made (``ROWS_CHUNK`` a step) and ranked. The ranking
        is reused while younger than ``RANK_BUDGET`` times what it cost (or ``RANK_MIN_S``), so
        such an order costs the owner at most ~1%; the page's rows are made anew at every read
        (current), their order is as of the ranking (its age, returned last)."""
        needle = contains.strip().lower()
        ask = (order, needle, reverse)
        now = time.monotonic()
        kept = self._ranked.get(ask)
        if kept is not None and kept.stamp == self._stamp() and self._told(order):  # nothing moved since
            rows = yield from self.rows_pass(kept.ids[offset : offset + limit])
            return rows, len(kept.ids), kept.listed, 0.0
        if kept is None or now - kept.taken_at >= max(self.rank_min_s, self.rank_budget * kept.cost_s):
            kept = yield from self._ranking(order, needle, reverse)
            self._ranked = {k: v for k, v in self._ranked.items() if now - v.taken_at < RANK_FORGET_S}
            self._ranked[ask] = kept
            age = 0.0  # made by this read
        else:
            age = max(1e-6, now - kept.taken_at)
        rows = yield from self.rows_pass(kept.ids[offset : offset + limit])
        return rows, len(kept.ids), kept.listed, age

    def _keeps_path(self, order: str) -> bool:
        ledger = self.ledger
        if order not in PATH_ORDERS:
            return False
        if order != "locked_tokens" or ledger.locks_told:  # (a tree with no locks reads by id)
            return True
        tell = getattr(ledger, "tell_locks", None)  # locks followed from the first read by them
        return tell is not None and tell()

    def _ready(self, table: dict[str, Any], order: str, make: Callable[[str], Generator[None, None, Any]],
               ) -> Generator[None, None, Any]:
        """``table[order]`` ready to read: made by this read where no other has made it, else
        waited for while another read makes it (between the same steps), made again where that
        read was dropped midway."""
        made = table.get(order)
        if made is None:
            made = yield from make(order)
        while not made.ready:
            yield
            if table.get(order) is not made:
                made = table.get(order) or (yield from make(order))
        return made

    def _path_page(self, order: str, offset: int, limit: int, contains: str, reverse: bool,
                   ) -> Generator[None, None, tuple[list[SessionRow], int, int, float]]:
        """A page in a path order from ``PathSums``: the sessions that moved and the nodes whose
        weight moved settled in steps, then the order walked from its top (``contains``: past
        the sessions that do not match) until the page is full, in steps of ``STEP_S``, over the
        sums as that last settle left them (current: no settle runs while the walk is under
        way, whatever the owner changes between its steps), then the page's rows. Where few
        match the filter, their own rows ranked instead; a walk that cost over ``WALK_REUSE_S``
        reused a while, with its age."""
        sums = yield from self._ready(self._paths, order, self._path_made)
        needle = contains.strip().lower()
        closed = self.is_closed
        ask = (order, offset, limit, needle, reverse)
        walked = self._walked.get(ask)
        if walked is not None:
            old = time.monotonic() - walked.taken_at
            if old < self.rank_budget * walked.cost_s:
                return (yield from self.rows_pass(walked.ids)), walked.total, walked.listed, max(1e-6, old)
            del self._walked[ask]
        work = 0.0
        while True:
            while True:
                yield from self._take_all_moved()
                current = yield from sums.settle()
                if not current or not self.ledger.moved:  # nothing moved between: the walk starts now
                    break
            age = 0.0 if current else max(1e-6, time.monotonic() - sums.settled_at)
            ids: list[str] = []
            want, matched = offset + limit, 0
            total = listed = sums.listed_count()
            generation = sums.begin_walk()
            try:
                matching = (yield from self._matching(sums, needle, generation)) if needle else None
                if matching is not None:
                    total = len(matching)
                # few match: their own rows ranked (m rows, current) costs less than walking
                # past the others to the page (about want x listed / m sessions walked)
                few = matching is not None and total * total <= want * listed
                if not few and want > 0 and sums.generation == generation:
                    started = time.perf_counter()
                    for k, sid in enumerate(sums.walk(ascending=reverse), 1):
                        if not needle or row_matches(sid, closed(sid), needle):
                            if matched >= offset:
                                ids.append(sid)
                            matched += 1
                            if matched >= want:
                                break
                        if _spent(k, started):
                            work += time.perf_counter() - started
                            yield
                            started = time.perf_counter()
                            if sums.generation != generation:
                                break  # settled under it (it was held too long): again
                    work += time.perf_counter() - started
            finally:
                sums.end_walk()
            if sums.generation == generation:
                break
        if few:
            rows = yield from self.rows_pass(matching)  # type: ignore[arg-type]
            rows.sort(key=ROW_KEYS[order], reverse=reverse)
            return rows[offset:want], total, listed, 0.0
        if work > WALK_REUSE_S and not age:
            now = time.monotonic()
            self._walked = {k: v for k, v in self._walked.items() if now - v.taken_at < RANK_FORGET_S}
            self._walked[ask] = _Walked(ids, total, listed, now, work)
        return (yield from self.rows_pass(ids)), total, listed, age

    def _matching(self, sums: PathSums, needle: str, generation: int) -> Generator[None, None, list[str]]:
        """The listed ids (as of ``sums``' last settle) that match ``needle``, ``CHUNK`` a step;
        cut short where the sums were settled meanwhile (the caller starts again)."""
        closed = self.is_closed
        matching = []
        for k, sid in enumerate(sums.listed_ids(), 1):
            if row_matches(sid, closed(sid), needle):
                matching.append(sid)
            if k % CHUNK == 0:
                yield
                if sums.generation != generation:
                    break
        return matching

    def _path_made(self, order: str) -> Generator[None, None, PathSums]:
        """A path order made at its first read: every session on the roster pending, a chunk a step."""
        ledger = self.ledger
        if order == "fair_share_bytes":
            sums = PathSums(ledger, ledger.fair_weight, lambda sid: self.row(sid)[5], self.leaves_of, self.listed,
                            ledger.alive, getattr(ledger, "fair_tail", None), scale=self.bpt)
        else:
            sums = PathSums(ledger, ledger.locked_weight, lambda sid: self.row(sid)[6], self.leaves_of,
                            self.listed, ledger.alive, rounded=False, lock=True)
        self._paths[order] = sums  # a session that moves while it is made is pending at once
        try:
            yield from self._take_all_moved()
            roster, start = self._roster, 0
            while start < len(roster):  # appended to meanwhile: those too
                sums.pending.update(roster[start : start + TAKE_CHUNK])
                start += TAKE_CHUNK
                yield
            sums.ready = True
        finally:
            if not sums.ready and self._paths.get(order) is sums:  # dropped midway: made again next time
                del self._paths[order]
                ledger.unwatch(sums.watch)
        return sums

    def _told(self, order: str) -> bool:
        """Whether every change to ``order``'s figure moves the stamp (a lock does only where
        locks are followed)."""
        return order != "locked_tokens" or self.ledger.locks_told

    def _stamp(self) -> tuple[int, int]:
        return self.ledger.moves, self.moves

    def _ranking(self, order: str, needle: str, reverse: bool) -> Generator[None, None, _Ranking]:
        """Every listed session's row, ranked, a pass whose every step is bounded: the rows made
        ``ROWS_CHUNK`` a step, their keys sorted in runs of ``SORT_RUN`` a step, the runs merged
        ``IDS_CHUNK`` ids a step, the working lists freed a chunk a step (a sort of 50k rows at
        the end was 116 ms in one step, freeing them 20 ms)."""
        key = ROW_KEYS[order]
        yield from self._take_all_moved()
        stamp = self._stamp()
        keys: list[Any] = []
        listed, work = 0, 0.0
        started = time.perf_counter()
        roster, gone, ranked = self._roster, [], ShardedSet()
        for start in range(0, len(roster), ROWS_CHUNK):  # appended to meanwhile: those too
            for sid in roster[start : start + ROWS_CHUNK]:
                if sid in ranked:
                    continue
                ranked.add(sid)
                if self.listed(sid):
                    listed += 1
                    row = self.row(sid)
                    if not needle or row_matches(sid, row[1], needle):
                        keys.append(key(row))  # every key ends with the id (unique)
                else:
                    gone.append(sid)
            work += time.perf_counter() - started
            yield
            started = time.perf_counter()
        if gone:
            yield from self._prune(gone)
        runs = []
        for start in range(0, len(keys), SORT_RUN):
            runs.append(sorted(keys[start : start + SORT_RUN], reverse=reverse))
            work += time.perf_counter() - started
            yield
            started = time.perf_counter()
        ids: list[str] = []
        for k, kv in enumerate(heapq.merge(*runs, reverse=reverse)):
            ids.append(kv[-1] if isinstance(kv, tuple) else kv)
            if k % IDS_CHUNK == IDS_CHUNK - 1:
                work += time.perf_counter() - started
                yield
                started = time.perf_counter()
        work += time.perf_counter() - started
        yield from released(keys, gone, ranked, *runs)
        moved = stamp != self._stamp()  # between its steps: as of its start, so already old
        return _Ranking(ids, listed, time.monotonic(), work, None if moved else stamp)

    def _prune(self, gone: list[str]) -> Generator[None, None, None]:
        """``gone`` (no longer listed) off the roster, a new roster made a chunk a step; a session
        that comes back meanwhile has moved and is put on it again (once)."""
        on_roster = self._on_roster
        on_roster.difference_update(gone)
        old, new, kept = self._roster, [], ShardedSet()
        start = 0
        while start < len(old):  # appended to meanwhile: those too
            for sid in old[start : start + PRUNE_CHUNK]:
                if sid in on_roster and sid not in kept:
                    kept.add(sid)
                    new.append(sid)
            start += PRUNE_CHUNK
            if start < len(old):
                yield
        self._roster = new
        if sys.getrefcount(old) <= 2:  # no other pass walks the old one: freed a chunk a step
            yield from released(old)
        yield from released(kept)

    def _made(self, order: str) -> Generator[None, None, _Order]:
        """An order made at its first read: every listed session keyed and added, ``CHUNK`` a step
        (a session that moves meanwhile is re-keyed by ``catch_up``)."""
        key = KEY_OF[order]
        made = _Order()
        made.key = key
        keys = made.keys
        self._orders[order] = made  # a session that moves while it is made is pending at once
        try:
            yield from self._take_all_moved()
            roster, start = self._roster, 0
            while start < len(roster):  # appended to meanwhile: those too
                began = time.perf_counter()
                for sid in roster[start : start + MAKE_CHUNK]:
                    start += 1
                    if sid not in made.key_of and self.listed(sid):
                        made.key_of[sid] = kv = key(self, sid)
                        keys.add(kv)  # one at a time: a sort of 50k keys at once is tens of ms in one step
                    if _spent(start, began):
                        break
                yield
            made.ready = True
        finally:
            if not made.ready and self._orders.get(order) is made:  # dropped midway: made again next time
                del self._orders[order]
        return made


@dataclass
class _Ranking:
    ids: list[str]
    listed: int
    taken_at: float
    cost_s: float
    stamp: tuple[int, int] | None


@dataclass
class _Walked:
    """A costly walk's page (``WALK_REUSE_S``): its ids, how many matched, how many were listed."""

    ids: list[str]
    total: int
    listed: int
    taken_at: float
    cost_s: float


class _Order:
    __slots__ = ("keys", "key_of", "pending", "key", "ready")

    def __init__(self) -> None:
        self.keys: SortedList | SortedKeyList = SortedList()
        self.key_of: ShardedMap[str, tuple] = ShardedMap()  # no add rebuilds a table of every session
        self.pending: set[str] = set()
        self.key: Callable[[SessionOrders, str], tuple] = KEY_OF["id"]
        self.ready = False

    def catch_up(self, orders: SessionOrders) -> Generator[None, None, None]:
        """Re-key the sessions that moved since the last read, ``CHUNK`` a step."""
        keys, key_of, key = self.keys, self.key_of, self.key
        while True:
            orders._take_moved()  # those that moved between its steps too
            if not self.pending:
                return
            started = time.perf_counter()
            for k in range(min(REKEY_CHUNK, len(self.pending))):
                if k and _spent(k, started):
                    break
                sid = self.pending.pop()
                old = key_of.pop(sid, None)
                if old is not None:
                    keys.remove(old)
                if orders.listed(sid):
                    key_of[sid] = new = key(orders, sid)
                    keys.add(new)
            if self.pending:
                yield
            else:
                self.pending = set()  # a set drained by pop() is made anew (see SessionOrders)



def _spent(done: int, started: float) -> bool:
    """A loop over sessions that has done ``done`` of them since ``started`` (``perf_counter``)
    has run its ``STEP_S`` (the clock read every 8)."""
    return done % 8 == 0 and time.perf_counter() - started > STEP_S


def _shared(o: SessionOrders, sid: str) -> int:
    _, exclusive, path = o.ledger.figures(sid)
    return max(0, path - exclusive)


KEY_OF: dict[str, Callable[[SessionOrders, str], tuple]] = {
    "exclusive_bytes": lambda o, sid: (-o.ledger.exclusive.get(sid, 0), sid),
    "shared_bytes": lambda o, sid: (-_shared(o, sid), sid),
    "tagged_nodes": lambda o, sid: (-o.ledger.tags.get(sid, 0), sid),
    "last_activity": lambda o, sid: ((t := o.seen_at(sid)) is None, -(t or 0.0), sid),
    "state": lambda o, sid: (o.is_closed(sid), sid),
    "id": lambda o, sid: (sid,),
}
"""Each kept order's key of a session (its id last: the key names the session)."""

ROW_KEYS: dict[str, Callable[[SessionRow], Any]] = {
    "exclusive_bytes": lambda r: (-r[3], r[0]),
    "shared_bytes": lambda r: (-r[4], r[0]),
    "fair_share_bytes": lambda r: (-r[5], r[0]),
    "locked_tokens": lambda r: (-r[6], r[0]),
    "tagged_nodes": lambda r: (-r[2], r[0]),
    "last_activity": lambda r: (r[7] is None, -(r[7] or 0.0), r[0]),
    "state": lambda r: (r[1], r[0]),
    "id": lambda r: r[0],
}
"""Every order's key of a row (the same orders as ``KEY_OF``)."""
