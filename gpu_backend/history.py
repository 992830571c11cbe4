"""The cache's flight recorder (issue 29): what left the tree, when and why, kept in a bounded
rolling journal, so that a prompt's miss can be explained ("why did this prompt miss?").

Each node the tree deletes is kept here as it was (a *ghost*: its id, its parent's id, its tokens,
the sessions that held it) with the moment and the cause of its leaving, the cause being set by
whoever asked for the removal (``CacheHistory.cause``): an eviction under pressure (the pool
then: its tokens locked by running requests, its capacity), a session's close (which one), a
flush, an operator's evict (who). A node's id is the end of its path for all its life (a split
makes a new node above it, with the head of its tokens), so a ghost hangs below the id of the node
it was a child of, live or a ghost itself; ``explain`` walks a prompt down the live path and then
down the ghosts whose tokens continue it, and says which of its tokens past the cached ones were
cached before, and why they left.

What it costs the owner thread: a removal appends one small record (its tokens as the bytes of an
``array('q')``, one copy); nothing on inserts, matches or locks. Bounded by the memory it keeps
(``most_bytes``) and by age (``most_age_s``): the oldest ghosts go first.
"""

from __future__ import annotations

import itertools
import secrets
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

EVICTED, CLOSED, FLUSHED, EVICT_ACTION = "evicted", "closed", "flushed", "evict_action"
CAUSES = (EVICTED, CLOSED, FLUSHED, EVICT_ACTION)
"""Why a node left: an eviction under pressure (the pool needed room), a session's close, a flush,
an operator's evict."""

ROOT = -(1 << 62)
"""The parent id a node below the root is kept under, whatever the root's own id (a tree reset or
copied again has a root of a new id: what hung below the old one still starts every prompt)."""
MOST_BYTES = 64 << 20
"""Memory the removed nodes kept may take (their tokens, 8 bytes each, and ``GHOST_BYTES``
each), the oldest dropped first: about 150,000 nodes of 8 tokens, or 8M tokens in long nodes."""
GHOST_BYTES = 380
"""What a removed node kept costs besides its tokens' 8 bytes each (measured:
``benchmarks/bench_history.py``, 439 B a node of 8 tokens, their 64 bytes in it)."""
MOST_AGE_S = 3600.0
"""Seconds a removed node is kept at most."""
MOST_SERVED = 50_000
"""Requests of sessions kept at most (``served``: when, the session, its prompt's tokens and its
hit; 158 B each measured by ``bench_history.py``, 7.5 MiB in all), the oldest dropped first; their
age is bounded as the removed nodes' is."""


@dataclass(slots=True)
class Ghost:
    """A node as it was when it left the tree."""

    node_id: int
    parent_id: int
    tokens: bytes
    """Its key's token ids, the bytes of an ``array('q')``."""
    at: float
    """When it left (``time.time()``)."""
    cause: str
    session_id: str | None
    """The session whose close freed it (``CLOSED``)."""
    holders: tuple[str, ...]
    """The sessions that held it then."""
    pool: tuple[int, int] | None
    """For an eviction under pressure: the pool's tokens locked by running requests, and its
    capacity, then."""
    who: str

    @property
    def length(self) -> int:
        return len(self.tokens) >> 3


@dataclass(frozen=True, slots=True)
class Lost:
    """Part of a prompt past its cached tokens that was cached before: ``[start, end)``, in the
    ghost ``ghost`` (the most recent to leave, where several held it)."""

    start: int
    end: int
    ghost: Ghost


class CacheHistory:
    """The removed nodes of one tree, bounded (owner thread only, as the tree)."""

    def __init__(self, most_bytes: int = MOST_BYTES, most_age_s: float = MOST_AGE_S,
                 clock: Callable[[], float] = time.time) -> None:
        if most_bytes < 0 or most_age_s < 0:
            raise ValueError("a history's bounds are at least 0")
        self.most_bytes = most_bytes
        self.most_age_s = most_age_s
        self.clock = clock
        self._ghosts: deque[Ghost] = deque()
        self._under: dict[int, list[Ghost]] = {}
        """The ghosts by their parent's id and their first token (``_slot``: a prompt looks up only
        the ones that can continue it, however many hang below the root); a list each, most of them
        of one ghost (a deque each took 1,155 B a ghost of 8 tokens, against 439 with lists)."""
        self.tokens = 0
        self.bytes = 0
        """What the kept nodes take: their tokens' bytes and ``GHOST_BYTES`` each."""
        self.removed_count = 0
        """Nodes recorded since the start (kept or dropped since)."""
        self.served_count = 0
        """Requests told since the start (kept or dropped since)."""
        self.epoch = secrets.token_hex(6)
        """This history's name: a journal read by sequence numbers (``page``) starts again where a
        new history (a restart) has a new one."""
        self.since = clock()
        """Every removal after this moment is kept: its start, the newest removal dropped for the
        bounds, or a gap (``gap``)."""
        self._cause: tuple[str, str | None, tuple[int, int] | None, str] = (EVICTED, None, None, "")
        self._served: deque[tuple[float, str, int, int]] = deque()
        self.served_since: float | None = None
        """Every request of a session since this moment is kept (``served``); None where the owner
        does not tell its requests (radixtop's copy beside SGLang: its records have no hits)."""

    # ----- what the owner thread tells it -----

    def cause(self, kind: str, session_id: str | None = None, pool: tuple[int, int] | None = None,
              who: str = "") -> _Cause:
        """A context: every removal inside it is for ``kind`` (nested: the innermost). A plain
        object, not a generator: it is entered on every eviction and close of the owner thread."""
        if kind not in CAUSES:
            raise ValueError(f"unknown cause {kind!r}")
        return _Cause(self, (kind, session_id, pool, who))

    def removed(self, node_id: int, parent_id: int, key: Sequence[int] | bytes,
                holders: Iterable[str] | None = None) -> None:
        """Node ``node_id`` (a child of ``parent_id``, ``ROOT`` for the root, with ``key``'s tokens)
        left the tree now."""
        if isinstance(key, bytes):
            tokens = key
            if not tokens:
                return
            first = array("q", tokens[:8])[0]
        else:
            if not key:
                return
            tokens, first = array("q", key).tobytes(), key[0]
        kind, sid, pool, who = self._cause
        now = self.clock()
        ghost = Ghost(node_id, parent_id, tokens, now, kind, sid, tuple(holders) if holders else (), pool, who)
        self._ghosts.append(ghost)
        slot = _slot(parent_id, first)
        under = self._under.get(slot)
        if under is None:
            self._under[slot] = [ghost]
        else:
            under.append(ghost)
        self.tokens += len(tokens) >> 3
        self.bytes += len(tokens) + GHOST_BYTES
        self.removed_count += 1
        if self.bytes > self.most_bytes or now - self._ghosts[0].at > self.most_age_s:
            self._trim(now)

    def tells_requests(self) -> None:
        """The owner tells each request of a session (``served``) from now on."""
        if self.served_since is None:
            self.served_since = self.clock()

    def served(self, session_id: str, prompt_tokens: int, cached_tokens: int) -> None:
        """A request of ``session_id`` began now, ``cached_tokens`` of its ``prompt_tokens`` a
        hit (a session's hits over time: ``why`` for a session)."""
        now = self.clock()
        served = self._served
        served.append((now, session_id, prompt_tokens, cached_tokens))
        self.served_count += 1
        while len(served) > MOST_SERVED or now - served[0][0] > self.most_age_s:
            self.served_since = max(self.served_since or 0.0, served.popleft()[0])

    def _trim(self, now: float) -> None:
        ghosts, under = self._ghosts, self._under
        while ghosts and (self.bytes > self.most_bytes or now - ghosts[0].at > self.most_age_s):
            old = ghosts.popleft()
            self.tokens -= old.length
            self.bytes -= len(old.tokens) + GHOST_BYTES
            self.since = max(self.since, old.at)
            where = _slot(old.parent_id, array("q", old.tokens[:8])[0])
            siblings = under[where]
            if siblings[0] is old:  # (the oldest of its siblings, as a rule)
                del siblings[0]
            else:
                siblings.remove(old)
            if not siblings:
                del under[where]

    def gap(self) -> None:
        """Removals before now may be missing (the tree came again whole after a gap): the history
        is complete from now on only."""
        self.since = max(self.since, self.clock())

    # ----- reads -----

    def __len__(self) -> int:
        return len(self._ghosts)

    def ghosts(self) -> list[Ghost]:
        """Every ghost kept, oldest first."""
        return list(self._ghosts)

    def page(self, after: int, limit: int, served_after: int = 0) -> tuple[list[Ghost], int, list[Any] | None, int]:
        """The journal from a reader's place (the owner thread's part of ``radixtop record``): the
        removed nodes numbered past ``after`` (the first removal is 1), at most ``limit``, and the
        number of the first of them; the requests told past ``served_after`` (at most ``limit``; None
        where none are told) and the number of their first. A first number past ``after + 1``: those
        between were dropped (the bounds) before the reader came. Numbers are implicit: the journal
        only appends at its end and drops at its start, so the n-th kept is ``count - len + n``."""
        ghosts, first = self.ghosts_after(after, limit)
        served = self.requests_after(served_after, limit)
        return ghosts, first, None if served is None else served[0], 0 if served is None else served[1]

    def ghosts_after(self, after: int, limit: int) -> tuple[list[Ghost], int]:
        """The removals numbered past ``after``, at most ``limit``, and the first one's number."""
        return _tail(self._ghosts, self.removed_count, after, limit)

    def requests_after(self, after: int, limit: int) -> tuple[list[tuple[float, str, int, int]], int] | None:
        """The requests numbered past ``after``, at most ``limit``, and the first one's number; None
        where the owner tells none."""
        return None if self.served_since is None else _tail(self._served, self.served_count, after, limit)

    def reaches_back_to(self) -> float:
        """The moment since which every removal is kept (``time.time()``)."""
        return self.since

    def explain(self, query: Sequence[int], live: Sequence[tuple[int, int]], cached: int,
                page_size: int = 1) -> list[Lost]:
        """The parts of ``query`` past its ``cached`` tokens that were cached before, each with the
        most recent ghost to hold it, in order. ``live``: the nodes on the query's cached path
        that it matches whole, as ``(node_id, end)`` (the root's ``(id, 0)`` first)."""
        if cached >= len(query):
            return []
        q = array("q", query).tobytes()
        ends: dict[int, set[int]] = {0: {ROOT}}
        for node_id, end in live:
            ends.setdefault(end, set()).add(node_id)
        found: list[tuple[int, int, Ghost]] = []
        seen: set[int] = set()
        while ends:
            pos = min(ends)
            ids = ends.pop(pos)
            if pos >= len(query):
                continue
            rest, first = q[pos << 3:], query[pos]
            for node_id in ids:
                # newest first: an id that left several times (a block's hash names its content,
                # stored and removed again) answers with its last leaving
                for ghost in reversed(self._under.get(_slot(node_id, first), ())):
                    if ghost.node_id in seen:
                        continue
                    same = _same_prefix(ghost.tokens, rest)
                    same -= same % page_size
                    if not same:
                        continue
                    seen.add(ghost.node_id)
                    if pos + same > cached:
                        found.append((pos, pos + same, ghost))
                    if same == ghost.length:
                        ends.setdefault(pos + same, set()).add(ghost.node_id)
        return _newest_first(found, cached)


def _tail(kept: deque[Any], count: int, after: int, limit: int) -> tuple[list[Any], int]:
    """Items numbered past ``after`` of a journal whose last is numbered ``count``: at most
    ``limit``, and the first's number. Read from the nearer end (a deque's middle costs a walk)."""
    first = count - len(kept) + 1
    start = max(after + 1, first) - first  # (its index in ``kept``)
    n = min(limit, len(kept) - start)
    if n <= 0:
        return [], count + 1
    if start <= len(kept) - start:
        items = list(itertools.islice(kept, start, start + n))
    else:
        items = list(itertools.islice(reversed(kept), len(kept) - start - n, len(kept) - start))[::-1]
    return items, first + start


def caused(history: CacheHistory | None, kind: str, **detail: Any) -> Any:
    """``history.cause(kind, ...)``, or a context that does nothing where no history is kept."""
    return history.cause(kind, **detail) if history is not None else nullcontext()


def _slot(parent_id: int, first: int) -> int:
    """One int for a parent's id and a first token (a tuple key costs 56 B more a ghost); tokens
    past 32 bits share slots, which the tokens' comparison tells apart."""
    return (parent_id << 32) + (first & 0xFFFFFFFF)


class _Cause:
    __slots__ = ("history", "cause", "before")

    def __init__(self, history: CacheHistory, cause: tuple[str, str | None, tuple[int, int] | None, str]) -> None:
        self.history, self.cause = history, cause

    def __enter__(self) -> None:
        self.before = self.history._cause
        self.history._cause = self.cause

    def __exit__(self, *exc: object) -> None:
        self.history._cause = self.before


def _same_prefix(a: bytes, b: bytes) -> int:
    """How many leading tokens (8 bytes each) ``a`` and ``b`` share (slices compared in C,
    halving: no Python loop a token)."""
    n = min(len(a), len(b)) >> 3
    if a[: n << 3] == b[: n << 3]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[lo << 3 : mid << 3] == b[lo << 3 : mid << 3]:
            lo = mid
        else:
            hi = mid
    return lo


def _newest_first(found: list[tuple[int, int, Ghost]], cached: int) -> list[Lost]:
    """Each token past ``cached`` that some ghost held, with the ghost that left last, as runs in
    order (ranges, not tokens: a ghost's range less what newer ones cover)."""
    taken: list[tuple[int, int]] = []  # ranges given to a newer ghost, disjoint
    out: list[Lost] = []
    for start, end, ghost in sorted(found, key=lambda f: f[2].at, reverse=True):
        pieces = [(max(start, cached), end)]
        for a, b in taken:
            pieces = [p for lo, hi in pieces for p in ((lo, min(hi, a)), (max(lo, b), hi)) if p[0] < p[1]]
        for lo, hi in pieces:
            out.append(Lost(lo, hi, ghost))
            taken.append((lo, hi))
    out.sort(key=lambda lost: lost.start)
    merged: list[Lost] = []
    for lost in out:
        if merged and merged[-1].end == lost.start and merged[-1].ghost is lost.ghost:
            merged[-1] = Lost(merged[-1].start, lost.end, lost.ghost)
        else:
            merged.append(lost)
    return merged

