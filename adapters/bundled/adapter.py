"""The bundled adapter: the contract over radixtop's own engine, every call on its owner thread."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

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
from radixtop.adapters.bundled.child_order import CHILD_KEYS, ChildOrders
from radixtop.adapters.doctor import IDLE_AFTER_S, check_idle_after, diagnose_pass
from radixtop.adapters.errors import (
    BadRequest,
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
    ExportColumns,
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
from radixtop.adapters.owned.common import SORT_CHUNK, owner_call, refuse_if_read_only
from radixtop.adapters.owned.reads import OwnerReads
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
from radixtop.adapters.text import TEXT_TOKENS, decode_preview
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.owner.queue import gc_paused
from radixtop.gpu_backend.owner.slices import run_to_end
from radixtop.gpu_backend.radix_cache import ChangeSet

if TYPE_CHECKING:
    from radixtop.gpu_backend.radix_cache import TreeNode
    from radixtop.gpu_backend.scheduler import Scheduler

T = TypeVar("T")
MAX_CHANGES = 5_000
"""More touches than this since ``since`` answer resync: re-reading is cheaper."""

def _page(items: list[T], key: Callable[[T], Any], offset: int, limit: int) -> list[T]:
    """items[offset:offset+limit] in ``key`` order, without sorting everything for early pages."""
    if offset + limit < len(items) // 4:
        return heapq.nsmallest(offset + limit, items, key=key)[offset:]
    return sorted(items, key=key)[offset : offset + limit]


class BundledAdapter(OwnerReads, CacheAdapter):
    """Runs every read and action on the engine's owner thread through its command queue."""

    def __init__(self, engine: Engine, name: str = "bundled", read_only: bool = False,
                 tokenizer: Any = None, timeout: float = 10.0):
        self.engine = engine
        self.name = name
        self.read_only = read_only
        self.tokenizer = tokenizer
        self.timeout = timeout
        self._child_orders = ChildOrders()
        self._init_owner_reads()

    def _call(self, fn: Callable[[Scheduler], T], urgent: bool = False) -> T:
        """``fn(scheduler)`` on the engine thread; ``urgent`` (actions, stats) ahead of queued reads."""
        owner = self._in_pass()
        if owner is not None:  # inline in read_many's pass: already on the owner thread
            return fn(*owner)
        return owner_call(lambda: self.engine.call(fn, self.timeout, urgent), self.name)

    def _call_pass(self, make: Callable[..., Generator[None, None, T]]) -> T:
        """A read that may need more than a slice of the engine (``OwnerReads``): in its slices."""
        owner = self._in_pass()
        if owner is not None:  # inside a pass already: on the owner thread
            return run_to_end(make(*owner))
        return owner_call(lambda: self.engine.owner.call_pass(lambda: make(self.engine.scheduler), self.timeout),
                          self.name)

    def capabilities(self) -> Capabilities:
        return Capabilities(read_only=self.read_only,
                            reason="read-only: actions are refused" if self.read_only else "")

    # ----- reads -----

    def stats(self) -> Stats:
        return self._call(lambda s: stats_of(s, self.name), urgent=True)  # cheap, and what health checks read

    def _node_view(self, s: Scheduler, node: TreeNode, depth: int, now: float) -> NodeView:
        bpt = s.geometry.bytes_per_token
        first = tuple(node.key[:FIRST_TOKENS])
        return NodeView(
            id=node.id,
            parent_id=node.parent.id if node.parent is not None else None,
            depth=depth,
            tokens=len(node.key),
            first_tokens=first,
            text=decode_preview(self.tokenizer, first),
            lock_ref=node.lock_ref if node is not s.cache.root_node else 0,
            hit_count=node.hit_count,
            access_age_s=max(0.0, now - node.last_access_time),
            created_age_s=max(0.0, now - node.creation_time),
            bytes=len(node.key) * bpt,
            subtree_tokens=node.subtree_tokens,
            subtree_bytes=node.subtree_tokens * bpt,
            num_children=len(node.children),
            holders=tuple(sorted(node.session_ids or ())),
        )

    @staticmethod
    def _lookup(s: Scheduler, node_id: int) -> TreeNode:
        node = s.cache.nodes.get(node_id)
        if node is None:
            raise unknown_node(node_id)
        return node

    @staticmethod
    def _depth(node: TreeNode) -> int:
        depth = 0
        while node.parent is not None:
            depth += 1
            node = node.parent
        return depth

    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        check_page(offset, limit)
        check_child_order(order)
        return self._call_pass(lambda s: self._children_pass(s, node_id, offset, limit, order))

    def _children_pass(self, s: Scheduler, node_id: int, offset: int = 0, limit: int = 100,
                        order: str = "bytes") -> Generator[None, None, ChildrenPage]:
        check_page(offset, limit)
        check_child_order(order)
        node = self._lookup(s, node_id)
        if len(node.children) <= SORT_CHUNK:
            page = _page(list(node.children.values()), CHILD_KEYS[order], offset, limit)
        else:  # a wide node (a few-shot prompt with 200k continuations): kept in order between reads
            page = yield from self._child_orders.page_pass(s.cache, node, order, offset, limit)
            node = self._lookup(s, node_id)  # still there after the slices?
        depth = self._depth(node) + 1
        now = s.cache.clock()
        views = tuple(self._node_view(s, k, depth, now) for k in page)
        return ChildrenPage(node_id, offset, limit, len(node.children), order, views)

    def chain(self, node_id: int, limit: int = 10_000) -> ChainView:
        check_chain_limit(limit)

        def read(s: Scheduler) -> ChainView:
            node = self._lookup(s, node_id)
            depth = self._depth(node)
            now = s.cache.clock()
            nodes = []
            while len(node.children) == 1 and len(nodes) < limit:
                node = next(iter(node.children.values()))
                depth += 1
                nodes.append(self._node_view(s, node, depth, now))
            return ChainView(node_id, tuple(nodes), len(node.children) == 1)

        return self._call(read)

    def _paths_pass(self, s: Scheduler, node_ids: tuple[int, ...]) -> Generator[None, None, PathsView]:
        asked = check_paths(node_ids)
        nodes, missing, capped = yield from path_nodes(asked, s.cache.nodes.get, lambda n: n.parent)
        now, views = s.cache.clock(), []
        for start in range(0, len(nodes), SORT_CHUNK):  # 100k views at once would hold the engine
            if start:
                yield
            views.extend(self._node_view(s, node, depth, now) for node, depth in nodes[start : start + SORT_CHUNK])
        return PathsView(asked, tuple(views), tuple(missing), capped)

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail:
        check_page(token_offset, token_limit)
        return self._call_pass(lambda s: self._node_pass(s, node_id, token_offset, token_limit))

    def _node_pass(self, s: Scheduler, node_id: int, token_offset: int = 0,
                    token_limit: int = 256) -> Generator[None, None, NodeDetail]:
        check_page(token_offset, token_limit)
        yield from ()  # one hold
        node = self._lookup(s, node_id)
        depth = self._depth(node)
        path_tokens, up = 0, node
        while up is not None:
            path_tokens += len(up.key)
            up = up.parent
        return NodeDetail(
            node=self._node_view(s, node, depth, s.cache.clock()),
            token_ids=(page := tuple(node.key[token_offset : token_offset + token_limit])),
            token_offset=token_offset,
            text=decode_preview(self.tokenizer, page[:TEXT_TOKENS]),
            path_tokens=path_tokens,
            sessions_beneath=s.cache.ledger.beneath(node),
        )

    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        check_sessions_read(order, offset, limit, contains)
        return self._call_pass(lambda s: self._sessions_pass(s, order, offset, limit, contains, reverse))

    def _sessions_pass(self, s: Scheduler, order: str = "exclusive_bytes", offset: int = 0,
                        limit: int = 100, contains: str = "", reverse: bool = False) -> Generator[None, None, SessionsPage]:
        check_sessions_read(order, offset, limit, contains)
        return (yield from sessions_page_pass(s.orders, order, offset, limit, contains, reverse))

    def session(self, session_id: str) -> SessionDetail:
        return self._call_pass(lambda s: self._session_pass(s, session_id))

    def _session_pass(self, s: Scheduler, session_id: str) -> Generator[None, None, SessionDetail]:
        yield from ()  # one hold: the view and its nodes of one moment
        view = session_row(s.orders, session_id)
        leaves = s.cache._session_leaves.get(session_id, ())
        return SessionDetail(view, tuple(sorted(node.id for node in leaves)))

    def match(self, tokens: list[int]) -> MatchView:
        check_query(tokens)

        def read(s: Scheduler) -> MatchView:
            found = s.cache.lookup(tokens)
            return MatchView(
                query_tokens=len(tokens),
                matched_tokens=found.prefix_len,
                node_id=found.last_node.id,
                partial_node_id=found.partial_node.id if found.partial_node is not None else None,
                partial_tokens=found.partial_len,
                matched_bytes=found.prefix_len * s.geometry.bytes_per_token,
            )

        return self._call(read)

    def why(self, tokens: list[int]) -> WhyView:
        check_query(tokens)

        def read(s: Scheduler) -> WhyView:
            cache = s.cache
            if cache.history is None:
                raise Unsupported(f"{self.name} keeps no history of its tree (started without one)")
            found = cache.lookup(tokens)
            partial = found.partial_node
            end = found.prefix_len - found.partial_len
            return why_view(cache.history, tokens, live_path(found.last_node, end, cache.root_node),
                            found.prefix_len, found.last_node.id, partial.id if partial is not None else None,
                            found.partial_len, cache.page_size)

        return self._call(read)

    def why_session(self, session_id: str) -> SessionWhyView:
        def read(s: Scheduler) -> Generator[None, None, tuple[Any, ...]]:
            if s.cache.history is None:
                raise Unsupported(f"{self.name} keeps no history of its tree (started without one)")
            return (yield from session_story(s.cache.history))

        return answer_session(session_id, self._call_pass(read), self.session)

    def history(self, after: int = 0, served_after: int = 0, limit: int = MAX_HISTORY_PAGE) -> HistoryPage:
        check_history_read(after, served_after, limit)

        def read(s: Scheduler) -> tuple[Any, ...]:
            if s.cache.history is None:
                raise Unsupported(f"{self.name} keeps no history of its tree (started without one)")
            return journal_read(s.cache.history, after, served_after, limit)

        return history_page(self._call(read))

    def then(self, at: float | None = None) -> ThenView:
        def read(s: Scheduler) -> Generator[None, None, tuple[Any, ...]]:
            cache = s.cache
            if cache.history is None:
                raise Unsupported(f"{self.name} keeps no history of its tree (started without one)")
            return (yield from then_pass(cache.history, at, cache.total_size, cache.ledger, s.geometry.bytes_per_token))

        return then_view(self._call_pass(read))

    def then_children(self, at: float | None, node_id: int = 0, offset: int = 0, limit: int = 100) -> ChildrenPage:
        return then_children_of(self, self._then_more(), at, node_id, offset, limit)

    def parents_of(self, node_ids: Sequence[int]) -> dict[int, int | None]:
        """Each node on the paths to ``node_ids``, with its parent's id (None: the root's): a
        ``paths`` read without the views (the tree then's, which needs no more)."""
        asked = check_paths(node_ids)

        def read(s: Scheduler) -> Generator[None, None, dict[int, int | None]]:
            nodes, _, _ = yield from path_nodes(asked, s.cache.nodes.get, lambda n: n.parent)
            return {n.id: None if n.parent is None else n.parent.id for n, _ in nodes}

        return self._call_pass(read)

    def _then_more(self) -> More:
        def more(at: float | None, start: Start | None) -> Any:
            def read(s: Scheduler) -> Generator[None, None, Any]:
                if s.cache.history is None:
                    raise Unsupported(f"{self.name} keeps no history of its tree (started without one)")
                return (yield from then_more(s.cache.history, at, start))

            return self._call_pass(read)

        return more

    def changes(self, since: int) -> Changes:
        if since < 0:
            raise BadRequest(f"since must be >= 0, got {since}")

        def read(s: Scheduler):
            cache = s.cache
            if cache.version - since > MAX_CHANGES:
                return ChangeSet(since, cache.version, True)
            return cache.changes(since)

        delta = self._call(read)
        return Changes(delta.since, delta.version, delta.resync, delta.added, delta.changed, delta.removed)

    def diagnose(self, idle_after_s: float = IDLE_AFTER_S) -> Diagnosis:
        check_idle_after(idle_after_s)
        from radixtop.adapters.bundled.doctor import doctor_inputs

        return self._call_pass(lambda s: diagnose_pass(doctor_inputs(self, s), idle_after_s))

    def stats_on_owner(self, s: Scheduler) -> Stats:
        """``stats()`` inline, for a pass already on the owner thread (the doctor's)."""
        saved, self._pass_owner.owner = self._in_pass(), (s,)
        try:
            return self.stats()
        finally:
            self._pass_owner.owner = saved

    def _export_snapshot(self):
        """Columns of the whole tree, parents first, copied on the owner thread in one hold
        (a consistent snapshot; compact arrays, not an object per node)."""
        from array import array

        def snapshot(s: Scheduler):
            with gc_paused():
                ids, parents, tokens, locks, hits = (array("q") for _ in range(5))
                add_id, add_parent, add_tokens = ids.append, parents.append, tokens.append
                add_lock, add_hit = locks.append, hits.append
                holders: dict[int, tuple[str, ...]] = {}
                stack = list(s.cache.root_node.children.values())
                push, pop = stack.extend, stack.pop
                while stack:
                    node = pop()
                    node_id = node.id
                    add_id(node_id)
                    add_parent(node.parent.id)
                    add_tokens(len(node.key))
                    add_lock(node.lock_ref)
                    add_hit(node.hit_count)
                    if node.session_ids:
                        holders[node_id] = tuple(node.session_ids)  # sorted off the owner thread
                    if node.children:
                        push(node.children.values())
                return s.cache.version, s.geometry.bytes_per_token, ids, parents, tokens, locks, hits, holders

        version, bpt, ids, parents, tokens, locks, hits, holders = self._call(snapshot)
        holders = {k: tuple(sorted(v)) for k, v in holders.items()}
        return version, bpt, ids, parents, tokens, locks, hits, holders

    def export(self) -> Iterator[dict[str, Any]]:
        version, bpt, ids, parents, tokens, locks, hits, holders = self._export_snapshot()
        yield {"version": version, "bytes_per_token": bpt, "node_count": len(ids), "root_id": ROOT_ID}
        empty: tuple[str, ...] = ()
        for i in range(len(ids)):
            node_id = ids[i]
            yield {"id": node_id, "parent": parents[i], "tokens": tokens[i], "lock_ref": locks[i],
                   "hit_count": hits[i], "holders": holders.get(node_id, empty)}

    def export_columns(self) -> ExportColumns:
        version, bpt, ids, parents, tokens, locks, hits, holders = self._export_snapshot()
        columns = {"id": ids, "parent": parents, "tokens": tokens, "lock_ref": locks, "hit_count": hits}
        return ExportColumns(version, bpt, columns, holders)

    def export_ndjson(self, chunk_rows: int = 10_000) -> Iterator[str]:
        """The same rows as ``export``, formatted straight from the columns (no dict per row)."""
        import json

        version, bpt, ids, parents, tokens, locks, hits, holders = self._export_snapshot()
        header = {"version": version, "bytes_per_token": bpt, "node_count": len(ids), "root_id": ROOT_ID}
        yield json.dumps(header, separators=(",", ":")) + "\n"
        held = {k: json.dumps(list(v), separators=(",", ":")) for k, v in holders.items()}
        fmt = '{"id":%d,"parent":%d,"tokens":%d,"lock_ref":%d,"hit_count":%d,"holders":%s}\n'
        for start in range(0, len(ids), chunk_rows):
            end = start + chunk_rows
            yield "".join([
                fmt % (i, p, t, lk, h, held.get(i, "[]"))
                for i, p, t, lk, h in zip(ids[start:end], parents[start:end], tokens[start:end],
                                          locks[start:end], hits[start:end])
            ])

    # ----- actions -----

    def _plan(self, s: Scheduler, session_id: str) -> ClosePlanView:
        plan = s.cache.plan_close(session_id)
        if s.cache.is_session_closed(session_id):
            state = "closed"
        elif plan.known or session_id in s.session_activity:
            state = "open"
        else:
            raise unknown_session(session_id)
        return ClosePlanView(
            session_id, plan.policy, state, plan.freed_node_ids, plan.freed_tokens,
            plan.freed_bytes, plan.released_holds,
            tuple(KeptNodeView(k.node_id, k.tokens, k.reason) for k in plan.kept),
        )

    def _close(self, s: Scheduler, session_id: str) -> CloseResultView:
        r = close_on(self.engine, s, session_id)
        return CloseResultView(r.session_id, r.policy, r.already_closed, r.freed_node_ids,
                               r.freed_tokens, r.freed_bytes, r.released_holds)

    def plan_close(self, session_id: str) -> ClosePlanView:
        return self._call(lambda s: self._plan(s, session_id), urgent=True)

    def close_session(self, session_id: str) -> CloseResultView:
        refuse_if_read_only(self, f"close of session {session_id!r}")
        return self._call(lambda s: self._close(s, session_id), urgent=True)

    def close_session_planned(self, session_id: str) -> tuple[ClosePlanView, CloseResultView]:
        """Plan and close in one hold of the owner thread: nothing runs in between, so the
        result is the plan."""
        refuse_if_read_only(self, f"close of session {session_id!r}")
        return self._call(lambda s: (self._plan(s, session_id), self._close(s, session_id)), urgent=True)

    def evict(self, num_tokens: int) -> EvictResultView:
        refuse_if_read_only(self, f"evict of {num_tokens} tokens")
        check_tokens(num_tokens)
        return self._call(lambda s: evict_on(self.engine, s, num_tokens), urgent=True)

    def flush(self) -> FlushResultView:
        refuse_if_read_only(self, "flush")
        return self._call(lambda s: flush_on(self.engine, s), urgent=True)


def stats_of(s: Scheduler, name: str) -> Stats:
    """The engine's totals and counters (its owner thread): ``BundledAdapter.stats``, and what
    radixtop's process beside the engine is told (``adapters.bundled.beside``)."""
    cache, g = s.cache, s.geometry
    st = s.stats()
    return Stats(
        target=name,
        capacity_tokens=st.capacity,
        available_tokens=st.available_size,
        evictable_tokens=st.evictable_size,
        protected_tokens=st.protected_size,
        session_held_tokens=0,  # the bundled engine holds no slots for sessions outside the tree
        uncached_tokens=st.request_size,
        unevictable_tokens=st.protected_size + st.request_size,
        total_tokens=st.total_size,
        bytes_per_token=g.bytes_per_token,
        node_count=cache.node_count(),
        open_sessions=s.open_session_count,
        closed_sessions=len(cache._closed_session_ids),
        prompt_tokens=s.prompt_tokens,
        cached_tokens=s.cached_tokens,
        evicted_tokens=s.evicted_tokens,
        closes=s.closes,
        freed_by_close_tokens=s.freed_by_close_tokens,
        version=cache.version,
        geometry=Geometry.of(g),
        # SGLang's leak-check buckets, each counted on its own (no session-held slots here)
        buckets=(Bucket("full", st.capacity, st.available_size, st.evictable_size, st.protected_size, 0,
                        s.uncached_size()),),
    )


def close_on(engine: Engine, s: Scheduler, session_id: str) -> Any:
    """Close on the owner thread, recorded in the engine's trace; an id the engine does not know
    is refused (``BundledAdapter.close_session``, and radixtop's process beside the engine, whose
    plan may be older than this step)."""
    if not (session_id in s.cache._session_leaves or session_id in s.session_activity
            or s.cache.is_session_closed(session_id)):
        raise unknown_session(session_id)
    result = s.close_session(session_id)
    engine.record("close", session=session_id)
    return result


def evict_on(engine: Engine, s: Scheduler, num_tokens: int) -> EvictResultView:
    """Evict on the owner thread, recorded in the engine's trace."""
    r = s.evict_asked(num_tokens, "radixtop's evict")
    engine.record("evict", tokens=num_tokens)
    bpt = s.geometry.bytes_per_token
    return EvictResultView(num_tokens, r.num_tokens_evicted, r.num_nodes_evicted, r.num_tokens_evicted * bpt)


def flush_on(engine: Engine, s: Scheduler) -> FlushResultView:
    """Flush on the owner thread (what is locked stays), recorded as the evict it is."""
    requested = s.cache.evictable_size()
    r = s.flush()
    engine.record("evict", tokens=requested)
    locked = s.cache.protected_size()
    message = f"{locked} tokens locked by running requests stay" if locked else ""
    return FlushResultView(r.num_tokens_evicted, r.num_nodes_evicted,
                           r.num_tokens_evicted * s.geometry.bytes_per_token, True, message)
