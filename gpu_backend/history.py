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

It also keeps every change in order (``stored``, ``split``, and each removal: 32 bytes each, in
columns), so that the tree at a past moment can be told from the tree now (``tree_then``): now,
less what was stored since, plus what left since.

Where the owner tells them (radixtop's own engine; SGLang beside its scheduler: its requests and
closes), it keeps the engine's ops too (``did``: a request's begin with its prompt and its hit, its
finish with its output, an abort, a session's close or register, an evict or flush asked): a
session's hits over time, and what a recording replays.

What it costs the owner thread: a removal appends one small record (its tokens as the bytes of an
``array('q')``, one copy); a store appends four numbers to columns; an op, a small list (a begin's
prompt and a finish's output kept as the engine's own lists, not copied); nothing on matches or
locks. Bounded by the memory it keeps (``most_bytes``, ``MOST_STORES``, ``MOST_SERVED``,
``MOST_SERVED_TOKENS``) and by age (``most_age_s``): the oldest go first.
"""

from __future__ import annotations

import bisect
import itertools
import math
import secrets
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

EVICTED, CLOSED, FLUSHED, EVICT_ACTION, UNKNOWN = "evicted", "closed", "flushed", "evict_action", "unknown"
CAUSES = (EVICTED, CLOSED, FLUSHED, EVICT_ACTION, UNKNOWN)
"""Why a node left: an eviction under pressure (the pool needed room), a session's close, a flush,
an operator's evict; or not told (a stream whose removals may be of several causes: SGLang's KV
events)."""

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
MOST_SERVED = 100_000
"""The engine's ops kept at most (``served``, ``did``: a request's begin with its session, prompt
and hit, its finish or abort; a session's close or register; an evict or flush asked), the oldest
dropped first; their age is bounded as the removed nodes' is. A request is two (its begin and its
finish): 50,000 requests."""
MOST_SERVED_TOKENS = 1 << 20
"""Token ids the ops keep at most (a begin's prompt, a finish's output: the engine's own lists,
kept, not copied: 8 bytes a token and the ids' int objects, up to 36 MiB), the oldest dropped
first: their ops stay, without them. What ``radixtop record`` writes for a replay of the server's
own traffic (``replay --format recording``); a recording reads the journal every second, far
inside this bound."""
BEGIN, FINISH, ABORT, CLOSE, REGISTER, EVICT, FLUSH = "begin", "finish", "abort", "close", "register", "evict", "flush"
OPS = (BEGIN, FINISH, ABORT, CLOSE, REGISTER, EVICT, FLUSH)
"""The engine's ops the journal keeps (``did``): radixtop's trace ops, a replay's input."""
STORE_CHUNK = 8192
"""Stores a chunk of the stores' columns holds: the oldest chunk is dropped whole (no per-store
work to bound them), and a read copies a chunk in one C-speed slice."""
MOST_STORES = 1 << 20
"""Stores kept at most (32 bytes each: 32 MiB), the oldest chunk dropped first; their age is bounded
as the removed nodes' is."""
MARK_CHUNK = 8192
"""Marks (a session's figures before they moved: ``moving``) a chunk holds."""
MOST_MARKS = 1 << 19
"""Marks kept at most (41 bytes each with the session id's reference: about 20.5 MiB, and the ids
they keep alive after their sessions closed), the oldest
chunk dropped first; their age is bounded as the removed nodes' is. A request moves one or two
sessions' figures (its own, and the one that shared its prefix): 250,000 requests or more."""


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
    namespace: Any = None
    """For a child of the root: its namespace in the tree (SGLang's ``extra_key``, with 0.5.23's
    ``cache_salt``: a LoRA's or a salt's prompts are other nodes, never shared); None: the
    default one. A prompt is explained by the removals of its own namespace only."""

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


MARK_TICKS_A_SECOND = 1000
"""A session's figures are marked once a millisecond of the history's clock at most
(``Watched._mark``), the mark stamped with the millisecond's start. So a past moment is told as of
the end of the millisecond it falls in (``moment_end``), the whole of it: the tree then, its
pages and the sessions' memory then are of that one instant."""


AHEAD_S = 1.0
"""An op told with its own moment (an engine's, read later from its frame) is told at most this far
ahead of the history's clock: one far ahead (a skewed engine, a unit slip) would stamp every change
after it there (``now``), and the age bound would drop the journal for it."""


def moment_end(at: float) -> float:
    """The end of the millisecond ``at`` falls in: the instant a moment is told as of (what came
    after it is "since"; a mark stamped with it is a session's figures until then). The faces
    have the same (``adapters.model.moment_end``: the HTTP client loads no backend)."""
    return (math.floor(at * MARK_TICKS_A_SECOND) + 1) / MARK_TICKS_A_SECOND



class _OneInstant:
    """``CacheHistory.instant``: one reused object (an op's cost is two counts, no allocation)."""

    __slots__ = ("history",)

    def __init__(self, history: CacheHistory) -> None:
        self.history = history

    def __enter__(self) -> None:
        self.history._ops += 1

    def __exit__(self, *exc: object) -> None:
        history = self.history
        history._ops -= 1
        if not history._ops:
            history._held = None

class CacheHistory:
    """The removed nodes of one tree, bounded (owner thread only, as the tree)."""

    def __init__(self, most_bytes: int = MOST_BYTES, most_age_s: float = MOST_AGE_S,
                 clock: Callable[[], float] = time.time, cause: str = EVICTED) -> None:
        """``cause``: a removal's where no other is told (the owner's own: an eviction for room; a
        stream's, ``UNKNOWN`` where it does not say)."""
        if most_bytes < 0 or most_age_s < 0:
            raise ValueError("a history's bounds are at least 0")
        self.most_bytes = most_bytes
        self.most_age_s = most_age_s
        self.clock = clock
        self._ghosts: _Kept[Ghost] = _Kept()
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
        """Ops told since the start (kept or dropped since)."""
        self.epoch = secrets.token_hex(6)
        """This history's name: a journal read by sequence numbers (``page``) starts again where a
        new history (a restart) has a new one."""
        self._latest = float("-inf")
        """The latest moment the history told (``now``)."""
        self._ops = 0
        """Ops in progress (``instant``: an op inside another counts too)."""
        self.instant = _OneInstant(self)
        """``with history.instant:`` around an op: everything it tells (the sessions' figures
        before they move, its changes, its request's begin or end) is stamped at one instant, the
        first the clock is read for it, though the clock moves on while it runs (a mark read in one
        millisecond and a change stamped in the next would tell the memory after the op beside
        the tree before it). An op inside another is of the outer one's instant."""
        self.gaps = 0
        """Gaps told (``gap``): a read in slices that sees it move was read across a hole."""
        self._held: float | None = None
        """The instant the op in progress tells everything at (its first read of the clock); None:
        between ops, or none read yet (``instant``)."""
        self.since = clock()
        """Every removal after this moment is kept: its start, the newest removal dropped for the
        bounds, or a gap (``gap``)."""
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        self._cause: tuple[str, str | None, tuple[int, int] | None, str] = (cause, None, None, "")
        self._told: _Cause | None = None
        self._stores: deque[_Stores] = deque()
        self._chunk: _Stores | None = None
        """The chunk stores go to (the first store makes one)."""
        self.stored_count = 0
        """Stores told since the start (kept or dropped since)."""
        self._stores_first = 1
        """The number of the oldest store kept."""
        self.stores_since = self.since
        """Every store after this moment is kept (``then`` reaches back no further)."""
        self._served: _Kept[list[Any]] = _Kept()
        """The ops (``did``): ``[at, session_id, prompt_tokens, cached_tokens, op, request_id, tokens,
        asked_tokens]`` each (a list: its tokens are dropped in place, ``MOST_SERVED_TOKENS``)."""
        self._tokened: deque[list[Any]] = deque()
        """The ops of ``_served`` that still have their tokens, oldest first."""
        self.served_tokens = 0
        """Token ids the ops keep."""
        self.served_since: float | None = None
        """Every op since this moment is kept (``served``, ``did``); None where the owner does not
        tell its ops (a KV-event stream: its events carry no requests)."""
        self.tokens_since: float | None = None
        """Every op since this moment has its tokens (``MOST_SERVED_TOKENS``)."""
        self.mark_chunk, self.most_marks = MARK_CHUNK, MOST_MARKS
        self._marks: deque[_Marks] = deque()
        self._marking: _Marks | None = None
        self.marked_count = 0
        """Marks told since the start (kept or dropped since)."""
        self._marks_first = 1
        self.marks_since: float | None = None
        """Every move of a session's figures since this moment is kept (``moving``): the sessions'
        memory at a past moment reaches back to it; None where the owner keeps no sessions' figures
        (a KV-event stream, a tree without sessions)."""

    # ----- what the owner thread tells it -----

    def cause(self, kind: str, session_id: str | None = None, pool: tuple[int, int] | None = None,
              who: str = "") -> _Cause:
        """A context: every removal inside it is for ``kind`` (nested: the innermost). A plain
        object, not a generator: it is entered on every eviction and close of the owner thread."""
        if kind not in CAUSES:
            raise ValueError(f"unknown cause {kind!r}")
        return _Cause(self, (kind, session_id, pool, who))

    def told(self, cause: str, who: str = "") -> None:
        """A cause told in order among the changes (a copy's records, a stream's frames): the
        removals from now on are for ``cause`` (an action asked of the owner: ``evict_action``,
        ``flushed``) until the next ``told``; ``""`` or a cause it does not know, the owner's own
        again. A gap ends it too (its closing word may be among what was lost)."""
        if self._told is not None:
            self._told.__exit__(None, None, None)
            self._told = None
        if cause in CAUSES:
            self._told = self.cause(cause, who=str(who))
            self._told.__enter__()

    @property
    def telling(self) -> bool:
        """A cause is told now (``told``)."""
        return self._told is not None

    def removed(self, node_id: int, parent_id: int, key: Sequence[int] | bytes,
                holders: Iterable[str] | None = None, namespace: Any = None) -> None:
        """Node ``node_id`` (a child of ``parent_id``, ``ROOT`` for the root, with ``key``'s tokens)
        left the tree now; ``namespace``: a root's child's, where not the default (``Ghost``)."""
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
        now = self.now()
        if parent_id != ROOT:
            namespace = None  # (below the root, a parent's id is of one namespace)
        ghost = Ghost(node_id, parent_id, tokens, now, kind, sid, tuple(holders) if holders else (), pool, who,
                      namespace)
        self._ghosts.append(ghost)
        slot = _slot(parent_id, first, namespace)
        under = self._under.get(slot)
        if under is None:
            self._under[slot] = [ghost]
        else:
            under.append(ghost)
        self.tokens += len(tokens) >> 3
        self.bytes += len(tokens) + GHOST_BYTES
        self.removed_count += 1
        self._store(node_id, parent_id, 0, now)
        if self.bytes > self.most_bytes or now - self._ghosts[0].at > self.most_age_s:
            self._trim(now)

    def stored(self, node_id: int, parent_id: int, tokens: int) -> None:
        """Node ``node_id`` (a child of ``parent_id``, ``ROOT`` for the root) was stored now with
        ``tokens`` tokens."""
        self._store(node_id, parent_id, tokens)

    def split(self, head_id: int, child_id: int, head_tokens: int) -> None:
        """Node ``child_id`` was split now: its first ``head_tokens`` tokens are node ``head_id``'s
        (new, above it). Its tokens were cached before: ``then`` counts the head as old as them."""
        self._store(head_id, child_id, -head_tokens)

    def _store(self, node_id: int, parent_id: int, tokens: int, now: float | None = None) -> None:
        if now is None:
            now = self.now()
        chunk = self._chunk
        if chunk is None or len(chunk.at) >= STORE_CHUNK:
            chunk = self._new_chunk(now)
        chunk.at.append(now)
        # (a block's hash is 64 bits unsigned: kept as its two's complement, read back by ``_id``)
        chunk.rest.extend((node_id if node_id < _SIGN else node_id - _WRAP,
                           parent_id if parent_id < _SIGN else parent_id - _WRAP, tokens))
        self.stored_count += 1

    def _new_chunk(self, now: float) -> _Stores:
        dropped, last = _drop_oldest(self._stores, STORE_CHUNK, MOST_STORES, now, self.most_age_s)
        if dropped:
            self._stores_first += dropped
            self.stores_since = max(self.stores_since, last)
        self._chunk = _Stores()
        self._stores.append(self._chunk)
        return self._chunk

    def now(self, at: float | None = None) -> float:
        """The history's clock now (or ``at``, a moment the owner read), never before the latest
        moment it told: a clock that steps back (a wall clock set back; a stream's batches from
        engines whose clocks differ) stamps what it tells meanwhile at that moment, so that each
        journal stays in order (a moment is searched for in them) and a moment is still the tree
        after every change told by then. While an op holds the clock (``hold``), its instant."""
        held = self._held
        if held is not None and (at is None or at <= held):
            return held
        t = self.clock() if at is None else at
        if t < self._latest:
            t = self._latest
        else:
            self._latest = t
        if self._ops:  # (the op's instant: its first read, or a later moment the owner told)
            self._held = t
        return t

    def _reach_now(self) -> float:
        """Now, as a journal's start (from now on it is complete): never before a moment told
        already (a clock set back), and without telling anything."""
        return max(self.clock(), self._latest)

    def tells_requests(self) -> None:
        """The owner tells its ops (``served``, ``did``) from now on."""
        if self.served_since is None:
            self.served_since = self.tokens_since = self._reach_now()

    def served(self, session_id: str | None, prompt_tokens: int, cached_tokens: int, request_id: str | None = None,
               tokens: Sequence[int] | None = None, at: float | None = None) -> None:
        """A request began now (or ``at``), ``cached_tokens`` of its ``prompt_tokens`` a hit (a
        session's hits over time: ``why`` for a session); ``tokens``, its prompt (a replay's)."""
        self.did(BEGIN, session_id, request_id, tokens, prompt_tokens, cached_tokens, at=at)

    def did(self, op: str, session_id: str | None = None, request_id: str | None = None,
            tokens: Sequence[int] | None = None, prompt_tokens: int = 0, cached_tokens: int = 0,
            asked_tokens: int = 0, at: float | None = None) -> None:
        """The engine did ``op`` now (or ``at``, where the engine said when: a frame read later):
        ``tokens`` a begin's prompt or a finish's output (kept, not copied: the engine never changes
        them after), ``asked_tokens`` an evict's."""
        now = self.now() if at is None else self.now(min(at, self.clock() + AHEAD_S))
        entry = [now, session_id, prompt_tokens, cached_tokens, op, request_id, tokens, asked_tokens]
        served = self._served
        served.append(entry)
        self.served_count += 1
        tokened = self._tokened
        if tokens is not None:
            tokened.append(entry)
            self.served_tokens += len(tokens)
            while self.served_tokens > MOST_SERVED_TOKENS:
                self._untoken(tokened.popleft())
        while len(served) > MOST_SERVED or now - served[0][0] > self.most_age_s:
            old = served.popleft()
            self.served_since = max(self.served_since or 0.0, old[0])
            if old[6] is not None:  # (the oldest with tokens, as ``_tokened`` is in order)
                self._untoken(tokened.popleft())

    def tells_figures(self, since: float | None = None) -> None:
        """The owner's ledger tells each move of a session's figures (``moving``) from now on, or
        from ``since`` (no session's figures moved between then and now: a new ledger of a tree
        kept since then)."""
        if self.marks_since is None:
            self.marks_since = self._reach_now() if since is None else since

    def moving(self, session_id: str, tags: int, exclusive: int, path: int, now: float | None = None) -> None:
        """``session_id``'s figures (its tagged nodes, exclusive and path tokens) are about to move
        now: they were these until now (a *mark*). The figures at a past moment are each session's
        first mark after it, or, without one, its figures now (``SessionLedger.journal``). ``now``:
        the history's clock read already (``now``)."""
        if now is None:
            now = self.now()
        chunk = self._marking
        if chunk is None or len(chunk.at) >= self.mark_chunk:
            chunk = self._new_marks(now)
        chunk.at.append(now)
        chunk.sids.append(session_id)
        chunk.nums.extend((tags, exclusive, path))
        self.marked_count += 1

    def _new_marks(self, now: float) -> _Marks:
        dropped, last = _drop_oldest(self._marks, self.mark_chunk, self.most_marks, now, self.most_age_s)
        if dropped:
            self._marks_first += dropped
            self.marks_since = max(self.marks_since or 0.0, last)
        self._marking = _Marks()
        self._marks.append(self._marking)
        return self._marking

    def _untoken(self, entry: list[Any]) -> None:
        self.served_tokens -= len(entry[6])
        entry[6] = None
        self.tokens_since = max(self.tokens_since or 0.0, entry[0])

    def _trim(self, now: float) -> None:
        ghosts, under = self._ghosts, self._under
        while ghosts and (self.bytes > self.most_bytes or now - ghosts[0].at > self.most_age_s):
            old = ghosts.popleft()
            self.tokens -= old.length
            self.bytes -= len(old.tokens) + GHOST_BYTES
            self.since = max(self.since, old.at)
            where = _slot(old.parent_id, array("q", old.tokens[:8])[0], old.namespace)
            siblings = under[where]
            if siblings[0] is old:  # (the oldest of its siblings, as a rule)
                del siblings[0]
            else:
                siblings.remove(old)
            if not siblings:
                del under[where]

    def gap(self) -> None:
        """Removals and stores before now may be missing (the tree came again whole after a gap):
        the history is complete from now on only."""
        self.gaps += 1
        self.since = max(self.since, self._reach_now())
        self.stores_since = max(self.stores_since, self.since)
        self.told("")

    # ----- reads -----

    def __len__(self) -> int:
        return len(self._ghosts)

    def ghosts(self) -> list[Ghost]:
        """Every ghost kept, oldest first."""
        return self._ghosts.slice(0, len(self._ghosts))

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

    def requests_after(self, after: int, limit: int) -> tuple[list[list[Any]], int] | None:
        """The ops numbered past ``after`` (``did``'s: read them, never change them; an op's tokens
        may go to None meanwhile, the bound), at most ``limit``, and the first one's number; None
        where the owner tells none."""
        return None if self.served_since is None else _tail(self._served, self.served_count, after, limit)

    def reaches_back_to(self) -> float:
        """The moment since which every removal is kept (``time.time()``)."""
        return self.since

    def then_reaches_back_to(self) -> float:
        """The moment since which every removal and every store is kept: the earliest ``then``."""
        return max(self.since, self.stores_since)

    def first_after(self, at: float) -> tuple[int, int]:
        """The numbers of the first removal and of the first store told after the moment ``at``
        (as of the end of its millisecond, ``moment_end``; one past the last where none is)."""
        end = moment_end(at)
        ghosts = self._ghosts
        lo, hi = 0, len(ghosts)
        while lo < hi:
            mid = (lo + hi) >> 1
            if ghosts[mid].at >= end:
                hi = mid
            else:
                lo = mid + 1
        removal = self.removed_count - len(ghosts) + 1 + lo
        return removal, _number_from(self._stores, self._stores_first, STORE_CHUNK, end)

    def marks_first_after(self, at: float) -> int:
        """The number of the first mark told after the moment ``at`` (as of the end of its
        millisecond; one past the last where none is)."""
        return _number_from(self._marks, self._marks_first, self.mark_chunk, moment_end(at))

    def marks_from(self, number: int, limit: int) -> tuple[tuple[array, list[str], array], int] | None:
        """The marks numbered from ``number``, at most ``limit`` and within one chunk, as copies
        (when; the session; its tagged nodes, exclusive and path tokens until then, three a mark),
        and the number past them; None where ``number`` was dropped already."""
        if number < self._marks_first:
            return None
        index, offset = divmod(number - self._marks_first, self.mark_chunk)
        if index >= len(self._marks):
            return (array("d"), [], array("q")), number
        chunk = self._marks[index]
        end = min(len(chunk.at), offset + limit)
        return (chunk.at[offset:end], chunk.sids[offset:end], chunk.nums[3 * offset:3 * end]), number + max(0, end - offset)

    def stores_from(self, number: int, limit: int) -> tuple[tuple[array, array, array, array], int] | None:
        """The changes numbered from ``number`` (the first is 1), at most ``limit`` and within one
        chunk, as copies of their columns (when; the node's id; its parent's, or for a split the
        child's; its tokens: positive for a store, negative for a split's head, 0 for a removal),
        and the number past them; None where ``number`` was dropped already."""
        if number < self._stores_first:
            return None
        index, offset = divmod(number - self._stores_first, STORE_CHUNK)
        if index >= len(self._stores):
            return (array("d"), array("q"), array("q"), array("q")), number
        chunk = self._stores[index]
        end = min(len(chunk.at), offset + limit)
        rest = chunk.rest[3 * offset:3 * end]
        return (chunk.at[offset:end], rest[0::3], rest[1::3], rest[2::3]), number + max(0, end - offset)

    def explain(self, query: Sequence[int], live: Sequence[tuple[int, int]], cached: int,
                page_size: int = 1, namespace: Any = None) -> list[Lost]:
        """The parts of ``query`` past its ``cached`` tokens that were cached before, each with the
        most recent ghost to hold it, in order. ``live``: the nodes on the query's cached path
        that it matches whole, as ``(node_id, end)`` (the root's ``(id, 0)`` first);
        ``namespace``: the query's (``Ghost.namespace``; None: the default)."""
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
                for ghost in reversed(self._under.get(_slot(node_id, first, namespace if node_id == ROOT else None),
                                                      ())):
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


_SIGN, _WRAP = 1 << 63, 1 << 64


def _id(kept: int) -> int:
    """An id as the changes' columns keep it, as it was told (``ROOT`` is the one negative id)."""
    return kept + _WRAP if kept < 0 and kept != ROOT else kept


class _Stores:
    """A chunk of the changes: when (``at``), then three numbers a change in ``rest``: the node's
    id, its parent's id (a split's: the child it was split from), its tokens (a split's head:
    negative; a removal: 0)."""

    __slots__ = ("at", "rest")

    def __init__(self) -> None:
        self.at, self.rest = array("d"), array("q")


def _drop_oldest(chunks: deque[Any], size: int, most: int, now: float, most_age_s: float) -> tuple[int, float]:
    """Whole chunks of a journal in columns (``_Stores``, ``_Marks``: ``size`` items each, the
    last one filling), the oldest first, until one more fits in ``most`` items and the oldest is
    younger than ``most_age_s`` (checked when a chunk fills: an item may wait for its chunk's
    turn): how many items went, and the last one's moment."""
    dropped, last = 0, 0.0
    while chunks and ((len(chunks) + 1) * size > most or now - chunks[0].at[-1] > most_age_s):
        old = chunks.popleft()
        dropped += len(old.at)
        last = old.at[-1]
    return dropped, last


def _number_from(chunks: deque[Any], first: int, size: int, at: float) -> int:
    """The number of the first item told at ``at`` or after in a journal in columns whose oldest
    kept is numbered ``first`` (one past the last where none is)."""
    index = len(chunks)
    while index > 0 and chunks[index - 1].at[0] >= at:
        index -= 1
    if index == 0:
        return first
    return first + (index - 1) * size + bisect.bisect_left(chunks[index - 1].at, at)


class _Marks:
    """A chunk of the marks: when (``at``), whose (``sids``), and three numbers a mark in ``nums``:
    the session's tagged nodes, exclusive tokens and path tokens until then."""

    __slots__ = ("at", "sids", "nums")

    def __init__(self) -> None:
        self.at, self.sids, self.nums = array("d"), [], array("q")


def _tail(kept: _Kept[Any], count: int, after: int, limit: int) -> tuple[list[Any], int]:
    """Items numbered past ``after`` of a journal whose last is numbered ``count``: at most
    ``limit``, and the first's number."""
    first = count - len(kept) + 1
    start = max(after + 1, first) - first  # (its index in ``kept``)
    n = min(limit, len(kept) - start)
    if n <= 0:
        return [], count + 1
    return kept.slice(start, start + n), first + start


_T = TypeVar("_T")


class _Kept(Generic[_T]):
    """A journal's items, oldest first: appended at its end, dropped at its start, read anywhere at
    the cost of what is read (a list and the index of its oldest kept). A deque's middle costs a
    walk to it: a read of the removals since a moment half-way back walked 75,000 of them for
    each 2,000 it copied (0.27 ms, against 0.004 ms for a slice of a list)."""

    __slots__ = ("_items", "_head")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._head = 0
        """The index of the oldest kept in ``_items`` (those before it are dropped: None)."""

    def append(self, item: _T) -> None:
        self._items.append(item)

    def popleft(self) -> _T:
        items, head = self._items, self._head
        if head >= len(items):
            raise IndexError("pop from an empty journal")
        item = items[head]
        items[head] = None
        head += 1
        if head >= KEPT_COMPACT and 2 * head >= len(items):  # (half of it dropped: let it go, once)
            del items[:head]
            head = 0
        self._head = head
        return item

    def __len__(self) -> int:
        return len(self._items) - self._head

    def __bool__(self) -> bool:
        return len(self._items) > self._head

    def __getitem__(self, index: int) -> _T:
        n = len(self._items) - self._head
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("journal index out of range")
        return self._items[self._head + index]

    def __iter__(self) -> Iterator[_T]:
        return itertools.islice(self._items, self._head, None)

    def slice(self, start: int, end: int) -> list[_T]:
        """The items from index ``start`` to ``end`` (oldest kept: 0), as a list."""
        return self._items[self._head + start:self._head + end]


KEPT_COMPACT = 4096
"""Dropped items a journal keeps room for before it moves the rest down (once half of it is
dropped: a move of pointers, amortized over the drops)."""


def caused(history: CacheHistory | None, kind: str, **detail: Any) -> Any:
    """``history.cause(kind, ...)``, or a context that does nothing where no history is kept."""
    return history.cause(kind, **detail) if history is not None else nullcontext()


def _slot(parent_id: int, first: int, namespace: Any = None) -> Any:
    """One int for a parent's id and a first token (a tuple key costs 56 B more a ghost); tokens
    past 32 bits share slots, which the tokens' comparison tells apart. A root's child in another
    namespace than the default: a tuple with it (those few pay the 56 B)."""
    slot = (parent_id << 32) + (first & 0xFFFFFFFF)
    return slot if namespace is None else (namespace, slot)


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



@dataclass(slots=True)
class Then:
    """The tree at a past moment, told from the tree now (``tree_then``)."""

    left: list[Ghost]
    """The nodes that were in the tree then and left since (each once: its leaving after then)."""
    new: dict[int, tuple[int, int, float]]
    """The nodes in the tree now that were not then (or, a block stored again, whose life now
    began since): id -> (its parent's id, its tokens, when it was stored)."""

    @property
    def left_tokens(self) -> int:
        return sum(g.length for g in self.left)

    @property
    def new_tokens(self) -> int:
        return sum(tokens for _, tokens, _ in self.new.values())


def tree_then(changes: Iterable[tuple[array, array, array, array]], ghosts: Iterable[Ghost]) -> Then:
    """What differs between the tree at a moment and the tree now, from every change since that
    moment, in order (``stores_from``'s columns), and every removal's ghost since, in order.

    A node was in the tree then when its first change since is a removal, or a split that made it
    the head of a node that was (its tokens were cached then, as the node it was split from). It
    is new when its first change since is a store, or a split of a node stored since. Off the
    owner thread: a pass over the changes since that moment, not over the tree."""
    fold = ThenFold()
    fold.feed(changes, ghosts)
    return fold.result()


class ThenFold:
    """``tree_then``'s pass, fed as the changes come: the tree at a moment kept while it is browsed
    (``adapters.owned.then_tree``), each read feeding only the changes since the last. Each feed
    ends where both journals ended at once (the removals among the changes are the ghosts fed)."""

    def __init__(self) -> None:
        self.first: dict[int, bool] = {}  # id -> its first change since was a store (not there then)
        self.born_since: dict[int, bool] = {}  # id -> its life now began since (a block's hash: a life again)
        self.alive: dict[int, bool] = {}
        self.parent: dict[int, int] = {}
        self.length: dict[int, int] = {}
        self.stored_at: dict[int, float] = {}
        self.heads_then: set[int] = set()  # split since from a node that was there then, not left yet
        self.removals = 0
        self.left: dict[int, Ghost] = {}
        """The nodes there then that left since, by id (each its first leaving since), in order."""
        self.splits: list[tuple[int, int]] = []
        """Each split fed, (its head, the node split), for a reader to take (``take_splits``)."""

    def feed(self, changes: Iterable[tuple[array, array, array, array]], ghosts: Iterable[Ghost]) -> None:
        first, born_since, alive, parent = self.first, self.born_since, self.alive, self.parent
        length, stored_at, heads_then = self.length, self.stored_at, self.heads_then
        fed = list(ghosts)  # (the removals among these changes, in order)
        removal = base = self.removals
        for at, ids, other, tokens in changes:
            for t, kept_id, kept_up, n in zip(at, ids, other, tokens, strict=True):
                node_id, up = _id(kept_id), _id(kept_up)
                if n > 0:
                    first.setdefault(node_id, True)
                    born_since[node_id] = True
                    alive[node_id], parent[node_id], length[node_id], stored_at[node_id] = True, up, n, t
                elif n < 0:
                    new = up in first and up not in heads_then  # (split from a node stored since)
                    first.setdefault(node_id, new)
                    born_since[node_id] = new
                    if not new:
                        heads_then.add(node_id)
                    alive[node_id], length[node_id], stored_at[node_id] = True, -n, t
                    parent[node_id] = parent.get(up, 0)
                    parent[up] = node_id
                    if up in length:
                        length[up] += n
                    self.splits.append((node_id, up))
                else:
                    if node_id not in first or node_id in heads_then:
                        first.setdefault(node_id, False)
                        heads_then.discard(node_id)
                        self.left.setdefault(node_id, fed[removal - base])
                    alive[node_id] = False
                    removal += 1
        self.removals = removal

    def take_splits(self) -> list[tuple[int, int]]:
        """The splits fed since the last take, in order: (the head, the node split)."""
        splits, self.splits = self.splits, []
        return splits

    def is_new(self, node_id: int) -> bool:
        """In the tree now and not then (its life now began since)."""
        return self.born_since.get(node_id, False) and self.alive[node_id]

    def result(self) -> Then:
        left = list(self.left.values())
        parent, length, stored_at, alive = self.parent, self.length, self.stored_at, self.alive
        new = {i: (parent[i], length[i], stored_at[i]) for i, born in self.born_since.items() if born and alive[i]}
        return Then(left, new)
