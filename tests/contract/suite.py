"""The adapter contract suite: the same checks against every CacheAdapter implementation.

A test module provides an ``adapter`` fixture (and ``read_only_adapter``) built over
``build_engine()``'s cache (tests/support/engines.py). See tests/contract/test_bundled.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from radixtop.adapters.base import MAX_READS, READ_PARAMS
from radixtop.adapters.errors import AdapterError, BadRequest, ReadOnly, UnknownNode, UnknownSession, Unsupported
from radixtop.adapters.model import MAX_PATHS, POOL_STATES, ROOT_ID, Stats
from radixtop.gpu_backend.kv_geometry import get_geometry


def all_children(adapter, node_id, order="bytes"):
    page = adapter.children(node_id, 0, 10_000, order)
    return list(page.children)


# ----- reads -----


# ----- read_many: several reads as one -----


def known_reads(adapter) -> list[tuple[str, tuple]]:
    """Every read of READ_PARAMS, with all its arguments and with only the required ones."""
    prompt = all_children(adapter, ROOT_ID)[0].id
    run = next(c.id for c in all_children(adapter, ROOT_ID) if c.first_tokens[:1] == (50,))
    reads = [
        ("capabilities", ()), ("stats", ()), ("children", (ROOT_ID,)), ("children", (ROOT_ID, 1, 2, "tokens")),
        ("children", (prompt, 0, 5, "recency")),
        ("chain", (run,)), ("chain", (run, 1)), ("node", (ROOT_ID,)), ("node", (prompt, 1, 2)),
        ("subtree", (ROOT_ID,)), ("subtree", (prompt, 1, 1, "tokens", 1)),
        ("sessions", ()), ("sessions", ("id", 1, 2)), ("sessions", ("last_activity",)),
        ("sessions", ("locked_tokens", 0, 3, "O", True)),
        ("session", ("a",)), ("session", ("gone",)), ("match", ([1, 2, 3, 4, 5, 99],)), ("match", ([],)),
        ("changes", (max(adapter.stats().version - 3, 0),)),
        ("paths", ([prompt, run, 999_999],)),
    ]
    assert {op for op, _ in reads} == set(READ_PARAMS)
    return reads


def ageless(data):
    if isinstance(data, dict):  # ages are measured when a view is taken: two reads differ there only
        return {k: 0.0 if k.endswith("_age_s") and v is not None else ageless(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [ageless(v) for v in data]
    return data


def comparable(result):
    """A read's result (a view, or the typed error it raised) as data to compare."""
    if isinstance(result, AdapterError):
        return type(result), result.message
    return type(result), ageless(result.to_dict())


def read_one(adapter, op, args):
    try:
        return getattr(adapter, op)(*args)
    except AdapterError as exc:
        return exc


# ----- actions -----


class ContractSuite:
    """The contract's checks. A module runs them over its adapter by subclassing this as
    ``Test<Adapter>(ContractSuite)`` beside an ``adapter`` and a ``read_only_adapter`` fixture
    (over ``build_engine()``'s cache); a check that does not hold for a target is set to None
    there, with the reason, and its counterpart written beside it."""

    def test_stats_reconcile(self, adapter):
        st = adapter.stats()
        assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens == 256
        assert st.available_bytes + st.evictable_bytes + st.unevictable_bytes == st.capacity_bytes
        split = (st.protected_tokens, st.session_held_tokens, st.uncached_tokens)
        if None not in split:  # where the target tells them apart: SGLang's leak-check words add up
            assert sum(st.tokens_of(s) for s in POOL_STATES) == st.capacity_tokens
            assert sum(st.bytes_of(s) for s in POOL_STATES) == st.capacity_bytes
        assert st.bytes_per_token == get_geometry("tiny").bytes_per_token
        assert st.geometry.name == "tiny" and st.geometry.page_size == 1
        assert st.total_tokens == st.evictable_tokens + st.protected_tokens
        assert st.unevictable_tokens - st.protected_tokens == 2  # the running request's own slots beyond its prefix
        assert st.node_count > 0 and st.closed_sessions == 1 and st.open_sessions == 4
        assert st.cached_tokens <= st.prompt_tokens and st.closes == 1
        assert st.to_dict()["capacity_bytes"] == st.capacity_bytes

    def test_children_pages_are_consistent_and_ordered(self, adapter):
        every = all_children(adapter, ROOT_ID)
        assert [c.subtree_bytes for c in every] == sorted((c.subtree_bytes for c in every), reverse=True)
        page1 = adapter.children(ROOT_ID, 0, 1)
        page2 = adapter.children(ROOT_ID, 1, 10)
        assert page1.total == len(every)
        assert [c.id for c in (*page1.children, *page2.children)] == [c.id for c in every]
        by_tokens = all_children(adapter, ROOT_ID, "tokens")
        assert [c.tokens for c in by_tokens] == sorted((c.tokens for c in by_tokens), reverse=True)
        recency = all_children(adapter, ROOT_ID, "recency")
        assert [c.access_age_s for c in recency] == sorted(c.access_age_s for c in recency)
        prompt = every[0]
        assert prompt.first_tokens == (1, 2, 3, 4) and prompt.depth == 1 and prompt.parent_id == ROOT_ID
        assert prompt.lock_ref == 1  # the running request
        assert prompt.bytes == prompt.tokens * adapter.stats().bytes_per_token
        below = all_children(adapter, prompt.id)
        assert sum(c.subtree_tokens for c in below) + prompt.tokens == prompt.subtree_tokens
        assert all(c.depth == 2 for c in below)

    def test_children_bad_input(self, adapter):
        with pytest.raises(UnknownNode):
            adapter.children(987654, 0, 10)
        with pytest.raises(BadRequest):
            adapter.children(ROOT_ID, 0, 10, "size")
        with pytest.raises(BadRequest):
            adapter.children(ROOT_ID, -1, 10)
        with pytest.raises(BadRequest):
            adapter.children(ROOT_ID, 0, 0)

    def test_chain_follows_single_children(self, adapter):
        from radixtop.adapters.base import CacheAdapter

        def shape(view):
            return [(n.id, n.depth, n.tokens, n.num_children, n.parent_id) for n in view.nodes], view.truncated

        stack, runs = [ROOT_ID], 0
        while stack:
            node_id = stack.pop()
            kids = all_children(adapter, node_id)
            stack.extend(c.id for c in kids)
            got = adapter.chain(node_id)
            # the same as following children() one hop at a time (the contract's default)
            assert shape(got) == shape(CacheAdapter.chain(adapter, node_id))
            if len(kids) != 1:
                assert got.nodes == () and not got.truncated
                continue
            runs += 1
            assert got.node_id == node_id and got.nodes[0].id == kids[0].id
            assert all(n.num_children == 1 for n in got.nodes[:-1]) and got.nodes[-1].num_children != 1
            assert [n.parent_id for n in got.nodes] == [node_id] + [n.id for n in got.nodes[:-1]]
        assert runs >= 1  # the known tree has a run: a's first turn, then its second
        one = next(n for n in all_children(adapter, ROOT_ID))
        with pytest.raises(UnknownNode):
            adapter.chain(987654)
        with pytest.raises(BadRequest):
            adapter.chain(one.id, 0)

    def test_chain_truncates_at_the_limit(self, adapter):
        top = next(c for c in all_children(adapter, ROOT_ID) if c.first_tokens[:1] == (50,))
        whole = adapter.chain(top.id)
        assert [n.first_tokens for n in whole.nodes] == [(53, 54), (55, 56)] and not whole.truncated
        cut = adapter.chain(top.id, 1)
        assert [n.id for n in cut.nodes] == [whole.nodes[0].id] and cut.truncated

    def test_subtree_is_the_tree_as_its_pages_show_it(self, adapter):
        from radixtop.adapters.base import CacheAdapter

        for depth, limit, order, min_bytes in [(3, 10, "bytes", 0), (1, 2, "tokens", 0), (2, 1, "recency", 0),
                                               (64, 10_000, "bytes", 0), (3, 10, "bytes", 1)]:
            view = adapter.subtree(ROOT_ID, depth, limit, order, min_bytes)
            assert (view.node_id, view.depth, view.limit, view.order, view.min_bytes) == (
                ROOT_ID, depth, limit, order, min_bytes)
            # the same as reading the node, then page after page (the contract's default)
            assert ageless(view.to_dict()) == ageless(CacheAdapter.subtree(adapter, ROOT_ID, depth, limit, order,
                                                                           min_bytes).to_dict())
            rows = view.rows
            assert rows[0].node.id == ROOT_ID and rows[0].level == 0 and not view.capped
            for i, row in enumerate(rows):
                below = []
                for later in rows[i + 1:]:  # depth first: its children follow it, before its next sibling
                    if later.level <= row.level:
                        break
                    if later.level == row.level + 1:
                        below.append(later.node)
                assert [c.parent_id for c in below] == [row.node.id] * len(below)
                assert row.level <= depth and len(below) <= limit
                assert row.more == row.node.num_children - len(below)
                assert all(c.subtree_bytes <= row.node.subtree_bytes for c in below)  # never above its parent
                assert all(c.subtree_bytes >= min_bytes for c in below)
                expected = [c.id for c in all_children(adapter, row.node.id, order)
                            if c.subtree_bytes >= min_bytes][:limit] if row.level < depth else []
                assert [c.id for c in below] == expected
        everything = adapter.subtree(ROOT_ID, 64, 10_000)
        assert len(everything.rows) == adapter.stats().node_count + 1  # the whole (small) tree and its root
        with pytest.raises(UnknownNode):
            adapter.subtree(987654)
        for bad in [dict(depth=0), dict(depth=65), dict(limit=0), dict(order="size"), dict(min_bytes=-1)]:
            with pytest.raises(BadRequest):
                adapter.subtree(ROOT_ID, **bad)

    def test_node_detail(self, adapter):
        root = adapter.node(ROOT_ID)
        assert root.node.parent_id is None and root.node.depth == 0 and root.path_tokens == 0
        assert root.node.subtree_tokens == adapter.stats().total_tokens
        assert root.sessions_beneath == 3  # a, b, c hold KV; "gone" closed, d has not finished
        prompt = all_children(adapter, ROOT_ID)[0]
        detail = adapter.node(prompt.id, token_offset=1, token_limit=2)
        assert detail.token_ids == (2, 3) and detail.token_offset == 1
        assert detail.path_tokens == 4 and detail.sessions_beneath == 3
        leaf = all_children(adapter, prompt.id)[0]
        assert adapter.node(leaf.id).path_tokens == 4 + leaf.tokens
        with pytest.raises(UnknownNode):
            adapter.node(10**9)

    def test_sessions_views_and_orders(self, adapter):
        page = adapter.sessions("id", 0, 100)
        ids = [s.id for s in page.sessions]
        assert ids == sorted(ids) and set(ids) == {"a", "b", "c", "d", "gone"}
        views = {s.id: s for s in page.sessions}
        assert views["gone"].state == "closed" and views["gone"].tagged_nodes == 0
        assert views["a"].state == "open" and views["a"].tagged_nodes == 2
        for order, key in (("exclusive_bytes", "exclusive_bytes"), ("shared_bytes", "shared_bytes")):
            got = [getattr(s, key) for s in adapter.sessions(order, 0, 100).sessions]
            assert got == sorted(got, reverse=True)
        for sid, view in views.items():
            assert view.exclusive_bytes == adapter.plan_close(sid).freed_bytes
        total_fair = sum(v.fair_share_bytes for v in views.values())
        assert total_fair <= adapter.stats().total_bytes
        assert views["b"].exclusive_bytes == 3 * adapter.stats().bytes_per_token  # [20,21,22]
        assert views["c"].exclusive_bytes == 0  # shares its node with a
        assert views["a"].locked_tokens == 4  # the prompt, locked by d's running request
        detail = adapter.session("a")
        # the same figures; each view takes the age when it is made (so it only grows)
        assert replace(detail.session, last_activity_age_s=0.0) == replace(views["a"], last_activity_age_s=0.0)
        assert detail.session.last_activity_age_s >= views["a"].last_activity_age_s
        assert len(detail.node_ids) == 2
        with pytest.raises(UnknownSession):
            adapter.session("nobody")
        with pytest.raises(BadRequest):
            adapter.sessions("size", 0, 10)

    def test_sessions_sort_filter_and_page_over_all_sessions(self, adapter):
        """Every column's order, either way, over all the sessions; a filter over all of them; the
        page says how many match and how many there are."""
        everyone = {s.id: s for s in adapter.sessions("id", 0, 100).sessions}
        keys = {
            "exclusive_bytes": lambda s: (-s.exclusive_bytes, s.id), "shared_bytes": lambda s: (-s.shared_bytes, s.id),
            "fair_share_bytes": lambda s: (-s.fair_share_bytes, s.id), "locked_tokens": lambda s: (-s.locked_tokens, s.id),
            "tagged_nodes": lambda s: (-s.tagged_nodes, s.id), "state": lambda s: (s.state == "closed", s.id),
            "id": lambda s: s.id,
        }
        for order, key in keys.items():
            expected = [s.id for s in sorted(everyone.values(), key=key)]
            page = adapter.sessions(order, 0, 100)
            assert [s.id for s in page.sessions] == expected, order
            assert page.total == page.all_sessions == 5 and page.contains == "" and not page.reverse
            back = adapter.sessions(order, 0, 100, "", True)
            assert [s.id for s in back.sessions] == expected[::-1] and back.reverse
            assert [s.id for s in adapter.sessions(order, 1, 2, "", True).sessions] == expected[::-1][1:3]
            assert [s.id for s in adapter.sessions(order, 4, 10, "", True).sessions] == expected[:1]
            assert adapter.sessions(order, 9, 10, "", True).sessions == ()
        ages = [s.id for s in adapter.sessions("last_activity", 0, 100).sessions]
        assert set(ages) == set(everyone)
        # a filter over all of them: any case, or the state
        page = adapter.sessions("id", 0, 100, "GON")
        assert [s.id for s in page.sessions] == ["gone"] and page.total == 1 and page.all_sessions == 5
        assert page.contains == "GON"
        assert [s.id for s in adapter.sessions("id", 0, 100, "open").sessions] == ["a", "b", "c", "d"]
        assert [s.id for s in adapter.sessions("id", 0, 100, "closed").sessions] == ["gone"]
        assert [s.id for s in adapter.sessions("id", 0, 100, "a", True).sessions] == ["a"]
        assert adapter.sessions("id", 1, 1, "o").sessions == () and adapter.sessions("id", 1, 1, "o").total == 1
        nothing = adapter.sessions("exclusive_bytes", 0, 10, "zzz")
        assert nothing.sessions == () and nothing.total == 0 and nothing.all_sessions == 5
        with pytest.raises(BadRequest):
            adapter.sessions("id", 0, 10, "x" * 201)

    def test_paths_are_every_node_from_the_root_once_read_at_one_moment(self, adapter):
        """The paths to a session's tagged nodes: the root first, each parent before its children,
        each node once (a and c share their prompt), equal to reading node after node (the
        contract's default); an id not in the tree is missing, never an error for the others."""
        from radixtop.adapters.base import CacheAdapter

        tagged = adapter.session("a").node_ids + adapter.session("c").node_ids
        view = adapter.paths([*tagged, 999_999])
        assert view.node_ids == (*tagged, 999_999) and view.missing == (999_999,) and not view.capped
        ids = [n.id for n in view.nodes]
        assert ids[0] == ROOT_ID and len(ids) == len(set(ids)) and set(tagged) <= set(ids)
        position = {n.id: k for k, n in enumerate(view.nodes)}
        for n in view.nodes[1:]:
            assert position[n.parent_id] < position[n.id] and n.depth == view.nodes[position[n.parent_id]].depth + 1
        for node_id in tagged:  # every node up from a tagged one is on them
            current = adapter.node(node_id, 0, 1).node
            while current.parent_id is not None:
                assert current.parent_id in position
                current = view.nodes[position[current.parent_id]]
        default = CacheAdapter.paths(adapter, [*tagged, 999_999])
        assert ageless(default.to_dict()) == ageless(view.to_dict())
        for bad in ([], [-1], ["7"], list(range(MAX_PATHS + 1))):
            with pytest.raises(BadRequest):
                adapter.paths(bad)

    def test_match_is_read_only(self, adapter):
        before = adapter.stats()
        m = adapter.match([1, 2, 3, 4, 5, 99])
        assert (m.matched_tokens, m.partial_tokens) == (5, 1)
        assert m.partial_node_id is not None
        assert m.matched_bytes == 5 * before.bytes_per_token
        after = adapter.stats()
        assert (after.node_count, after.version) == (before.node_count, before.version)
        assert adapter.match([]).matched_tokens == 0 and adapter.match([]).node_id == ROOT_ID

    def test_changes_follow_actions(self, adapter):
        if not adapter.capabilities().changes:  # a target without a journal says so, and how
            with pytest.raises(Unsupported):
                adapter.changes(0)
            assert "journal" in adapter.capabilities().reason
            return
        v0 = adapter.stats().version
        assert adapter.changes(v0).resync is False and adapter.changes(v0).removed == ()
        freed = adapter.close_session("b")
        delta = adapter.changes(v0)
        assert set(freed.freed_node_ids) <= set(delta.removed) and delta.version > v0
        assert adapter.changes(delta.version + 1000).resync is True
        with pytest.raises(BadRequest):
            adapter.changes(-1)

    def test_export_has_every_node_parents_first(self, adapter):
        rows = list(adapter.export())
        header, nodes = rows[0], rows[1:]
        assert header["node_count"] == len(nodes) == adapter.stats().node_count
        seen = {ROOT_ID}
        for row in nodes:
            assert row["parent"] in seen
            seen.add(row["id"])
        assert sum(r["tokens"] for r in nodes) == adapter.stats().total_tokens

    def test_read_many_answers_what_each_read_answers(self, adapter):
        reads = known_reads(adapter)
        got = adapter.read_many(reads)
        assert [comparable(r) for r in got] == [comparable(read_one(adapter, op, args)) for op, args in reads]
        assert adapter.read_many([("stats", ())]) == [adapter.stats()]

    def test_read_many_answers_a_failed_read_in_its_place(self, adapter):
        reads = [("stats", ()), ("node", (987654,)), ("session", ("nobody",)), ("children", (987654, 0, 10)),
                 ("chain", (987654,)), ("session", ("a",))]
        got = adapter.read_many(reads)
        assert isinstance(got[0], Stats) and got[-1].session.id == "a"
        assert [type(r) for r in got[1:5]] == [UnknownNode, UnknownSession, UnknownNode, UnknownNode]
        for (op, args), result in zip(reads[1:5], got[1:5]):
            with pytest.raises(type(result)) as single:
                getattr(adapter, op)(*args)
            assert result.message == single.value.message

    @pytest.mark.parametrize("reads", [
        [], [("stats", ())] * (MAX_READS + 1), [("stats", ()), ("evict", (1,))], [("close_session", ("b",))],
        [("flush", ())], [("export", ())], [("stats", (1,))], [("session", ("a", "b"))],
        [("children", (ROOT_ID, 0, 10, "bytes", 5))], ["stats"], [("stats",)], [("stats", None)], [("stats", (), 1)],
    ], ids=lambda reads: f"{len(reads)}:{reads[:1]!r:.40}")
    def test_read_many_refuses_bad_input_as_a_whole(self, adapter, reads):
        before = adapter.stats()
        with pytest.raises(BadRequest):
            adapter.read_many(reads)
        after = adapter.stats()
        assert (after.version, after.available_tokens, after.closes) == (before.version, before.available_tokens, before.closes)
        assert adapter.read_many([("stats", ())] * MAX_READS)[-1].version == before.version  # the most it takes

    def test_read_many_changes_nothing(self, adapter):
        before, rows = adapter.stats(), list(adapter.export())
        for _ in range(2):
            adapter.read_many(known_reads(adapter) + [("match", ([1, 2, 3, 4, 9, 9, 77],)), ("node", (10**9,))])
        assert adapter.stats() == before and list(adapter.export()) == rows

    def test_read_many_refuses_an_op_that_is_not_a_name(self, adapter):
        with pytest.raises(BadRequest):
            adapter.read_many([(["stats"], ())])

    def test_read_many_answers_a_bad_argument_in_its_place(self, adapter):
        """A read its single call refuses fails in its place, as an unknown node does, not the batch."""
        bad = [("children", (ROOT_ID, 0, 10, "size")), ("children", (ROOT_ID, 0, 0)), ("chain", (ROOT_ID, 0)),
               ("node", (ROOT_ID, 0, 0)), ("sessions", ("size",)), ("changes", (-1,))]
        got = adapter.read_many([("stats", ()), *bad])
        assert isinstance(got[0], Stats)
        assert [type(r) for r in got[1:]] == [type(read_one(adapter, op, args)) for op, args in bad]

    def test_read_many_answers_an_out_of_range_id_as_its_single_call_does(self, adapter):
        reads = [("node", (2**64,)), ("children", (2**63,))]
        got = adapter.read_many([*reads, ("stats", ())])
        assert isinstance(got[-1], Stats) and all(isinstance(r, AdapterError) for r in got[:-1])
        assert [type(r) for r in got[:-1]] == [type(read_one(adapter, op, args)) for op, args in reads]

    def test_plan_then_close_frees_exactly_the_plan(self, adapter):
        before = adapter.stats()
        plan = adapter.plan_close("a")
        assert adapter.stats().version == before.version  # a plan changes nothing
        result = adapter.close_session("a")
        assert sorted(result.freed_node_ids) == sorted(plan.freed_node_ids)
        assert (result.freed_tokens, result.freed_bytes) == (plan.freed_tokens, plan.freed_bytes)
        assert adapter.stats().available_tokens == before.available_tokens + plan.freed_tokens
        assert {k.reason for k in plan.kept} <= {"locked", "has_children", "shared", "root"}

    def test_closing_twice_says_so_and_frees_nothing(self, adapter):
        first = adapter.close_session("b")
        second = adapter.close_session("b")
        assert first.freed_tokens == 3 and not first.already_closed
        assert second.already_closed and second.freed_tokens == 0 and second.freed_node_ids == ()
        assert adapter.plan_close("b").state == "closed"

    def test_unknown_session_actions(self, adapter):
        with pytest.raises(UnknownSession):
            adapter.close_session("nobody")
        with pytest.raises(UnknownSession):
            adapter.plan_close("nobody")

    def test_evict_and_flush(self, adapter):
        st = adapter.stats()
        r = adapter.evict(1)
        assert r.requested_tokens == 1 and r.evicted_tokens >= 1 and r.evicted_bytes == r.evicted_tokens * st.bytes_per_token
        with pytest.raises(BadRequest):
            adapter.evict(-5)
        flushed = adapter.flush()
        after = adapter.stats()
        assert after.evictable_tokens == 0 and flushed.flushed
        assert flushed.freed_tokens == st.evictable_tokens - r.evicted_tokens
        assert after.unevictable_tokens == st.unevictable_tokens  # the running request keeps its path
        assert after.protected_tokens == st.protected_tokens
        assert "locked" in flushed.message

    def test_read_only_refuses_every_action(self, read_only_adapter):
        before = read_only_adapter.stats()
        assert read_only_adapter.capabilities().read_only
        for act in (lambda: read_only_adapter.close_session("a"), lambda: read_only_adapter.evict(10),
                    read_only_adapter.flush):
            with pytest.raises(ReadOnly):
                act()
        assert read_only_adapter.plan_close("a").freed_tokens >= 0  # a dry run is still allowed
        after = read_only_adapter.stats()
        assert (after.version, after.available_tokens) == (before.version, before.available_tokens)

    def test_columnar_export_equals_the_row_export(self, adapter):
        columns = adapter.export_columns()
        rows = list(adapter.export())[1:]
        assert columns.node_count == len(rows) == adapter.stats().node_count
        for name in ("id", "parent", "tokens", "lock_ref", "hit_count"):
            assert list(columns.columns[name]) == [r[name] for r in rows]
        assert columns.holders == {r["id"]: tuple(r["holders"]) for r in rows if r["holders"]}

    def test_session_views_follow_an_action_at_once(self, adapter):
        assert {s.id: s.state for s in adapter.sessions("id", 0, 100).sessions}["b"] == "open"
        adapter.close_session("b")
        view = adapter.session("b").session
        assert view.state == "closed" and view.exclusive_bytes == 0
