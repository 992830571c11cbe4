"""Hypothesis stateful tests: random interleavings of every op, invariants after each step."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixtop.adapters.owned.attribution import attribute, attribution_pass
from radixtop.gpu_backend.ledger import paths
from radixtop.gpu_backend.ledger.orders import ROW_KEYS
from radixtop.gpu_backend.owner.slices import run_to_end
from radixtop.gpu_backend.scheduler import OutOfSlotsError
from tests.support.engines import check_invariants, make_scheduler

PROMPTS = ([1, 2, 3, 4], [1, 2, 5, 6], [7, 8])
SESSIONS = st.sampled_from(["a", "b", "c", "d"])
# Few distinct tokens and short runs, so that sessions often end on the same node and splits are common.
TOKENS = st.lists(st.integers(0, 2), max_size=4)


class CacheMachine(RuleBasedStateMachine):
    page_size = 1
    close_policy = "free"
    eviction_policy = "lru"
    capacity = 48

    def __init__(self) -> None:
        super().__init__()
        self.s = make_scheduler(self.capacity, self.page_size, self.eviction_policy, self.close_policy)
        self.s.cache.closed_session_limit = 2  # fewer tombstones than sessions: the oldest fall off
        self.next_id = 0

    @rule(prompt=st.sampled_from(PROMPTS), extra=TOKENS, session=st.none() | SESSIONS)
    def begin(self, prompt, extra, session):
        self.next_id += 1
        rid = f"r{self.next_id}"
        before = self.s.cache.protected_size()
        try:
            hit = self.s.begin(rid, prompt + extra, session)
        except OutOfSlotsError:
            assert rid not in self.s.running
            assert self.s.cache.protected_size() == before  # the lock was given back
            return
        assert hit % self.page_size == 0 and hit <= len(prompt + extra)

    @precondition(lambda self: self.s.running)
    @rule(data=st.data(), output=TOKENS)
    def finish(self, data, output):
        rid = data.draw(st.sampled_from(sorted(self.s.running)))
        try:
            self.s.finish(rid, output)
        except OutOfSlotsError:
            assert rid in self.s.running  # still running, nothing lost; finish it later

    @precondition(lambda self: self.s.running)
    @rule(data=st.data())
    def abort(self, data):
        self.s.abort(data.draw(st.sampled_from(sorted(self.s.running))))

    @precondition(lambda self: self.s.cache.node_count())
    @rule(data=st.data(), session=SESSIONS)
    def request_ending_on_an_existing_node(self, data, session):
        """Another session finishes exactly on a cached node: shared holders."""
        node = data.draw(st.sampled_from(sorted(self.s.cache.iter_nodes(), key=lambda n: n.id)))
        path = self.s.cache.path_tokens(node)
        self.s.register_session(session)  # (re)open it, so that it tags
        self.next_id += 1
        try:
            self.s.request(f"r{self.next_id}", path, [], session)
        except OutOfSlotsError:
            pass

    @rule(session=SESSIONS)
    def close_equals_plan(self, session):
        plan = self.s.cache.plan_close(session)
        kept = self.s.cache.ledger.exclusive.get(session, 0)
        result = self.s.close_session(session)
        assert kept == result.freed_tokens  # the kept figure is what the close then frees
        assert sorted(plan.freed_node_ids) == sorted(result.freed_node_ids)
        assert plan.freed_tokens == result.freed_tokens
        assert plan.released_holds == result.released_holds
        assert self.s.cache.is_session_closed(session)

    @rule(prompt=st.sampled_from(PROMPTS), extra=TOKENS)
    def insert_without_a_lock(self, prompt, extra):
        """A prefix inserted straight into the cache (no request locks its path meanwhile): it
        may hang an untagged leaf under a session's node."""
        key = self.s.cache.page_aligned(prompt + extra)
        cached = self.s.cache.lookup(key).prefix_len
        slots = self.s.pool.allocator.alloc(len(key) - cached) if len(key) > cached else None
        if len(key) > cached and slots is None:
            return
        value = np.zeros(len(key), dtype=np.int64)
        if slots is not None:
            value[cached:] = slots
        self.s.cache.insert(key, value)

    @rule(session=SESSIONS)
    def register(self, session):
        self.s.register_session(session)
        assert not self.s.cache.is_session_closed(session)

    @rule(tokens=st.integers(0, 40))
    def evict(self, tokens):
        before = self.s.cache.evictable_size()
        evicted = self.s.evict(tokens).num_tokens_evicted
        assert evicted >= min(tokens, before) or self.s.cache.evictable_size() == 0
        assert self.s.cache.evictable_size() == before - evicted

    @rule(prompt=st.sampled_from(PROMPTS), extra=TOKENS)
    def lookup_agrees_with_match_prefix(self, prompt, extra):
        key = prompt + extra
        looked = self.s.cache.lookup(key).prefix_len
        assert self.s.cache.match_prefix(key).prefix_len == looked

    @rule()
    def prune_sessions(self):
        self.s._prune_sessions()

    @invariant()
    def open_session_count_is_kept(self):
        assert self.s.open_session_count == len(self.s.open_session_ids())

    @invariant()
    def invariants_hold(self):
        check_invariants(self.s)

    @invariant()
    def one_pass_attribution_equals_every_plan(self):
        cache = self.s.cache
        exclusive = cache.exclusive_tokens_by_session()
        for sid in cache._session_leaves:
            assert exclusive.get(sid, 0) == cache.plan_close(sid).freed_tokens, sid

    @invariant()
    def kept_figures_equal_the_oracle(self):
        """The figures the ledger keeps as the tree changes are, after every step, what a
        from-scratch attribution gives: every listed session's row, every node's sessions
        beneath, and every kept order's ranking."""
        s, cache = self.s, self.s.cache
        orders = s.orders
        orders.rank_min_s = orders.rank_budget = 0  # an order ranked at its read: ranked anew each time
        want = attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids,
                         s.session_activity, s.session_activity, orders.bpt, cache.close_policy != "deref")
        listed = {sid for sid in orders.everyone() if orders.listed(sid)}
        assert listed == set(want.sessions)
        for sid, row in want.sessions.items():
            assert orders.row(sid) == row, sid
        ledger = cache.ledger
        got_beneath = {n.id: ledger.beneath(n) for n in cache.iter_nodes() if ledger.beneath(n)}
        assert got_beneath == dict(want.beneath.items())
        assert ledger.beneath(cache.root_node) == want.sessions_holding
        for order in ROW_KEYS:
            for reverse in (False, True):
                rows, total, _, _ = run_to_end(orders.page_pass(order, 0, 100, reverse=reverse))
                expected, count = want.page(order, 0, 100, reverse=reverse)
                assert (rows, total) == (expected, count), (order, reverse)
        rows, total, _, _ = run_to_end(orders.page_pass("exclusive_bytes", 1, 2, contains="a"))
        assert (rows, total) == want.page("exclusive_bytes", 1, 2, contains="a")

    @rule()
    def start_a_sliced_attribution(self):
        """A pass in slices of one node or session, as the engine runs a large one between its
        steps: the other rules change the tree between its slices."""
        s, cache = self.s, self.s.cache
        steps = attribution_pass(cache.root_node, cache._session_leaves, cache._closed_session_ids,
                                  s.session_activity, s.session_activity, 1, cache.close_policy != "deref",
                                  chunk=1)
        self.sliced = (steps, cache.version)

    @precondition(lambda self: getattr(self, "sliced", None))
    @rule(slices=st.integers(1, 3))
    def advance_the_sliced_attribution(self, slices):
        """It never fails, whatever changed between its slices; its figures are never negative;
        where nothing changed since it started, they are the definition's."""
        steps, version = self.sliced
        for _ in range(slices):
            try:
                next(steps)
            except StopIteration as finished:
                got = finished.value
                break
        else:
            return
        self.sliced = None
        assert all(count >= 1 for count in got.beneath.values())
        for row in got.sessions.values():
            assert min(row[2:7]) >= 0, row
        if self.s.cache.version == version:
            event("sliced attribution: nothing changed meanwhile")
            self._check_attribution(got)
        else:
            event("sliced attribution: the tree changed between slices")

    @invariant()
    def attribution_equals_its_definition(self):
        """``attribute()`` gives what each session's own union of root paths gives, taken as
        sets one session at a time (the definition), for every session and every node."""
        s, cache = self.s, self.s.cache
        self._check_attribution(attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids,
                                          s.session_activity, s.session_activity, 1, cache.close_policy != "deref"))

    def _check_attribution(self, got):
        want_rows, want_beneath = attribution_by_definition(self.s)
        assert got.beneath == want_beneath
        assert set(got.sessions) >= set(want_rows)
        for sid, row in got.sessions.items():
            exclusive, shared, fair, locked = want_rows.get(sid, (0, 0, 0.0, 0))
            assert row[3:5] == (exclusive, shared) and row[6] == locked, sid
            assert abs(row[5] - fair) <= 0.5 + 1e-9, sid  # the same sum, added in another order

    @invariant()
    def changes_let_a_reader_follow_the_tree(self):
        """A reader that applies only changes(since) holds exactly what a full re-read gives."""
        cache = self.s.cache
        if not hasattr(self, "mirror"):
            self.mirror, self.since = {}, -1
        delta = cache.changes(self.since)
        if delta.resync:
            self.mirror = {n.id: _row(n) for n in cache.iter_nodes()}
        else:
            for node_id in delta.removed:
                self.mirror.pop(node_id, None)
            for node_id in (*delta.added, *delta.changed):
                if node_id != 0:
                    self.mirror[node_id] = _row(cache.nodes[node_id])
        self.since = delta.version
        assert self.mirror == {n.id: _row(n) for n in cache.iter_nodes()}


def attribution_by_definition(s) -> tuple[dict[str, tuple[int, int, float, int]], dict[int, int]]:
    """Each session's (exclusive, shared, fair share, locked) tokens from its own union of root
    paths, and each node's count of sessions whose union holds it."""
    cache = s.cache
    unions: dict[str, set] = {}
    for sid, leaves in cache._session_leaves.items():
        union: set = set()
        for leaf in leaves:
            node = leaf
            while node is not cache.root_node:
                union.add(node)
                node = node.parent
        if union:
            unions[sid] = union
    beneath = Counter(node for union in unions.values() for node in union)
    exclusive = cache.exclusive_tokens_by_session()
    rows = {}
    for sid, union in unions.items():
        path = sum(len(n.key) for n in union)
        rows[sid] = (exclusive.get(sid, 0), path - exclusive.get(sid, 0),
                     sum(len(n.key) / beneath[n] for n in union), sum(len(n.key) for n in union if n.lock_ref > 0))
    return rows, {node.id: count for node, count in beneath.items()}


def _row(node):
    return (node.parent.id, node.key, node.lock_ref, frozenset(node.session_ids or ()),
            node.subtree_tokens, len(node.children))


class PagedCacheMachine(CacheMachine):
    page_size = 2
    capacity = 64


class DerefCacheMachine(CacheMachine):
    close_policy = "deref"


class NarrowCacheMachine(CacheMachine):
    """The fair-share and locked orders' tree (``PathSums``) with every node's children and ends
    kept sorted (as a wide node's are), so that the sorted path is checked on small trees too."""

    def __init__(self) -> None:
        super().__init__()
        self.wide, self.ends = paths.WIDE, paths.ENDS_SORTED
        paths.WIDE = paths.ENDS_SORTED = 0

    def teardown(self) -> None:
        paths.WIDE, paths.ENDS_SORTED = self.wide, self.ends


class LFUCacheMachine(CacheMachine):
    eviction_policy = "lfu"


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

TestCache = CacheMachine.TestCase
TestCache.settings = SETTINGS
TestPagedCache = PagedCacheMachine.TestCase
TestPagedCache.settings = SETTINGS
TestDerefCache = DerefCacheMachine.TestCase
TestDerefCache.settings = SETTINGS
TestLFUCache = LFUCacheMachine.TestCase
TestLFUCache.settings = SETTINGS
TestNarrowCache = NarrowCacheMachine.TestCase
TestNarrowCache.settings = SETTINGS
