"""Memory attribution to sessions, shared by the in-process adapters (bundled and SGLang).

Computed on the cache's owner thread in one pass over the sessions' paths; kept as plain tuples
(a frozen view per session costs more to build than that session's whole attribution), turned
into ``SessionView``s only for the page asked for.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.model import SessionView
from adapters.owner_queue import gc_paused

ATTRIBUTION_BUDGET = 200  # reuse an attribution for at least 200x what it cost (<= 0.5% of the owner)

# (id, closed, tagged_nodes, exclusive_bytes, shared_bytes, fair_share_bytes, locked_tokens,
#  last activity as a monotonic time or None)
SessionRow = tuple[str, bool, int, int, int, int, int, "float | None"]
SESSION_KEYS: dict[str, Callable[[SessionRow], Any]] = {
    "exclusive_bytes": lambda r: (-r[3], r[0]),
    "shared_bytes": lambda r: (-r[4], r[0]),
    "last_activity": lambda r: (r[7] is None, -(r[7] or 0.0), r[0]),
    "id": lambda r: r[0],
}


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
    sessions: dict[str, SessionRow]
    beneath: dict[int, int]

    def fresh(self, key: Any, max_age: float, budget: float) -> bool:
        """Still good: nothing changed (same key), or younger than ``max_age`` seconds or than
        ``budget`` times what it cost, whichever is longer (a live cache moves every step)."""
        return key == self.key or time.monotonic() - self.taken_at < max(max_age, self.cost_s * budget)

    _ordered: dict[str, list[SessionRow]] = field(default_factory=dict, repr=False, compare=False)

    def page(self, order: str, offset: int, limit: int) -> list[SessionRow]:
        """Rows ``offset:offset+limit`` in ``order`` (one of SESSION_KEYS); each order is sorted
        once per attribution, so a dashboard's repeated reads of it cost a slice."""
        rows = self._ordered.get(order)
        if rows is None:
            rows = self._ordered[order] = sorted(self.sessions.values(), key=SESSION_KEYS[order])
        return rows[offset : offset + limit]

    @property
    def sessions_holding(self) -> int:
        return sum(1 for row in self.sessions.values() if row[2])


@gc_paused()  # paths, dicts and rows by the hundred thousand: a collection midway only stalls the owner
def attribute(
    root: Any,
    session_leaves: Mapping[str, Collection[Any]],
    closed: Collection[str],
    known: Iterable[str],
    activity: Mapping[str, float],
    bytes_per_token: int,
    exclusive_tokens: Callable[[Collection[Any]], Mapping[str, int]],
    key: Any = None,
    lock_ref: Callable[[Any], int] = operator.attrgetter("lock_ref"),
) -> Attribution:
    """Attribute the tree's memory to every session in ``session_leaves`` and ``known``.

    ``exclusive_tokens(on_paths)``: what each session's close would free now (the cache's own
    rule, given the nodes on the sessions' paths). Nodes need ``parent``, ``key`` and ``id``;
    ``lock_ref(node)`` reads a node's lock count; ``activity`` maps session ids to a ``time.monotonic()`` of their last activity.
    """
    started = time.perf_counter()
    bpt = bytes_per_token
    # Each session's union of root paths (a plain walk for the common single tag), then how
    # many sessions each node on those paths serves.
    unions: dict[str, list[Any]] = {}
    beneath: dict[Any, int] = {}
    for sid, leaves in session_leaves.items():
        if not leaves:
            continue
        path: list[Any] = []
        if len(leaves) == 1:
            node = next(iter(leaves))
            while node is not root:
                path.append(node)
                node = node.parent
        else:
            seen: set[Any] = set()
            for leaf in leaves:
                node = leaf
                while node is not root and node not in seen:
                    seen.add(node)
                    path.append(node)
                    node = node.parent
        unions[sid] = path
        for node in path:
            beneath[node] = beneath.get(node, 0) + 1
    exclusive_by_session = exclusive_tokens(beneath.keys())
    everyone = dict.fromkeys(known)
    everyone.update(dict.fromkeys(closed))
    everyone.update(dict.fromkeys(unions))
    rows: dict[str, SessionRow] = {}
    for sid in everyone:
        path_tokens = locked = 0
        fair = 0.0
        for node in unions.get(sid, ()):
            n = len(node.key)
            path_tokens += n
            fair += n / beneath[node]
            if lock_ref(node) > 0:
                locked += n
        exclusive = exclusive_by_session.get(sid, 0)
        rows[sid] = (sid, sid in closed, len(session_leaves.get(sid, ())), exclusive * bpt,
                     (path_tokens - exclusive) * bpt, round(fair * bpt), locked, activity.get(sid))
    by_id = {node.id: count for node, count in beneath.items()}
    return Attribution(key, time.monotonic(), time.perf_counter() - started, rows, by_id)
