"""The from-scratch attribution of a tree's memory to its sessions: what the figures kept with
the tree (``gpu_backend.ledger``) must equal at every step. The tests' oracle, and the benchmarks'
check; no read of a live cache runs it (the ledger's figures are current at every read).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixtop.gpu_backend.ledger.orders import ROW_KEYS, SessionRow
from radixtop.gpu_backend.owner.queue import gc_paused
from radixtop.gpu_backend.owner.shards import SHARD_MASK, ShardedMap
from radixtop.gpu_backend.owner.slices import released, run_to_end
from radixtop.gpu_backend.session_rules import exclusive_tokens_pass

SESSION_KEYS = ROW_KEYS
"""Each order's key of a row (``gpu_backend.ledger.orders``: the same orders as the kept ones)."""


def row_matches(row: SessionRow, needle: str) -> bool:
    """``needle`` (lower case) in the session's id, or the session's state (``open``, ``closed``)."""
    return needle in row[0].lower() or needle == ("closed" if row[1] else "open")


@dataclass
class Attribution:
    """Every session's figures and each node's count of distinct sessions beneath it."""

    key: Any
    taken_at: float
    cost_s: float
    sessions: dict[str, SessionRow] | ShardedMap[str, SessionRow]
    beneath: dict[int, int] | ShardedMap[int, int]
    holding: int = 0
    """Sessions that held KV when it was made."""
    opened: int = 0
    """Sessions open when it was made."""
    sessions_holding: int = field(default=0, compare=False)
    """Sessions that tag a node (the root's sessions beneath)."""

    def page(self, order: str, offset: int, limit: int, contains: str = "",
             reverse: bool = False) -> tuple[list[SessionRow], int]:
        """Rows ``offset:offset+limit`` in ``order`` (one of SESSION_KEYS; ``reverse``: read from
        its other end) of the sessions that match ``contains`` (''  all), and how many match."""
        needle = contains.strip().lower()
        rows = sorted((r for r in self.sessions.values() if not needle or row_matches(r, needle)),
                      key=SESSION_KEYS[order], reverse=reverse)
        return rows[offset : offset + limit], len(rows)


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
    return Attribution(key, time.monotonic(), 0.0, rows, by_id, holding, opened, tagging)
