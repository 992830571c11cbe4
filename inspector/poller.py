"""The dashboard's data side: what one poll reads from a target, as one frozen Snapshot.

The screen decides what it needs (a ``PollRequest``, on the UI thread), a worker thread runs
``Poller.collect`` (every read of the target happens here or in the reads below), and the screen
applies the ``Snapshot`` it gets back on the UI thread. Nothing here touches a widget,
so it is tested without a screen. Polls never overlap (``poll_loop.py`` arms the next when one
ends); the tree's expanded state is shared with the tree operations the user asks for (applied one
at a time, in order), under ``tree_lock``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from radixtop.adapters.base import MAX_READS, CacheAdapter
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable, Unsupported, unknown_node
from radixtop.adapters.model import (
    ROOT_ID,
    Capabilities,
    Changes,
    ChildrenPage,
    Diagnosis,
    MatchView,
    NodeDetail,
    SessionDetail,
    SessionsPage,
    SessionWhyView,
    Stats,
    ThenView,
    WhyView,
)
from radixtop.inspector.tree_ops import TreeOp
from radixtop.inspector.tree_state import Row, TreeState

T = TypeVar("T")

SESSIONS_LOADED = 90
"""Sessions the table loads around its cursor at each poll, at least: three screens of a 30-row
pane (a taller one loads three of its own, ``SessionsTable.loaded_rows``). Every loaded row is
read at every poll, each a walk of its session's path on the owner thread: at 1M nodes and 50k
sessions in SGLang, 200 rows were half of each sessions read and a quarter of a poll's holds of
its scheduler."""
SESSIONS_EVERY = 0.0
"""Least seconds between reloads of the sessions table: 0, every poll (the in-process targets keep
every session's figures with the tree, so a page costs O(log n + page) and ranks live; a target
that still attributes in passes reuses its last pass between them)."""
CAPS_EVERY = 30.0
"""Seconds between two reads of the target's capabilities (they change: sessions that appear, a
token's rights, a server restarted with other settings)."""
DETAIL_TOKENS = 64
"""Token ids the detail panel shows at once (``[`` and ``]`` page through them)."""
CHAIN_MARKS = 64
"""Nodes of a session that Enter on it marks in the tree (each costs a walk up to the root)."""


@dataclass(frozen=True)
class SessionsQuery:
    """The sessions the table shows: one order of all the target's sessions (read from its other
    end where ``reverse``), those matching ``contains``, the window from ``offset``."""

    order: str = "exclusive_bytes"
    reverse: bool = False
    contains: str = ""
    offset: int = 0
    limit: int = field(default=SESSIONS_LOADED, compare=False)
    """Rows from ``offset`` (what the pane shows and a margin). Not part of what a page answers:
    a page of the same window with more or fewer rows (the pane was resized meanwhile) is the
    table's, and no reason to read again before the next poll."""

    def read(self) -> tuple[str, tuple]:
        return ("sessions", (self.order, self.offset, self.limit, self.contains, self.reverse))


@dataclass(frozen=True)
class PollRequest:
    """What the screen needs from the next poll (decided on the UI thread)."""

    live: bool = True
    """False while paused: only the header's stats are read."""
    selected_node: int | None = None
    detail_offset: int = 0
    interval: float = 1.0
    sessions: SessionsQuery = SessionsQuery()


@dataclass(frozen=True)
class TreeRows:
    """The tree's rows as flattened at one moment (``generation`` orders them)."""

    rows: tuple[Row, ...]
    order: str
    generation: int


@dataclass(frozen=True)
class Snapshot:
    """One poll's figures: each part is None when this poll did not read it."""

    stats: Stats
    taken_at: float
    """``time.monotonic()`` when the reads came back."""
    capabilities: Capabilities | None = None
    """Read again in this poll (the first, or the first after the target was lost)."""
    tree: TreeRows | None = None
    sessions: SessionsPage | None = None
    detail: NodeDetail | None = None
    sessions_error: str | None = None
    """The sessions read failed on its own (an order or filter the target refuses): the rest of
    the poll stands, the table keeps its rows, and the dashboard says why."""
    sessions_query: SessionsQuery | None = None
    """The query ``sessions`` answers (the table's may have changed since it was asked)."""


@dataclass(frozen=True)
class TreeUpdate:
    """The result of a tree operation: the rows to show, where the cursor goes, what to say."""

    tree: TreeRows
    move_to: tuple[str, int] | None = None
    note: str = ""


def _ok(result: T | AdapterError) -> T:
    """A read_many result, or its error raised."""
    if isinstance(result, AdapterError):
        raise result
    return result


class Poller:
    """Reads what the screen needs from one target; keeps what it must remember between polls
    (the tree's expanded pages, the change journal's version, when sessions were last read)."""

    def __init__(self, adapter: CacheAdapter, sessions_every: float = SESSIONS_EVERY) -> None:
        self.adapter = adapter
        self.sessions_every = sessions_every
        self.tree = TreeState(adapter.children, fetch_chain=adapter.chain, fetch_pages=lambda wanted:
                              adapter.read_many([("children", args) for args in wanted]))
        self.tree_lock = threading.Lock()
        """Held while the tree state is read or changed (a poll, or a tree operation)."""
        self.capabilities = Capabilities()
        self._caps_stale = True
        self._caps_at = float("-inf")
        self._since: int | None = None
        self._sessions_at = float("-inf")
        self._sessions_read: SessionsQuery | None = None  # the query the table's rows answer
        self._tree_moving = False  # the last poll found the tree changed: read its pages with the stats

    # ----- between polls -----

    def lost(self) -> None:
        """The target failed a poll. What comes back may be a restarted target, whose versions
        and ids start over: the next good poll reloads capabilities, the tree and the sessions."""
        self._caps_stale = True
        self._since = None
        self._sessions_at = float("-inf")

    def sessions_due(self) -> None:
        """The next poll reads the sessions (an action changed them, or the user resumed)."""
        self._sessions_at = float("-inf")

    # ----- one poll (a worker thread) -----

    def collect(self, request: PollRequest) -> Snapshot:
        """Read what ``request`` needs now; raises the target's AdapterError."""
        capabilities = None
        # first poll, the target is back (it may have restarted meanwhile), or what it can do may
        # have changed: read them again every CAPS_EVERY s too (a token's rights, vLLM's dev mode)
        if self._caps_stale or time.monotonic() - self._caps_at >= CAPS_EVERY:
            capabilities = self.capabilities = self.adapter.capabilities()
            self._caps_stale, self._caps_at = False, time.monotonic()
        # One read_many: one request, and where the adapter owns the cache's thread one hold of
        # it (each read apart waited for a step boundary, and over HTTP cost the target's
        # interpreter a request).
        caps, live, now = self.capabilities, request.live, time.monotonic()
        reads: list[tuple[str, tuple]] = [("stats", ())]
        if live and caps.tree and caps.changes and self._since is not None:
            reads.append(("changes", (self._since,)))
        want_sessions = live and caps.sessions and (
            request.sessions != self._sessions_read  # a new order, filter or window: now
            or now - self._sessions_at >= max(self.sessions_every, request.interval))
        if want_sessions:
            reads.append(request.sessions.read())
        selected = request.selected_node if live else None
        if selected is not None:
            reads.append(("node", (selected, request.detail_offset, DETAIL_TOKENS)))
        # While the tree keeps changing (a live server: every poll), its pages come in the same
        # read, so a poll is one request; they are dropped if nothing shown changed.
        pages = []
        if live and caps.tree and self._tree_moving:
            with self.tree_lock:
                pages = self.tree.wanted()
        if len(reads) + len(pages) > MAX_READS:
            pages = []
        results = self.adapter.read_many(reads + [("children", args) for args in pages])
        got = dict(zip((op for op, _ in reads), results, strict=False))
        stats = _ok(got["stats"])
        if not caps.sessions and stats.open_sessions is not None:
            self._caps_stale = True  # sessions appeared (a KV-event stream's first session_id): read again
        tree = sessions = detail = None
        if live and caps.tree:  # a target without a tree or sessions says so once, not each poll
            with self.tree_lock:
                self._tree_moving = self._tree_changed(stats.version, got.get("changes"))
                if self._tree_moving:
                    # pages read with the stats are good unless the tree state moved meanwhile
                    # (an expand or collapse in between): then it reads its own
                    if pages and pages == self.tree.wanted():
                        self.tree.refresh(prefetched=(pages, results[len(reads):]))
                    else:
                        stats = self._refresh_with_stats(stats)
                tree = self._rows()
        sessions_error = None
        if want_sessions:
            answer = got["sessions"]
            if isinstance(answer, (TargetUnreachable, TargetTimeout)) or not isinstance(answer, AdapterError):
                sessions = _ok(answer)
            else:
                sessions_error = answer.message
            self._sessions_at, self._sessions_read = now, request.sessions
        if selected is not None and not isinstance(got["node"], AdapterError):
            detail = got["node"]
        return Snapshot(stats, time.monotonic(), capabilities, tree, sessions, detail, sessions_error,
                        request.sessions if want_sessions else None)

    def _refresh_with_stats(self, stats: Stats) -> Stats:
        """Reload the tree's pages (under ``tree_lock``) with the stats in the same read, and
        return those stats: the header's figures are then of the moment of the rows beside them
        (a flush between the poll's read and its pages said "9 nodes" over the one row left).
        More pages than one read takes: read apart, and ``stats`` kept."""
        wanted = self.tree.wanted()
        if 1 + len(wanted) > MAX_READS:
            self.tree.refresh()
            return stats
        results = self.adapter.read_many([("stats", ()), *(("children", args) for args in wanted)])
        self.tree.refresh(prefetched=(wanted, results[1:]))
        return _ok(results[0])

    def _tree_changed(self, version: int, delta: Changes | AdapterError | None) -> bool:
        """Did anything the tree shows change since the last poll? (``delta``: changes(since),
        read with the stats, where the target has it; a full reload of the loaded pages otherwise)."""
        if self._since is None or delta is None:
            self._since = version
            return True
        if isinstance(delta, Unsupported):
            return True
        delta = _ok(delta)
        self._since = delta.version
        if delta.resync:
            return True
        touched = {*delta.added, *delta.changed, *delta.removed}
        shown = set(self.tree.expanded) | self.tree.chain_ids()
        for loaded in self.tree.loaded.values():
            shown.update(c.id for c in loaded.children)
        return bool(touched & shown)

    def _rows(self) -> TreeRows:
        """The tree's rows now (under ``tree_lock``)."""
        return TreeRows(tuple(self.tree.rows), self.tree.order, self.tree.generation)

    # ----- reads the user asks for (worker threads) -----

    def detail(self, node_id: int, offset: int) -> NodeDetail | None:
        """The detail panel's node, or None if it is gone."""
        try:
            return self.adapter.node(node_id, offset, DETAIL_TOKENS)
        except AdapterError:
            return None

    def tree_op(self, op: TreeOp) -> TreeUpdate:
        """Apply one tree operation (the screen runs them one at a time, in the order asked)."""
        with self.tree_lock:
            outcome = op.apply(self.tree)
            return TreeUpdate(self._rows(), outcome.move_to, outcome.note)

    def why(self, query: list[int] | str) -> WhyView:
        """Why ``query`` (token ids, or a text the target's tokenizer encodes) missed
        (``CacheAdapter.why``)."""
        return self.adapter.why(self.adapter.encode(query) if isinstance(query, str) else query)

    def why_session(self, session_id: str) -> SessionWhyView:
        """A session's story: its requests' hits, what it held that left (``CacheAdapter.why_session``)."""
        return self.adapter.why_session(session_id)

    def then(self, at: float) -> ThenView:
        """The tree at ``at``, told from the tree now (``CacheAdapter.then``)."""
        return self.adapter.then(at)

    def then_children(self, at: float, node_id: int, offset: int, limit: int, order: str = "bytes") -> ChildrenPage:
        """A page of a node's children in the tree at ``at`` (``CacheAdapter.then_children``)."""
        return self.adapter.then_children(at, node_id, offset, limit)

    def diagnose(self) -> Diagnosis:
        """The leak doctor's findings (``CacheAdapter.diagnose``)."""
        return self.adapter.diagnose()

    def _open_down_to(self, node_ids: Sequence[int]) -> TreeRows:
        """Expand every node in ``node_ids`` (ancestors of what is to be shown), then the rows."""
        with self.tree_lock:
            for node_id in node_ids:
                self.tree.expand(node_id)
            self.tree.refresh()
            return self._rows()

    def search(self, query: list[int] | str) -> tuple[MatchView, int, TreeRows]:
        """The longest cached prefix of ``query`` (token ids, or a text the target's tokenizer
        encodes), the node it ends in (opened in the tree)."""
        tokens = self.adapter.encode(query) if isinstance(query, str) else query
        match = self.adapter.match(tokens)
        target = match.partial_node_id if match.partial_node_id is not None else match.node_id
        above: list[int] = []
        if target != ROOT_ID:  # its path, read at one moment (one hold of the owner)
            view = self.adapter.paths([target])
            if view.missing:  # evicted between the match and this read
                raise unknown_node(target)
            above = [n.id for n in view.nodes if n.id not in (ROOT_ID, target)]
        return match, target, self._open_down_to(above)

    def session_chains(self, session_id: str) -> tuple[SessionDetail, frozenset[int], TreeRows]:
        """A session's tagged nodes and every node on their paths (to mark), opened in the tree:
        the paths read at one moment (one hold of the owner)."""
        detail = self.adapter.session(session_id)
        tagged = detail.node_ids[:CHAIN_MARKS]
        if not tagged:
            return detail, frozenset(), self._open_down_to([])
        nodes = self.adapter.paths(tagged).nodes
        parents = {n.parent_id for n in nodes}
        marked = frozenset(n.id for n in nodes if n.id != ROOT_ID)
        return detail, marked, self._open_down_to([n.id for n in nodes if n.id in parents and n.id != ROOT_ID])
