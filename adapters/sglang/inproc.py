"""The in-process SGLang adapter: the whole contract over a live SGLang tree cache object.

It reads SGLang's own fields (never ``match_prefix``, which splits nodes and refreshes access
times), computes bytes from the server's real KV pool, and closes sessions the way SGLang does
(``release_radix_session``, or the scheduler's own ``close_session`` when given). Every read and
action runs on the cache's owner thread through ``run`` (an ``OwnerQueue.call``, run between
batches by the plugin's hook); without ``run`` the caller must be the owner thread.

SGLang keeps no subtree sizes and no node registry (0.5.16 ``RadixCache``): a ``TreeIndex``
(``index.py``) keeps both exact from SGLang's own mutation calls, so no read walks the tree on the
scheduler thread. Construct the adapter on the scheduler thread, or before it runs (the plugin
does it in its hook after ``Scheduler.__init__``): it wraps a few of the cache's methods on the
instance. There is no change journal: ``changes`` is unsupported and the dashboard reloads what
it shows.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from radixtop.adapters.base import (
    CacheAdapter,
    check_chain_limit,
    check_child_order,
    check_history_read,
    check_page,
    check_paths,
    check_query,
    check_sessions_read,
    check_tokens,
    path_nodes,
)
from radixtop.adapters.doctor import IDLE_AFTER_S, check_idle_after, diagnose_pass
from radixtop.adapters.errors import (
    AdapterError,
    UnknownNode,
    Unsupported,
    unknown_node,
    unknown_session,
)
from radixtop.adapters.model import (
    FIRST_TOKENS,
    MAX_HISTORY_PAGE,
    ROOT_ID,
    Bucket,
    Capabilities,
    ChainView,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    Diagnosis,
    EvictResultView,
    FlushResultView,
    Geometry,
    HistoryPage,
    KeptNodeView,
    MatchView,
    NodeDetail,
    NodeView,
    PathsView,
    SessionDetail,
    SessionsPage,
    SessionWhyView,
    Stats,
    ThenView,
    WhyView,
)
from radixtop.adapters.owned.common import SORT_CHUNK, owner_call, refuse_if_read_only, smallest_in_steps
from radixtop.adapters.owned.reads import OffOwner, OwnerReads, finished
from radixtop.adapters.owned.sessions import session_row, sessions_page_pass
from radixtop.adapters.owned.then_tree import More, Start, then_children_of, then_more
from radixtop.adapters.owned.why import (
    answer_session,
    history_page,
    journal_read,
    live_path,
    session_story,
    then_pass,
    then_view,
    why_view,
)
from radixtop.adapters.sglang.counters import kv_geometry, observe
from radixtop.adapters.sglang.index import TreeIndex, install
from radixtop.adapters.sglang.roster import OpenSessions
from radixtop.adapters.sglang.trees import SGLangTree, tree_for
from radixtop.adapters.text import TEXT_TOKENS, decode_preview
from radixtop.gpu_backend.ledger import SessionOrders
from radixtop.gpu_backend.owner.queue import OwnerQueue, gc_paused
from radixtop.gpu_backend.owner.slices import run_to_end
from radixtop.gpu_backend.session_rules import plan_release

T = TypeVar("T")
NOT_FOLLOWED = ("no sessions: radixtop cannot follow this SGLang version's tree as it changes (its "
                "hooks did not install), and without them it has no session figures to show")
SIZES_BUDGET = 50
"""Reuse a walk of a tree the index cannot follow for at least 50x what it cost (<= 2% of the scheduler)."""


@dataclass
class _Walk:
    """One walk of a tree the index cannot follow: a snapshot of its nodes and sizes."""

    taken_at: float
    cost_s: float
    index: TreeIndex

    def fresh(self, max_age: float) -> bool:
        return time.monotonic() - self.taken_at < max(max_age, self.cost_s * SIZES_BUDGET)


class SGLangInProcessAdapter(OwnerReads, CacheAdapter):
    """The contract over one SGLang tree cache, in SGLang's scheduler process (see
    ``adapters.sglang.trees`` for which caches)."""

    def __init__(
        self,
        tree_cache: Any,
        run: OwnerQueue | Callable[[Callable[[], Any], float], Any] | None = None,
        *,
        name: str = "sglang",
        model: str = "",
        read_only: bool = False,
        timeout: float = 10.0,
        tokenizer: Any = None,
        open_sessions: Callable[[], Iterable[str]] | None = None,
        session_controller: Any = None,
        closer: Callable[[str], None] | None = None,
        buckets: Callable[[], tuple[Bucket, ...] | None] | None = None,
        running_requests: Callable[[], Iterable[Any] | None] | None = None,
        waiting_requests: Callable[[], Sequence[Any] | None] | None = None,
        sizes_max_age: float = 2.0,
        close: Callable[[str], None] | None = None,
        geometry: Geometry | None = None,
    ):
        """``run``: the scheduler's ``OwnerQueue`` (or its ``call``): with the queue, long reads run
        a slice at a time between the scheduler's steps, never holding it longer than a slice;
        without one they run to their end on the spot. ``closer``:
        closes a session the way the server does (the scheduler's own ``close_session``); SGLang's
        ``release_radix_session`` where not given. ``close``: its name before 0.2 (kept for one
        release). ``session_controller``: the scheduler's ``SessionController``, whose open
        sessions are followed as they open and close (``roster``); ``open_sessions``: a function
        returning open ids, for a caller without one (diffed whenever their count changes).
        ``geometry``: the KV pool's, where the cache has no pool to read it from (a mirror)."""
        self.tree: SGLangTree = tree_for(tree_cache)
        self.cache = tree_cache
        self.allocator = tree_cache.token_to_kv_pool_allocator
        kv_pool = self.allocator.get_kvcache() if hasattr(self.allocator, "get_kvcache") else None
        self.geometry = geometry or kv_geometry(kv_pool, self.tree.page_size, model)
        self.bpt = self.geometry.bytes_per_token
        self._owner = run if isinstance(run, OwnerQueue) else None
        if self._owner is not None:
            run = self._owner.call
        self._run = run
        self.name = name
        self.read_only = read_only
        self.timeout = timeout
        self.tokenizer = tokenizer
        self._close = closer or close or self.tree.release_session
        self._buckets = buckets
        """SGLang's leak-check buckets per component (``adapters.sglang.buckets``), read on the
        scheduler thread with the other totals; the plugin gives them (they need the scheduler)."""
        self.running_requests = running_requests
        self.waiting_requests = waiting_requests
        """What holds locks on the tree now, each with its ``last_node``, and the waiting queue
        (``adapters.sglang.doctor``; the plugin reads them from the scheduler): the leak doctor's."""
        self.sizes_max_age = sizes_max_age
        self._index = install(tree_cache) if self.tree.has_nodes else None
        self._walk: _Walk | None = None  # only for a tree the index cannot follow
        self._roster: OpenSessions | None = None
        self._orders: SessionOrders | None = None
        """The sessions and their figures kept with the tree (the index's ledger), where SGLang's
        tree has sessions and the index follows it (None: sessions are unavailable)."""
        ledger = self._index.ledger if self._index is not None else None
        if ledger is not None:
            tree = self.tree
            roster = self._roster = OpenSessions(tree, ledger, session_controller, open_sessions)
            self._orders = SessionOrders(
                ledger, self.bpt, known=roster.known, is_closed=lambda sid: sid in tree.closed(),
                seen_at=ledger.seen.get, leaves_of=lambda sid: tree.session_leaves().get(sid, ()),
                everyone=lambda: itertools.chain(roster.ids(), tree.closed(), ledger.tags))
        self._init_owner_reads()
        self.version = 0
        # Counters, updated on the scheduler thread by SGLang's own calls (see ``observe``).
        self.closes = 0
        self.freed_by_close_tokens = 0
        self.evicted_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        observe(tree_cache, self)

    # ----- plumbing -----

    def _call(self, fn: Callable[[], T], urgent: bool = False) -> T:
        """``fn()`` on the scheduler thread; ``urgent`` (actions, stats) ahead of queued reads."""
        def run() -> T:
            if self._run is None or self._in_pass() is not None:  # inline in read_many's pass
                return fn()
            if self._owner is not None:  # ``_run`` is its ``call``
                return self._run(fn, self.timeout, urgent)
            return self._run(fn, self.timeout)

        return self._mapped(run)

    def call(self, fn: Callable[[], T], urgent: bool = False) -> T:
        """``fn()`` on the scheduler thread, between its batches (for a reader beside this one)."""
        return self._call(fn, urgent)

    def _call_pass(self, make: Callable[[], Generator[None, None, T]]) -> T:
        """A read that may need more than a slice of the scheduler (sorting a node of 100k
        children, a first attribution): a pass run a slice at a time between its steps, where
        the adapter has the scheduler's queue; to its end on the spot otherwise."""
        def run() -> T:
            if self._owner is not None and self._in_pass() is None:
                return self._owner.call_pass(make, self.timeout)
            return self._call(lambda: run_to_end(make()))  # inline, or one call of a plain ``run``

        return finished(self._mapped(run))

    def _read_failed(self, exc: Exception) -> AdapterError | None:
        if isinstance(exc, (LookupError, AttributeError, TypeError, ValueError, RuntimeError)):
            return AdapterError(f"reading SGLang's {self.tree.kind} failed: {type(exc).__name__}: {exc}")
        return None

    def _mapped(self, run: Callable[[], T]) -> T:
        try:
            return owner_call(run, self.name)
        except AdapterError:
            raise
        except (LookupError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
            raise AdapterError(f"reading SGLang's {self.tree.kind} failed: {type(exc).__name__}: {exc}") from exc

    def _need_tree(self) -> None:
        if not self.tree.has_nodes:
            raise Unsupported(self.tree.reason)

    def _need_sessions(self) -> None:
        if self.tree.policy is None:
            raise Unsupported(f"{self.tree.kind}: {self.tree.sessions_reason}")
        if self._orders is None:
            raise Unsupported(f"{self.tree.kind}: {NOT_FOLLOWED}")

    def _changed(self) -> None:
        """After an action: a walk of a tree the index cannot follow is made again."""
        self._walk = None
        self.version += 1

    def capabilities(self) -> Capabilities:
        reasons = [self.tree.reason] if self.tree.reason else []
        if self.tree.policy is None:
            reasons.append(self.tree.sessions_reason)
        elif self._orders is None:
            reasons.append(NOT_FOLLOWED)
        if self.tree.policy == "deref":
            reasons.append("close only drops the session's references (UnifiedRadixCache): eviction frees "
                           "the memory later, so a close frees 0 tokens now")
        if self.tree.has_nodes and not self.tree.clock_is_time:
            reasons.append(f"{self.tree.kind} stamps accesses with a counter, not a clock: ages read 0 "
                           "(recency order is still exact)")
        reasons.append("SGLang keeps no change journal: views reload what they show")
        if self.read_only:
            reasons.insert(0, "read-only: actions are refused")
        sessions = self.tree.policy is not None and self._orders is not None
        return Capabilities(tree=self.tree.has_nodes, sessions=sessions, close=sessions, evict=True,
                            flush=True, changes=False, read_only=self.read_only, reason="; ".join(reasons))

    # ----- the tree -----

    def _id(self, node: Any) -> int:
        return ROOT_ID if node is self.tree.root else node.id

    def _sizes(self) -> TreeIndex:
        """Nodes by id and subtree tokens: the index SGLang's own mutations keep exact (no walk);
        for a tree it cannot follow, a walk, reused for ``sizes_max_age`` or 50x what it cost."""
        if self._index is not None:
            return self._index
        cached = self._walk
        if cached is not None and cached.fresh(self.sizes_max_age):
            return cached.index
        started = time.perf_counter()
        with gc_paused():  # a million small dict entries
            index = TreeIndex(lambda: self.tree.root)
        self._walk = _Walk(time.monotonic(), time.perf_counter() - started, index)
        return index

    def _attached(self, node: Any) -> bool:
        """Still in the tree (an evicted node keeps its parent pointer, not its place)."""
        root, page = self.tree.root, self.tree.page_size
        while node is not root:
            parent = node.parent
            if parent is None or parent.children.get(node.key.child_key(page)) is not node:
                return False
            node = parent
        return True

    def _lookup(self, node_id: int) -> Any:
        if node_id == ROOT_ID:
            return self.tree.root
        node = self.tree.node_by_id(node_id) if self.tree.has_registry else None
        if node is None:
            node = self._sizes().get(node_id)
            if node is None and self._walk is not None and self._walk.taken_at < time.monotonic():
                self._walk = None  # a walk's snapshot: the node may be newer than it
                node = self._sizes().get(node_id)
        if node is None or not self._attached(node):
            raise unknown_node(node_id)
        return node

    def _depth(self, node: Any) -> int:
        depth, root = 0, self.tree.root
        while node is not root:
            depth += 1
            node = node.parent
        return depth

    def _row(self, node: Any, depth: int, now: float, sizes: TreeIndex) -> tuple:
        """What a node's view needs of the tree, as plain values (on the scheduler thread:
        about a fifth of the view's cost; ``_view_of`` does the rest anywhere)."""
        tree = self.tree
        held = tree.holders(node)  # SGLang's live set: copied here, read on another thread
        holders = tuple(held) if held else ()
        if node is tree.root:
            return (ROOT_ID, None, depth, 0, (), 0, int(getattr(node, "hit_count", 0) or 0), 0.0, 0.0,
                    sizes.tokens_below(node), len(node.children), holders, ())
        tokens = len(node.key)
        # bounded by len(key): a key may carry a limit or a bigram's extra boundary token
        first = tuple(node.key.token_ids[: min(FIRST_TOKENS, tokens)]) if tokens else ()
        if tree.clock_is_time:
            access = max(0.0, now - node.last_access_time)
            created = max(0.0, now - getattr(node, "creation_time", node.last_access_time))
        else:
            access = created = 0.0
        return (node.id, self._id(node.parent), depth, tokens, first, tree.lock_ref(node),
                int(getattr(node, "hit_count", 0) or 0), access, created, sizes.tokens_below(node),
                len(node.children), holders, tree.tiers(node))

    def _view_of(self, row: tuple) -> NodeView:
        """The NodeView of a ``_row`` (no tree needed: on the reader's thread)."""
        node_id, parent_id, depth, tokens, first, lock_ref, hits, access, created, sub, kids, holders, tiers = row
        bpt = self.bpt
        return NodeView(
            id=node_id, parent_id=parent_id, depth=depth, tokens=tokens, first_tokens=first,
            text=decode_preview(self.tokenizer, first), lock_ref=lock_ref, hit_count=hits,
            access_age_s=access, created_age_s=created, bytes=tokens * bpt, subtree_tokens=sub,
            subtree_bytes=sub * bpt, num_children=kids, holders=tuple(sorted(holders or ())), tiers=tiers,
        )

    def _page(self, node_id: int, offset: int, limit: int, total: int, order: str,
              rows: list[tuple]) -> OffOwner:
        """A children page from its rows, built on the reader's thread."""
        return OffOwner(lambda: ChildrenPage(node_id, offset, limit, total, order, tuple(map(self._view_of, rows))))

    def _child_key(self, order: str, sizes: TreeIndex) -> Callable[[Any], Any]:
        if order == "bytes":
            if sizes is self._index:  # every node is in it: one dict read per child
                subtree = sizes.subtree
                return lambda n: (-subtree[n.id], n.id)
            return lambda n: (-sizes.tokens_below(n), n.id)
        if order == "recency":
            return lambda n: (-n.last_access_time, n.id)
        return lambda n: (-len(n.key), n.id)

    # ----- reads -----

    def stats(self) -> Stats:
        def read() -> Stats:
            return self._with_counts(totals(self))

        return self._call(read, urgent=True)  # cheap, and what health checks read

    def _with_counts(self, stats: Stats) -> Stats:
        """``stats`` with the tree's nodes and the open and closed sessions counted (owner thread)."""
        tree = self.tree
        nodes = tree.node_count() if tree.has_nodes else None  # the Rust core cannot tell
        if nodes is None and tree.has_nodes:
            nodes = self._sizes().count
        opened = closed_count = None  # a tree without sessions: unknown, not 0
        if tree.policy is not None and self._orders is not None:
            closed_count = len(tree.closed())
            self._known_now()
            opened = self._orders.open_count()  # kept as sessions move: no pass over them
        return dataclasses.replace(stats, node_count=nodes, open_sessions=opened, closed_sessions=closed_count)

    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        check_page(offset, limit)
        check_child_order(order)
        return self._call_pass(lambda: self._children_pass(node_id, offset, limit, order))

    def _children_pass(self, node_id: int, offset: int = 0, limit: int = 100,
                        order: str = "bytes") -> Generator[None, None, OffOwner]:
        check_page(offset, limit)
        check_child_order(order)
        self._need_tree()
        node = self._lookup(node_id)
        sizes = self._sizes()
        if order == "bytes" and sizes is self._index and offset + limit <= SORT_CHUNK:
            # near the top, kept ranked between reads: O(page + changes)
            total = len(node.children)
            first = (yield from sizes.top_children(node, offset + limit))[offset:]
            node = self._lookup(node_id)  # still there after the slices?
            depth, now = self._depth(node) + 1, time.monotonic()
            return self._page(node_id, offset, limit, total, order, [self._row(k, depth, now, sizes) for k in first])
        kids = list(node.children.values())
        key = self._child_key(order, sizes)
        if len(kids) <= SORT_CHUNK:
            first = sorted(kids, key=key)[offset : offset + limit]
        else:  # a wide node (a few-shot prompt with 100k continuations): ranked in bounded steps
            first = (yield from smallest_in_steps(kids, offset + limit, key))[offset:]
            node = self._lookup(node_id)  # still there after the slices?
        depth = self._depth(node) + 1
        now = time.monotonic()
        return self._page(node_id, offset, limit, len(kids), order, [self._row(k, depth, now, sizes) for k in first])

    def chain(self, node_id: int, limit: int = 10_000) -> ChainView:
        check_chain_limit(limit)
        self._need_tree()

        def read() -> OffOwner:
            node = self._lookup(node_id)
            walk = self._sizes()
            depth, now, rows = self._depth(node), time.monotonic(), []
            while len(node.children) == 1 and len(rows) < limit:
                node = next(iter(node.children.values()))
                depth += 1
                rows.append(self._row(node, depth, now, walk))
            more = len(node.children) == 1
            return OffOwner(lambda: ChainView(node_id, tuple(map(self._view_of, rows)), more))

        return finished(self._call(read))

    def _paths_pass(self, node_ids: tuple[int, ...]) -> Generator[None, None, OffOwner]:
        asked = check_paths(node_ids)
        self._need_tree()
        root = self.tree.root

        def lookup(node_id: int) -> Any:
            try:
                return self._lookup(node_id)
            except UnknownNode:
                return None

        nodes, missing, capped = yield from path_nodes(asked, lookup, lambda n: None if n is root else n.parent)
        sizes, now, rows = self._sizes(), time.monotonic(), []
        for start in range(0, len(nodes), SORT_CHUNK):  # the views themselves are built off the owner
            if start:
                yield
            rows.extend(self._row(node, depth, now, sizes) for node, depth in nodes[start : start + SORT_CHUNK])
        return OffOwner(lambda: PathsView(asked, tuple(map(self._view_of, rows)), tuple(missing), capped))

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail:
        check_page(token_offset, token_limit)
        return self._call_pass(lambda: self._node_pass(node_id, token_offset, token_limit))

    def _node_pass(self, node_id: int, token_offset: int = 0,
                    token_limit: int = 256) -> Generator[None, None, OffOwner]:
        check_page(token_offset, token_limit)
        self._need_tree()
        yield from ()  # one hold
        node = self._lookup(node_id)
        sizes = self._sizes()
        path_tokens, up, root = 0, node, self.tree.root
        while up is not root:
            path_tokens += len(up.key)
            up = up.parent
        # sessions beneath: kept with the tree; unknown where sessions are
        beneath = self._orders.ledger.beneath(node) if self._orders is not None else None
        ids = node.key.token_ids if node is not root else ()
        end = min(token_offset + token_limit, len(node.key) if node is not root else 0)
        row = self._row(node, self._depth(node), time.monotonic(), sizes)
        page = tuple(map(int, ids[token_offset:end]))
        return OffOwner(lambda: NodeDetail(  # built and decoded on the reader's thread
            node=self._view_of(row), token_ids=page, token_offset=token_offset,
            text=decode_preview(self.tokenizer, page[:TEXT_TOKENS]), path_tokens=path_tokens,
            sessions_beneath=beneath,
        ))

    def _known_now(self) -> None:
        """The open sessions given only as ids, as of this read (``OpenSessions.catch_up``; those
        SGLang's hooked maps hold are told as they move, with no work here)."""
        if self._roster is not None:
            self._roster.catch_up()

    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        check_sessions_read(order, offset, limit, contains)
        self._need_sessions()
        return self._call_pass(lambda: self._sessions_pass(order, offset, limit, contains, reverse))

    def _sessions_pass(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100,
                        contains: str = "", reverse: bool = False) -> Generator[None, None, SessionsPage]:
        check_sessions_read(order, offset, limit, contains)
        self._need_sessions()
        self._known_now()
        return (yield from sessions_page_pass(self._orders, order, offset, limit, contains, reverse))

    def session(self, session_id: str) -> SessionDetail:
        self._need_sessions()
        return self._call_pass(lambda: self._session_pass(session_id))

    def _session_pass(self, session_id: str) -> Generator[None, None, SessionDetail]:
        self._need_sessions()
        yield from ()  # one hold
        self._known_now()
        view = session_row(self._orders, session_id)
        nodes = self.tree.session_leaves().get(session_id, ())
        return SessionDetail(view, tuple(sorted(self._id(n) for n in nodes)))

    def _matched(self, tokens: list[int]) -> tuple[Any, int, Any, int]:
        """The longest cached prefix of ``tokens`` as SGLang's match finds it, read-only: the
        deepest node matched whole, its path's end, and the node a match ends inside (and how far)."""
        page = self.tree.page_size
        node, pos, partial, partial_len = self.tree.root, 0, None, 0
        while pos + page <= len(tokens):
            first = tokens[pos] if page == 1 else tuple(tokens[pos : pos + page])
            child = node.children.get(first)  # a plain dict read: no node is minted or touched
            if child is None or self.tree.device_evicted(child):  # SGLang's match stops there
                break
            key = child.key.token_ids
            n = len(child.key)
            same = 0
            while same < n and pos + same < len(tokens) and key[same] == tokens[pos + same]:
                same += 1
            same -= same % page
            if same == n:
                node, pos = child, pos + n
                continue
            if same:
                partial, partial_len = child, same
            break
        return node, pos, partial, partial_len

    def match(self, tokens: list[int]) -> MatchView:
        check_query(tokens)
        self._need_tree()

        def read() -> MatchView:
            node, pos, partial, partial_len = self._matched(tokens)
            return MatchView(len(tokens), pos + partial_len, self._id(node),
                             None if partial is None else self._id(partial), partial_len,
                             (pos + partial_len) * self.bpt)

        return self._call(read)

    def why(self, tokens: list[int]) -> WhyView:
        """Over a tree that keeps its history: radixtop's copy of SGLang's tree beside the
        scheduler (``mirror.MirrorCache``, from the probe's records)."""
        history = getattr(self.cache, "history", None)
        if history is None:
            return super().why(tokens)
        check_query(tokens)
        self._need_tree()

        def read() -> WhyView:
            node, pos, partial, partial_len = self._matched(tokens)
            return why_view(history, tokens, live_path(node, pos, self.tree.root), pos + partial_len, self._id(node),
                            None if partial is None else self._id(partial), partial_len, self.tree.page_size)

        return self._call(read)

    def why_session(self, session_id: str) -> SessionWhyView:
        """Over radixtop's copy beside the scheduler, as ``why``: the nodes the session held that
        left; its requests' hits are not in the probe's records (None)."""
        history = getattr(self.cache, "history", None)
        if history is None:
            return super().why_session(session_id)
        self._need_tree()
        return answer_session(session_id, self._call_pass(lambda: session_story(history)), self.session)

    def history(self, after: int = 0, served_after: int = 0, limit: int = MAX_HISTORY_PAGE) -> HistoryPage:
        history = getattr(self.cache, "history", None)
        if history is None:
            return super().history(after, served_after, limit)
        check_history_read(after, served_after, limit)
        return history_page(self._call(lambda: journal_read(history, after, served_after, limit)))

    def then(self, at: float | None = None) -> ThenView:
        """Over radixtop's copy beside the scheduler, as ``why``: its history keeps the probe's
        stores, splits and removals."""
        history = getattr(self.cache, "history", None)
        if history is None:
            return super().then(at)
        self._need_tree()
        tree = self.tree
        ledger = self._index.ledger if self._index is not None else None
        return then_view(self._call_pass(
            lambda: then_pass(history, at, lambda: tree.evictable_size() + tree.protected_size(), ledger, self.bpt)))

    def then_children(self, at: float | None, node_id: int = 0, offset: int = 0, limit: int = 100) -> ChildrenPage:
        return then_children_of(self, self._then_more(), at, node_id, offset, limit)

    def _then_more(self) -> More | None:
        history = getattr(self.cache, "history", None)
        if history is None:
            return None

        def more(at: float | None, start: Start | None) -> Any:
            self._need_tree()
            return self._call_pass(lambda: then_more(history, at, start))

        return more

    def changes(self, since: int) -> Changes:
        raise Unsupported("SGLang keeps no change journal; read the pages again")

    def diagnose(self, idle_after_s: float = IDLE_AFTER_S) -> Diagnosis:
        check_idle_after(idle_after_s)
        from radixtop.adapters.sglang.doctor import doctor_inputs

        return self._call_pass(lambda: diagnose_pass(doctor_inputs(self), idle_after_s))

    def export(self) -> Iterator[dict[str, Any]]:
        self._need_tree()

        def snapshot():
            tree, root = self.tree, self.tree.root
            rows: list[tuple[int, int, int, int, int, tuple[str, ...]]] = []
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                held = tree.holders(node)
                rows.append((node.id, self._id(node.parent), len(node.key), tree.lock_ref(node),
                             int(getattr(node, "hit_count", 0) or 0), tuple(sorted(held)) if held else ()))
                stack.extend(node.children.values())
            return self.version, rows

        version, rows = self._call(snapshot)
        yield {"version": version, "bytes_per_token": self.bpt, "node_count": len(rows), "root_id": ROOT_ID}
        for node_id, parent, tokens, lock_ref, hits, holders in rows:
            yield {"id": node_id, "parent": parent, "tokens": tokens, "lock_ref": lock_ref,
                   "hit_count": hits, "holders": holders}

    # ----- actions -----

    def _state(self, session_id: str) -> str:
        """Open where it holds a node or SGLang knows it open (0.5.23's UnifiedRadixCache opens a
        generation for every request that carries a session id, even one never opened through
        /open_session)."""
        if session_id in self.tree.closed():
            return "closed"
        if session_id in self.tree.session_leaves():
            return "open"
        if self._roster is not None:
            self._known_now()
            if self._roster.known(session_id):
                return "open"
        raise unknown_session(session_id)

    def _plan(self, session_id: str) -> ClosePlanView:
        tree = self.tree
        state = self._state(session_id)
        tagged = tree.session_leaves().get(session_id, ())
        if tree.policy == "deref":
            held = [n for n in tagged if session_id in (tree.holders(n) or ())]
            kept = tuple(KeptNodeView(n.id, len(n.key), "deref") for n in held)
            return ClosePlanView(session_id, "deref", state, (), 0, 0, len(held), kept)
        freed, kept, holds = plan_release(tree.root, tagged, session_id)
        tokens = sum(len(n.key) for n in freed)
        return ClosePlanView(session_id, "free", state, tuple(n.id for n in freed), tokens, tokens * self.bpt,
                             holds, tuple(KeptNodeView(n.id, len(n.key), why) for n, why in kept.items()))

    def plan_close(self, session_id: str) -> ClosePlanView:
        self._need_sessions()
        return self._call(lambda: self._plan(session_id), urgent=True)

    def close_session(self, session_id: str) -> CloseResultView:
        return self.close_session_planned(session_id)[1]

    def close_session_planned(self, session_id: str) -> tuple[ClosePlanView, CloseResultView]:
        """Plan and close in one hold of the scheduler thread (the result is the plan)."""
        self._need_sessions()
        refuse_if_read_only(self, f"close of session {session_id!r}")

        def act() -> tuple[ClosePlanView, CloseResultView]:
            plan = self._plan(session_id)
            already = plan.state == "closed"
            before = int(self.allocator.available_size())
            self._close(session_id)  # counted by ``observe``'s wrapper of release_radix_session
            freed_tokens = int(self.allocator.available_size()) - before
            self._changed()
            # The plan ran on this thread, in the same hold: it is what the close freed.
            freed_ids = plan.freed_node_ids if freed_tokens == plan.freed_tokens else ()
            return plan, CloseResultView(session_id, plan.policy, already, freed_ids, freed_tokens,
                                         freed_tokens * self.bpt, plan.released_holds)

        return self._call(act, urgent=True)

    def _evict(self, num_tokens: int) -> tuple[int, int | None]:
        """(tokens, nodes) SGLang's own ``evict`` freed (owner thread)."""
        tokens, nodes = self.tree.evict_counted(num_tokens)  # evicted_tokens: counted by ``observe``
        self._changed()
        return tokens, nodes

    def evict(self, num_tokens: int) -> EvictResultView:
        check_tokens(num_tokens)
        refuse_if_read_only(self, f"evict of {num_tokens} tokens")

        def act() -> EvictResultView:
            tokens, nodes = self._evict(num_tokens)
            return EvictResultView(num_tokens, tokens, nodes, tokens * self.bpt)

        return self._call(act, urgent=True)

    def flush(self) -> FlushResultView:
        refuse_if_read_only(self, "flush")

        def act() -> FlushResultView:
            tokens, nodes = self._evict(self.tree.evictable_size())
            locked = self.tree.protected_size()
            message = (f"freed {tokens:,} tokens; {locked:,} stay locked by running requests"
                       if locked else f"freed {tokens:,} tokens")
            return FlushResultView(tokens, nodes, tokens * self.bpt, True, message)

        return self._call(act, urgent=True)


def totals(of: Any) -> Stats:
    """SGLang's own totals and radixtop's counters of what it did (no node or session counts),
    read on the scheduler thread from an ``SGLangInProcessAdapter`` (or the probe's ``CoreOps``)."""
    tree, bpt = of.tree, of.bpt
    capacity = int(of.allocator.size)
    free = int(of.allocator.available_size())
    evictable, protected = tree.evictable_size(), tree.protected_size()
    running = max(0, capacity - free - evictable - protected)
    buckets = of._buckets() if of._buckets is not None else None
    # What is neither available nor in the tree is held by sessions (0.5.23's streaming
    # sessions) or by running requests beyond their cached prefix: told apart by SGLang's
    # leak check where it can be read, unknown otherwise
    full = next((b for b in buckets or () if b.component == "full"), None)
    session_held = min(full.session_held, running) if full is not None else None
    return Stats(
        target=of.name, capacity_tokens=capacity, available_tokens=free,
        evictable_tokens=evictable, protected_tokens=protected, session_held_tokens=session_held,
        uncached_tokens=None if session_held is None else running - session_held,
        unevictable_tokens=protected + running,
        total_tokens=evictable + protected, bytes_per_token=bpt,
        node_count=None, open_sessions=None,
        closed_sessions=None, prompt_tokens=of.prompt_tokens, cached_tokens=of.cached_tokens,
        evicted_tokens=of.evicted_tokens, closes=of.closes,
        freed_by_close_tokens=of.freed_by_close_tokens, version=of.version,
        geometry=of.geometry, buckets=buckets,
    )


SGLangAdapter = SGLangInProcessAdapter
"""The name before 0.2 (kept for one release)."""
