"""CacheAdapter: the one contract every face uses to read and act on a radix cache."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from radixtop.adapters.errors import (
    AdapterError,
    BadRequest,
    TargetTimeout,
    TargetUnreachable,
    UnknownNode,
    Unsupported,
)
from radixtop.adapters.model import (
    CHILD_ORDERS,
    EXPORT_COLUMNS,
    MAX_HISTORY_PAGE,
    MAX_PATH_NODES,
    MAX_PATHS,
    MAX_SUBTREE_ROWS,
    SESSION_ORDERS,
    UNKNOWN,
    Capabilities,
    ChainView,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    Diagnosis,
    EvictResultView,
    ExportColumns,
    FlushResultView,
    HistoryPage,
    MatchView,
    NodeDetail,
    NodeView,
    PathsView,
    SessionDetail,
    SessionsPage,
    SessionWhyView,
    Stats,
    SubtreeRow,
    SubtreeView,
    ThenView,
    WhyView,
)

MAX_PAGE = 10_000
MAX_CHAIN = 100_000
MAX_MATCH_TOKENS = 1_000_000
MAX_READS = 32
MAX_DEPTH = 64

READ_PARAMS: dict[str, tuple[str, ...]] = {
    "capabilities": (),
    "stats": (),
    "children": ("node_id", "offset", "limit", "order"),
    "chain": ("node_id", "limit"),
    "subtree": ("node_id", "depth", "limit", "order", "min_bytes"),
    "node": ("node_id", "token_offset", "token_limit"),
    "sessions": ("order", "offset", "limit", "contains", "reverse"),
    "session": ("session_id",),
    "match": ("tokens",),
    "paths": ("node_ids",),
    "changes": ("since",),
}
"""The reads ``read_many`` takes: each names a read method, and the parameters it passes to it
in order (the same names as the method's and the admin API's)."""

Read = tuple[str, tuple[Any, ...]]
"""One read for ``read_many``: a method of READ_PARAMS and its positional arguments."""


class CacheAdapter(ABC):
    """Reads and actions on one cache. Reads never change the cache; actions return what they
    actually did. Errors are the typed ones of ``adapters.errors``; nothing else escapes.

    Node ids are the cache's own stable ids (0 is the root); session ids are strings.
    """

    name: str = "cache"

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    # ----- reads -----

    @abstractmethod
    def stats(self) -> Stats: ...

    @abstractmethod
    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        """A page of ``node_id``'s children, largest subtree first (``bytes``), most recently
        used first (``recency``), or most tokens first (``tokens``); ties by id."""

    def chain(self, node_id: int, limit: int = 10_000) -> ChainView:
        """The run of single children below ``node_id`` (see ChainView), in one read where the
        target can; this default costs one ``children`` call per node."""
        check_chain_limit(limit)
        nodes = []
        page = self.children(node_id, 0, 1)
        while page.total == 1 and len(nodes) < limit:
            child = page.children[0]
            nodes.append(child)
            if child.num_children != 1:
                break
            page = self.children(child.id, 0, 1)
        truncated = len(nodes) == limit and nodes[-1].num_children == 1
        return ChainView(node_id, tuple(nodes), truncated)

    def subtree(self, node_id: int = 0, depth: int = 3, limit: int = 10, order: str = "bytes",
                min_bytes: int = 0) -> SubtreeView:
        """``node_id`` and its descendants ``depth`` levels deep, the first ``limit`` children of
        each in ``order`` whose subtree has at least ``min_bytes``: the tree as `radixtop tree`
        prints it, read at one moment. This default reads node and pages one call after another
        (right for a target whose reads are of one snapshot); an adapter that owns its cache's
        thread reads it all in one hold (``read_many``)."""
        from radixtop.gpu_backend.owner.slices import run_to_end  # the one (pure Python); not loaded by importing this

        return run_to_end(subtree_pass(lambda i: _done(self.node(i, 0, 1).node),
                                       lambda i, lim: _done(self.children(i, 0, lim, order)),
                                       node_id, depth, limit, order, min_bytes))

    @abstractmethod
    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail: ...

    def paths(self, node_ids: Sequence[int]) -> PathsView:
        """The paths from the root to ``node_ids`` (at most MAX_PATHS), read at one moment where
        the target can (see PathsView); this default reads node after node (right for a target
        whose reads are of one snapshot)."""
        from radixtop.gpu_backend.owner.slices import run_to_end  # the one (pure Python); not loaded by importing this

        def view(node_id: int | None) -> NodeView | None:
            if node_id is None:
                return None
            try:
                return self.node(node_id, 0, 1).node
            except UnknownNode:  # evicted or freed since (a child's read named it)
                return None

        asked = check_paths(node_ids)
        nodes, missing, capped = run_to_end(path_nodes(asked, view, lambda v: view(v.parent_id), lambda v: v.id,
                                                       lambda v: v.parent_id))
        return PathsView(asked, tuple(v for v, _ in nodes), tuple(missing), capped)

    @abstractmethod
    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        """A page of sessions: open ones (those holding KV, or registered) and recently closed;
        ``order`` read from its other end where ``reverse``; only those whose id contains
        ``contains`` (any case), or whose state it names, where it is not ''."""

    @abstractmethod
    def session(self, session_id: str) -> SessionDetail: ...

    @abstractmethod
    def match(self, tokens: list[int]) -> MatchView:
        """The longest cached prefix of ``tokens``, read-only."""

    def why(self, tokens: list[int]) -> WhyView:
        """Why ``tokens`` missed: the cached part now, where it leaves the cached path, and what of
        the rest was cached before, with when and why it left (the target's history of its
        tree). Unsupported where the target keeps none."""
        raise Unsupported(f"{self.name} keeps no history of its tree: it can say what is cached now "
                          "(match), not what left")

    def why_session(self, session_id: str) -> SessionWhyView:
        """A session's story in the target's history: its requests' hits over time (where the
        target tells them), and the nodes it held that left the tree, when and why. NotFound for
        a session the target does not know and the history does not name; Unsupported where the
        target keeps no history."""
        raise Unsupported(f"{self.name} keeps no history of its tree: it can say what a session holds "
                          "now (session), not what it lost")

    def history(self, after: int = 0, served_after: int = 0, limit: int = MAX_HISTORY_PAGE) -> HistoryPage:
        """The target's history as a journal, from a reader's place (``radixtop record``): the
        removals numbered past ``after``, the requests past ``served_after``, ``limit`` each at most.
        Unsupported where the target keeps none."""
        raise Unsupported(f"{self.name} keeps no history of its tree: there is no journal to read")

    def then(self, at: float | None = None) -> ThenView:
        """The tree at moment ``at`` (seconds since the epoch; None: as far back as the history
        reaches), told from the tree now: what left since and what was stored since. BadRequest
        before the history's reach (or in the future); Unsupported where the target keeps none."""
        raise Unsupported(f"{self.name} keeps no history of its tree: it can say what is cached now, not then")

    def then_children(self, at: float | None, node_id: int = 0, offset: int = 0, limit: int = 100) -> ChildrenPage:
        """A page of ``node_id``'s children in the tree at moment ``at`` (None: as far back as the
        history reaches), the largest subtree then first: those still in the tree now with their
        figures then, and those that left since (``NodeView.left_at``: when, why and whose).
        UnknownNode where the node was not in the tree then; Unsupported where the target keeps
        no history."""
        raise Unsupported(f"{self.name} keeps no history of its tree: it can say what is cached now, not then")

    def encode(self, text: str) -> list[int]:
        """``text`` as the target's tokenizer makes it token ids (what ``match`` takes: a search
        by text); Unsupported where the target has no tokenizer (it shows ids, not text). An
        empty text is no ids anywhere. This default encodes with the adapter's ``tokenizer`` (the
        one its previews decode with: the bundled, in-process SGLang and KV-event adapters')."""
        if not text:
            return []
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is None:
            raise Unsupported(f"{self.name} has no tokenizer: search by token ids")
        try:
            tokens = [int(t) for t in tokenizer.encode(text)]
        except Exception as exc:  # a tokenizer that cannot take this text: said, never a traceback
            raise BadRequest(f"the tokenizer cannot encode this text: {type(exc).__name__}") from None
        check_query(tokens)
        return tokens

    @abstractmethod
    def changes(self, since: int) -> Changes: ...

    def diagnose(self, idle_after_s: float = 600.0) -> Diagnosis:
        """The leak doctor (``adapters.doctor``): memory nobody can use now and what frees it;
        ``idle_after_s``: a session unused this long that still holds memory is a finding. A read
        (it changes nothing); an adapter that owns its cache's thread walks it there in slices."""
        raise Unsupported(f"{self.name}: this target has no leak doctor")

    def export(self) -> Iterator[dict[str, Any]]:
        """The whole tree, a header then one row per node, parents before children."""
        raise Unsupported(f"{self.name} cannot export its tree")

    def _export_rows(self) -> Iterator[dict[str, Any]]:
        """``export()``'s rows; an adapter written before 0.2 that raises NotImplementedError for
        it cannot export, as one that raises Unsupported."""
        try:
            return iter(self.export())
        except NotImplementedError:
            raise Unsupported(f"{self.name} cannot export its tree") from None

    def export_columns(self) -> ExportColumns:
        """The export as columns (see ExportColumns); adapters with a snapshot of their own
        override it."""
        from array import array

        rows = self._export_rows()
        header = next(rows)
        columns = {name: array("q") for name in EXPORT_COLUMNS}
        holders: dict[int, tuple[str, ...]] = {}
        for row in rows:
            for name in EXPORT_COLUMNS:
                value = row[name]
                columns[name].append(UNKNOWN if value is None else value)
            if row["holders"]:
                holders[row["id"]] = tuple(row["holders"])
        return ExportColumns(header["version"], header["bytes_per_token"], columns, holders)

    def export_ndjson(self, chunk_rows: int = 10_000) -> Iterator[str]:
        """``export()`` as NDJSON text: the header line first (the snapshot is taken before it is
        yielded, so a failure can still become a status code), then chunks of ``chunk_rows``
        lines. Adapters with a faster encoding override it."""
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        rows = self._export_rows()
        yield dumps(next(rows)) + "\n"
        chunk: list[str] = []
        for row in rows:
            chunk.append(dumps(row))
            if len(chunk) == chunk_rows:
                yield "\n".join(chunk) + "\n"
                chunk.clear()
        if chunk:
            yield "\n".join(chunk) + "\n"

    def read_many(self, reads: Sequence[Read]) -> list[Any]:
        """Several reads as one: for each ``(method, args)``, what ``method(*args)`` returns, or
        the typed error it raised (an ``AdapterError`` in its place: one unknown node does not
        lose the others). An error of the target itself (unreachable, timed out) raises.

        A dashboard's poll is one call: an adapter that owns its cache's thread runs them all
        in one hold of it (one wait for the end of a step, one consistent view), and over HTTP it
        is one request. Here (the default) they run one after another."""
        return [self._read_one(op, args) for op, args in check_reads(reads)]

    def _read_one(self, op: str, args: tuple[Any, ...]) -> Any:
        try:
            return getattr(self, op)(*args)
        except (TargetUnreachable, TargetTimeout):
            raise
        except AdapterError as exc:
            return exc

    # ----- actions -----

    @abstractmethod
    def plan_close(self, session_id: str) -> ClosePlanView:
        """Exactly what ``close_session`` would free now; changes nothing (allowed read-only)."""

    @abstractmethod
    def close_session(self, session_id: str) -> CloseResultView: ...

    def close_session_planned(self, session_id: str) -> tuple[ClosePlanView | None, CloseResultView]:
        """Plan and close, the plan taken as close to the close as the target allows: an adapter
        that owns its cache's thread takes both in one hold, so the result equals the plan. Here
        (the default) two calls; the plan is None where the target cannot preview a close."""
        try:
            plan = self.plan_close(session_id)
        except Unsupported:
            plan = None
        return plan, self.close_session(session_id)

    @abstractmethod
    def evict(self, num_tokens: int) -> EvictResultView: ...

    @abstractmethod
    def flush(self) -> FlushResultView: ...

    def release(self) -> None:
        """Release the connections and threads the adapter holds (a session close is
        ``close_session``)."""

    def close(self) -> None:
        """``release()``: the name before 0.2 (kept for one release)."""
        self.release()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "close" in cls.__dict__ and "release" not in cls.__dict__:  # an adapter written before 0.2
            cls.release = cls.__dict__["close"]  # type: ignore[method-assign]


def check_reads(reads: Sequence[Read]) -> list[Read]:
    """``reads`` as a list of (method, args), or BadRequest naming the first that is not one."""
    checked: list[Read] = []
    for i, read in enumerate(reads):
        try:
            op, args = read
            args = tuple(args)
        except (TypeError, ValueError):
            raise BadRequest(f"read {i}: expected (method, arguments), got {read!r:.80}") from None
        if not isinstance(op, str) or op not in READ_PARAMS:
            raise BadRequest(f"read {i}: unknown read {op!r:.40}; one of {', '.join(READ_PARAMS)}")
        if len(args) > len(READ_PARAMS[op]):
            raise BadRequest(f"read {i}: {op} takes at most {len(READ_PARAMS[op])} arguments, got {len(args)}")
        checked.append((op, args))
    if not 1 <= len(checked) <= MAX_READS:
        raise BadRequest(f"between 1 and {MAX_READS} reads at once, got {len(checked)}")
    return checked


def _done(value: Any) -> Generator[None, None, Any]:
    """A value as a pass that needs no chunk."""
    return value
    yield  # pragma: no cover (makes this a generator)


def subtree_pass(node_of: Callable[[int], Generator[None, None, NodeView]],
                  children_of: Callable[[int, int], Generator[None, None, ChildrenPage]],
                  node_id: int, depth: int, limit: int, order: str,
                  min_bytes: int) -> Generator[None, None, SubtreeView]:
    """``CacheAdapter.subtree`` as a pass over ``node_of(id)`` (a node's view) and
    ``children_of(id, limit)`` (the first page of its children in ``order``). A node that
    vanished between two chunks (a target whose pages yield to its owner) shows no children:
    the read never fails for a node the caller did not ask about."""
    if not 1 <= depth <= MAX_DEPTH:
        raise BadRequest(f"depth must be between 1 and {MAX_DEPTH}, got {depth}")
    check_page(0, limit)
    check_child_order(order)
    if min_bytes < 0:
        raise BadRequest(f"min_bytes must be >= 0, got {min_bytes}")
    top = yield from node_of(node_id)
    rows: list[SubtreeRow] = []
    capped = False

    def visit(node: NodeView, level: int) -> Generator[None, None, None]:
        nonlocal capped
        at = len(rows)
        rows.append(SubtreeRow(node, level, node.num_children))
        if level >= depth or node.num_children == 0 or capped:
            return
        try:
            page = yield from children_of(node.id, limit)
        except UnknownNode:  # freed since its parent's page was read
            rows[at] = SubtreeRow(node, level, 0)
            return
        shown = 0
        for child in page.children:
            if child.subtree_bytes < min_bytes:
                continue
            if len(rows) >= MAX_SUBTREE_ROWS:
                capped = True
                break
            shown += 1
            yield from visit(child, level + 1)
        rows[at] = SubtreeRow(node, level, page.total - shown)

    yield from visit(top, 0)
    return SubtreeView(node_id, depth, limit, order, min_bytes, tuple(rows), capped)


def check_query(tokens: Sequence[int]) -> None:
    """A prompt's tokens for a match, a why or an encode: at most ``MAX_MATCH_TOKENS``, or BadRequest."""
    if len(tokens) > MAX_MATCH_TOKENS:
        raise BadRequest(f"at most {MAX_MATCH_TOKENS} tokens, got {len(tokens)}")


def check_paths(node_ids: Sequence[int]) -> tuple[int, ...]:
    """``node_ids`` as a tuple of ints, or BadRequest."""
    if isinstance(node_ids, (str, bytes)) or not 1 <= len(node_ids) <= MAX_PATHS:
        raise BadRequest(f"paths: between 1 and {MAX_PATHS} node ids")
    if not all(type(i) is int and i >= 0 for i in node_ids):
        raise BadRequest("paths: node ids are non-negative integers")
    return tuple(node_ids)


PATH_CHUNK = 1024
"""Nodes a ``paths`` walk visits per chunk: the paths faces ask for (a search's, a session's) are
read in one, so in one hold of an owner; a longer read yields between chunks."""


def path_nodes(asked: tuple[int, ...], lookup: Callable[[int], Any], parent_of: Callable[[Any], Any],
               key: Callable[[Any], Any] = id, parent_key: Callable[[Any], Any] | None = None,
               ) -> Generator[None, None, tuple[list[tuple[Any, int]], list[int], bool]]:
    """The nodes on the paths from the root to ``asked`` (``CacheAdapter.paths``): each once as
    (node, depth), the root first and parents before children; the ids ``lookup`` does not find
    (None); whether MAX_PATH_NODES cut them (the path being walked then is left out).
    ``parent_of(root)`` is None, as is that of a node whose parent went away meanwhile (its path
    ends there); ``key(node)`` tells one node from another (live tree nodes: their identity;
    views: their id), and ``parent_key(node)``, where given, its parent's key, so that a parent
    already on a path is not fetched again. A chunk (PATH_CHUNK nodes) a yield."""
    depth_of: dict[Any, tuple[Any, int]] = {}
    missing: list[int] = []
    budget = PATH_CHUNK
    for node_id in asked:
        node = lookup(node_id)
        if node is None:
            missing.append(node_id)
            continue
        chain: list[Any] = []
        while node is not None and key(node) not in depth_of:
            chain.append(node)
            if len(depth_of) + len(chain) > MAX_PATH_NODES:
                return sorted(depth_of.values(), key=lambda pair: pair[1]), missing, True
            budget -= 1
            if budget <= 0:
                yield
                budget = PATH_CHUNK
            above = parent_key(node) if parent_key is not None else None
            node = depth_of[above][0] if above is not None and above in depth_of else parent_of(node)
        top = -1 if node is None else depth_of[key(node)][1]
        for k, up in enumerate(reversed(chain)):
            depth_of[key(up)] = (up, top + 1 + k)
    return sorted(depth_of.values(), key=lambda pair: pair[1]), missing, False


def check_page(offset: int, limit: int) -> None:
    if offset < 0:
        raise BadRequest(f"offset must be >= 0, got {offset}")
    if not 1 <= limit <= MAX_PAGE:
        raise BadRequest(f"limit must be between 1 and {MAX_PAGE}, got {limit}")


def check_chain_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_CHAIN:
        raise BadRequest(f"limit must be between 1 and {MAX_CHAIN}, got {limit}")


def check_child_order(order: str) -> None:
    if order not in CHILD_ORDERS:
        raise BadRequest(f"unknown order {order!r}; use one of {', '.join(CHILD_ORDERS)}")


def check_session_order(order: str) -> None:
    if order not in SESSION_ORDERS:
        raise BadRequest(f"unknown order {order!r}; use one of {', '.join(SESSION_ORDERS)}")


MAX_CONTAINS = 200


def check_sessions_read(order: str, offset: int, limit: int, contains: str) -> None:
    check_page(offset, limit)
    check_session_order(order)
    if not isinstance(contains, str) or len(contains) > MAX_CONTAINS:
        raise BadRequest(f"contains must be text of at most {MAX_CONTAINS} characters")


def check_tokens(num_tokens: int) -> None:
    if num_tokens < 0:
        raise BadRequest(f"tokens must be >= 0, got {num_tokens}")


def check_history_read(after: int, served_after: int, limit: int) -> None:
    if after < 0 or served_after < 0:
        raise BadRequest(f"after and served_after must be >= 0, got {after} and {served_after}")
    if not 1 <= limit <= MAX_HISTORY_PAGE:
        raise BadRequest(f"limit must be between 1 and {MAX_HISTORY_PAGE}, got {limit}")
