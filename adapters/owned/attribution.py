"""Memory attribution to sessions, shared by the in-process adapters (bundled and SGLang).

Computed on the cache's owner thread in one pass over the sessions' paths (for a large cache,
in slices between the owner's steps: ``AttributionCache``); kept as plain tuples (a frozen view
per session costs more to build than that session's whole attribution), turned into
``SessionView``s only for the page asked for.
"""

from __future__ import annotations

import heapq
import operator
import sys
import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixtop.adapters.model import SessionsPage, SessionView
from radixtop.gpu_backend.ledger.orders import ROW_KEYS, SessionRow
from radixtop.gpu_backend.owner.queue import gc_paused
from radixtop.gpu_backend.owner.shards import SHARD_MASK, ShardedMap
from radixtop.gpu_backend.owner.slices import Slices, released, run_to_end
from radixtop.gpu_backend.session_rules import exclusive_tokens_pass

ATTRIBUTION_BUDGET = 400
"""Reuse an attribution for 400x what the next would cost: passes take <= 0.25% of the owner (of
the 1% that all of radixtop may take, issue 15). At 1M nodes and 50k sessions a pass is ~1 s of
work, so its figures are up to ~7 min old there, and say so; an action makes them again at once."""
INLINE_S = 0.005
"""The most a read runs an attribution pass on the spot, where the last pass took at most
``SMALL_S`` (a small cache: attributed at once, exactly, well within it); the rest of the pass
runs in slices between the owner's steps."""
SMALL_S = 0.001
"""A pass this cheap runs on the spot; a costlier one (or the first, of unknown cost, past this
long) runs in slices only, so that the read's hold stays within the goal (5 ms)."""
FRESH_WAIT_S = 1.0
"""After an action, how long a read run in slices waits for the figures made afresh (driving the
pass itself between the owner's steps) before it takes the last ones, marked refreshing: a small
cache's pass ends well within it, so the page read after a close is exact; a large one's page
comes within a second, its figures from before the action (the closed session shown closed)."""

SESSION_KEYS = ROW_KEYS
"""Each order's key of a row (``gpu_backend.ledger.orders``: the same orders as the kept ones)."""


def row_matches(row: SessionRow, needle: str) -> bool:
    """``needle`` (lower case) in the session's id, or the session's state (``open``, ``closed``)."""
    return needle in row[0].lower() or needle == ("closed" if row[1] else "open")


def session_view(row: SessionRow, now: float) -> SessionView:
    sid, closed, tagged, exclusive, shared, fair, locked, seen_at = row
    return SessionView(id=sid, state="closed" if closed else "open", tagged_nodes=tagged,
                       exclusive_bytes=exclusive, shared_bytes=shared, fair_share_bytes=fair,
                       locked_tokens=locked,
                       last_activity_age_s=None if seen_at is None else max(0.0, now - seen_at))


@dataclass
class Attribution:
    """Every session's figures and each node's count of distinct sessions beneath it."""

    key: Any
    taken_at: float
    cost_s: float
    sessions: dict[str, SessionRow] | ShardedMap[str, SessionRow]
    beneath: dict[int, int] | ShardedMap[int, int]
    holding: int = 0
    """Sessions that held KV when it was made: its cost grows with them."""
    opened: int = 0
    """Sessions open when it was made (a large server's count, without a pass over them per read)."""

    def fresh(self, key: Any, max_age: float, budget: float, holding: int | None = None) -> bool:
        """Still good: nothing changed (same key), or younger than ``max_age`` seconds or than
        ``budget`` times what the next one would cost, whichever is longer (a live cache moves
        at every step). The next one's cost is this one's, scaled by the growth in sessions holding
        KV (``holding``: their number now, where the caller knows it cheaply), so that a growing
        cache's attribution keeps to its share of the owner's time."""
        if key == self.key:
            return True
        growth = holding / self.holding if holding and self.holding else 1.0
        return time.monotonic() - self.taken_at < max(max_age, self.cost_s * budget * max(1.0, growth))

    _ordered: dict[str, list[SessionRow]] = field(default_factory=dict, repr=False, compare=False)
    _filtered: dict[tuple[str, str], list[SessionRow]] = field(default_factory=dict, repr=False, compare=False)

    def age_s(self, now: float) -> float:
        """Seconds since it was made (``now`` from ``time.monotonic()``)."""
        return max(0.0, now - self.taken_at)

    def page(self, order: str, offset: int, limit: int, contains: str = "",
             reverse: bool = False) -> tuple[list[SessionRow], int]:
        """Rows ``offset:offset+limit`` in ``order`` (one of SESSION_KEYS; ``reverse``: read from
        its other end) of the sessions that match ``contains`` (``row_matches``; '' all), and how
        many match. Each order is sorted once per attribution, each filter of it run once, so a
        dashboard's repeated reads cost a slice."""
        return run_to_end(self.page_pass(order, offset, limit, contains, reverse))

    def page_pass(self, order: str, offset: int, limit: int, contains: str = "", reverse: bool = False,
                   chunk: int = 1024) -> Generator[None, None, tuple[list[SessionRow], int]]:
        """``page`` as a pass: the first read of an order sorts the rows ``chunk`` at a
        time and merges them, yielding between (50k sessions take tens of ms to sort at once);
        the first read of a filter scans them a chunk at a time."""
        rows = self._ordered.get(order)
        if rows is None:
            key = SESSION_KEYS[order]
            everything: list[SessionRow] = []
            for part in getattr(self.sessions, "shards", None) or (self.sessions,):  # 50k rows: a shard a chunk
                everything.extend(part.values())
                yield
            runs = []
            for start in range(0, len(everything), chunk):
                runs.append(sorted(everything[start : start + chunk], key=key))
                yield
            rows = []
            for row in heapq.merge(*runs, key=key):
                rows.append(row)
                if len(rows) % chunk == 0:
                    yield
            self._ordered[order] = rows
        needle = contains.strip().lower()
        if needle:
            matching = self._filtered.get((order, needle))
            if matching is None:
                matching = []
                for start in range(0, len(rows), chunk * 8):
                    matching.extend(r for r in rows[start : start + chunk * 8] if row_matches(r, needle))
                    yield
                if len(self._filtered) >= 8:  # a few filters per attribution at most
                    self._filtered.clear()
                self._filtered[(order, needle)] = matching
            rows = matching
        total = len(rows)
        if reverse:
            start = max(total - offset - limit, 0)
            return rows[start : max(total - offset, 0)][::-1], total
        return rows[offset : offset + limit], total

    _sessions_holding: int | None = field(default=None, repr=False, compare=False)

    @property
    def sessions_holding(self) -> int:
        """Sessions that tag a node (the root's sessions beneath): counted once per attribution
        (a pass over 50k rows is milliseconds, and the dashboard's root detail reads it each poll)."""
        if self._sessions_holding is None:
            self._sessions_holding = sum(1 for row in self.sessions.values() if row[2])
        return self._sessions_holding


VIEWS_CHUNK = 256
"""Session rows turned into views per slice."""


def sessions_page_pass(attribution: Attribution, order: str, offset: int, limit: int, contains: str,
                        reverse: bool, refreshing: bool) -> Generator[None, None, SessionsPage]:
    """A sessions page of ``attribution`` as a pass (``CacheAdapter.sessions``)."""
    rows, total = yield from attribution.page_pass(order, offset, limit, contains, reverse)
    now, page = time.monotonic(), []
    for start in range(0, len(rows), VIEWS_CHUNK):
        page.extend(session_view(r, now) for r in rows[start : start + VIEWS_CHUNK])
        yield
    return SessionsPage(offset, limit, total, order, tuple(page), attribution.age_s(now), refreshing,
                        contains.strip(), reverse, len(attribution.sessions))


def attribute(*args: Any, **kwargs: Any) -> Attribution:
    """``attribution_pass(*args, **kwargs)`` run to its end in one go (``in_one_go``)."""
    return in_one_go(attribution_pass(*args, **kwargs))


def in_one_go(work: Generator[None, None, Attribution]) -> Attribution:
    """A pass run to its end at once: exact, as of now, with ``cost_s`` the time it took and the
    cyclic GC paused meanwhile (paths, dicts and rows by the hundred thousand: a collection
    midway only stalls the owner longer)."""
    started = time.perf_counter()
    with gc_paused():
        result = run_to_end(work)
    result.cost_s = time.perf_counter() - started
    return result


def attribution_pass(
    root: Any,
    session_leaves: Mapping[str, Collection[Any]],
    closed: Collection[str],
    known: Iterable[str],
    activity: Mapping[str, float],
    bytes_per_token: int,
    frees: bool = True,
    key: Any = None,
    lock_ref: Callable[[Any], int] = operator.attrgetter("lock_ref"),
    chunk: int = 1024,
) -> Generator[None, None, Attribution]:
    """Attribute the tree's memory to every session in ``session_leaves`` and ``known``, as a
    generator that yields after about ``chunk`` nodes or sessions, so that a large cache is
    attributed in slices between the owner's steps instead of in one long stall (``attribute``
    runs it in one go).

    ``frees``: a close frees the session's exclusive nodes now (SessionRadixCacheMixin's rule); False for a
    close that only drops references (exclusive is then 0). Nodes need ``parent``, ``key``,
    ``children`` and ``id``; ``lock_ref(node)`` reads a node's lock count; ``activity`` maps
    session ids to a ``time.monotonic()`` of their last activity.

    Each session is walked within one slice, so its own figures are of one instant. Where the
    tree changes between slices, sessions walked at different instants disagree slightly: a
    node split or freed meanwhile may count for fewer sessions than it serves, or for no one's
    exclusive bytes, until the next pass. It never fails on such changes: a node freed since has
    no parent and ends its walk. The caller sets ``cost_s`` (the work, not the slices' span).
    """
    bpt = bytes_per_token
    # Each session's union of root paths (a plain walk for the common single tag), then how
    # many sessions each node on those paths serves.
    unions: dict[str, list[Any]] = {}
    # the large maps in shards: a dict of 100k+ entries grows by rebuilding it all in one insert
    # (2-9 ms in one chunk of the pass; ``ShardedMap``)
    beneath: ShardedMap[Any, int] = ShardedMap()
    beneath_shards = beneath.shards
    budget = chunk
    for sid in list(session_leaves):
        leaves = session_leaves.get(sid)
        if not leaves:
            continue
        path: list[Any] = []
        freed = False
        if len(leaves) == 1:
            node = next(iter(leaves))
            while node is not root and node is not None:
                path.append(node)
                node = node.parent
            freed = node is None
        else:
            seen: set[Any] = set()
            for leaf in leaves:
                node = leaf
                while node is not root and node is not None and node not in seen:
                    seen.add(node)
                    path.append(node)
                    node = node.parent
                freed = freed or node is None
        if freed:  # a leaf from a snapshot of the index, freed since: a freed node has no parent
            path = [n for n in path if n.parent is not None]
        unions[sid] = path
        for node in path:
            shard = beneath_shards[hash(node) & SHARD_MASK]
            shard[node] = shard.get(node, 0) + 1
        budget -= len(path) + 1
        if budget <= 0:
            yield
            budget = chunk
    if frees:
        exclusive_by_session = yield from exclusive_tokens_pass(root, session_leaves, beneath, chunk, ShardedMap)
    else:
        exclusive_by_session = {}
    everyone: dict[str, None] = {}
    # known and closed are the owner's live maps, changed between slices: copied here (a copy of
    # 50k ids is a fraction of a slice), then taken a chunk at a time
    for group in (list(known), list(closed), unions):
        for k, sid in enumerate(group):
            everyone[sid] = None
            if k % (chunk * 8) == chunk * 8 - 1:
                yield
    rows: ShardedMap[str, SessionRow] = ShardedMap()
    opened = tagging = 0
    budget = chunk
    for sid in everyone:
        path_tokens = locked = 0
        fair = 0.0
        path = unions.get(sid, ())
        for node in path:
            n = len(node.key)
            path_tokens += n
            fair += n / beneath[node]
            if lock_ref(node) > 0:
                locked += n
        exclusive = exclusive_by_session.get(sid, 0)
        opened += sid not in closed
        tagged = len(session_leaves.get(sid, ()))
        tagging += tagged > 0
        rows[sid] = (sid, sid in closed, tagged, exclusive * bpt,
                     max(0, path_tokens - exclusive) * bpt, round(fair * bpt), locked, activity.get(sid))
        budget -= len(path) + 1
        if budget <= 0:
            yield
            budget = chunk
    by_id: ShardedMap[int, int] = ShardedMap()
    for node, count in beneath.items():  # its own map: nothing changes it between slices
        by_id[node.id] = count
        budget -= 1
        if budget <= 0:
            yield
            budget = chunk
    holding = len(unions)
    yield from released(unions, beneath, exclusive_by_session, everyone)  # not all at once at the end
    made = Attribution(key, time.monotonic(), 0.0, rows, by_id, holding, opened)
    made._sessions_holding = tagging  # counted here, not by a pass over 50k rows in one read
    return made


class AttributionCache:
    """The last attribution and its refresh (owner thread only).

    A read gets the last attribution while it is fresh (``Attribution.fresh``). When it is not, a
    new pass starts; where the last one took under ``SMALL_S`` it runs here for at most
    ``inline_s`` (a small cache is attributed in that time, exactly and at once); otherwise, or
    for what is left, it runs in slices between the owner's steps (``gpu_backend.owner.slices``) while
    the last attribution is served, and replaces it when done. So a large cache's attribution
    never holds the owner longer than one of the pass's chunks within a slice. Until the first pass ends
    there is none to serve (``get`` returns None: a read that needs one waits for it in slices,
    ``ready``). After an action (``invalidate``) the last one is served as stale, with a closed
    session's row shown closed at once, until the next pass ends. Without ``slices`` every pass
    runs to its end on the spot.
    """

    def __init__(self, max_age: float = 1.0, budget: float = ATTRIBUTION_BUDGET,
                 slices: Slices | None = None, inline_s: float = INLINE_S):
        self.max_age = max_age
        self.budget = budget
        self.slices = slices
        self.inline_s = inline_s
        self.fresh_wait_s = FRESH_WAIT_S
        self.current: Attribution | None = None
        self.stale = False
        """An action happened since ``current`` was made: it is served only until the next one."""
        self._refresh: object | None = None  # the pass in flight, if any
        self._handed: object | None = None  # the pass handed to the slices, if any
        self._pass: Generator[None, None, None] | None = None
        self.made = 0
        self.made_in_slices = 0
        self.work_s = 0.0
        """Attributions made, how many of them in slices, and the seconds they took."""

    @property
    def refreshing(self) -> bool:
        return self._refresh is not None

    def invalidate(self, closed: str | None = None) -> None:
        """After an action: the next read starts a new pass (a pass in flight began before the
        action and is dropped). ``closed``: a session just closed, shown closed, holding nothing,
        until then."""
        self._refresh = None
        self.stale = True
        current = self.current
        if closed is not None and current is not None and closed in current.sessions:
            row = current.sessions[closed]
            if not row[1]:
                current.opened -= 1
            current.sessions[closed] = (row[0], True, 0, 0, 0, 0, 0, row[7])
            if row[2] and current._sessions_holding is not None:  # it held nodes: one fewer now
                current._sessions_holding -= 1
            current._ordered.clear()
            current._filtered.clear()

    def get(self, key: Any, steps: Callable[[], Generator[None, None, Attribution]],
            holding: int | None = None) -> Attribution | None:
        """The attribution to serve now (None: the first pass has not ended yet); ``steps()``
        starts a new pass (``attribution_pass``); ``holding``: the sessions that hold KV now, if
        known cheaply (see ``Attribution.fresh``)."""
        current = self.current
        if current is not None and not self.stale and current.fresh(key, self.max_age, self.budget, holding):
            return current
        if self._refresh is None:
            self._refresh = token = object()
            sliced = self._pass = self._sliced(steps(), token)
            if self.slices is None:
                for _ in sliced:
                    pass
            else:
                # on the spot for a small cache (exact, now); a large one's pass goes to the slices
                if current is None:  # the first, of unknown cost
                    inline = min(self.inline_s, SMALL_S)
                else:
                    inline = self.inline_s if current.cost_s < SMALL_S else 0.0
                deadline = time.perf_counter() + inline
                while time.perf_counter() < deadline:
                    if next(sliced, StopIteration) is StopIteration:
                        break
                else:
                    self._handed = token
                    self.slices.add(sliced)
        return self.current

    def get_now(self, key: Any, steps: Callable[[], Generator[None, None, Attribution]],
                holding: int | None = None) -> Attribution:
        """``get``, but never None: the first pass is run to its end on the spot (for a caller
        that cannot wait between steps)."""
        current = self.get(key, steps, holding)
        if current is None and self._pass is not None:
            self._handed = None  # finished here, not in the slices
            for _ in self._pass:
                pass
            current = self.current
        if current is None:  # the pass was dropped meanwhile: one more, to its end
            self._refresh = None
            self._pass = None
            current = in_one_go(steps())
            self._done(current, current.cost_s)
        return current

    def ready(self, key: Any, steps: Callable[[], Generator[None, None, Attribution]],
              holding: int | None = None) -> Generator[None, None, Attribution]:
        """``get``, for a read run in slices: until there is an attribution to serve, it drives
        the pass itself a chunk at a time, yielding between chunks; after an action it does so for
        up to ``fresh_wait_s`` more, so that the read gets figures made since (an operator who
        closed a session reads the rest as they are now, where the cache allows)."""
        waiting_until = None
        while True:
            current = self.get(key, steps, holding)
            if current is not None and not self.stale:
                return current
            if current is not None:  # an action since: wait a while for the next pass
                now = time.monotonic()
                if waiting_until is None:
                    waiting_until = now + self.fresh_wait_s
                if now >= waiting_until or self._pass is None:
                    return current
            if self._pass is not None:
                self._handed = None  # the reader finishes it (made_in_slices counts the others)
                next(self._pass, None)
                if self.current is not None and not self.stale:
                    return self.current
            yield

    def _done(self, result: Attribution, work_s: float) -> None:
        result.cost_s = work_s
        old, self.current = self.current, result
        # 50k rows and 150k counts: freed a chunk at a time, where no read holds the old one (a read
        # that does lets it go when it ends, by its reference count)
        if old is not None and self.slices is not None and sys.getrefcount(old) <= 2:  # ``old`` only
            self.slices.add(_retired(old))
        self.stale = False
        self.made += 1
        self.work_s += work_s

    def _sliced(self, made: Generator[None, None, Attribution], token: object) -> Generator[None, None, None]:
        work = 0.0
        try:
            while self._refresh is token:  # dropped after an action otherwise
                started = time.perf_counter()
                try:
                    with gc_paused():
                        next(made)
                except StopIteration as finished:
                    self._done(finished.value, work + time.perf_counter() - started)
                    self.made_in_slices += self._handed is token
                    return
                work += time.perf_counter() - started
                yield
        finally:
            if self._refresh is token:
                self._refresh = None


def _retired(attribution: Attribution) -> Generator[None, None, None]:
    """Free a replaced attribution (that nothing else holds) a chunk at a time."""
    yield from released(*attribution._filtered.values(), *attribution._ordered.values(),
                        attribution.beneath, attribution.sessions)
