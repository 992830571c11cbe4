"""The in-process SGLang adapter over the REAL SGLang 0.5.23 caches (tests/on_sglang/ref/known23.py):
``UnifiedRadixCache`` with sessions (Python tree core; close only dereferences), the plain
``RadixCache`` (no sessions at all), and ``UnifiedRadixCache`` on the Rust tree core (no Python
nodes). Every read and action goes through the owner queue a scheduler thread drains.

Expectations come from SGLang's own objects (its tree, allocator, KV pool, session tracker and
its own matches), not from the bundled cache's numbers: 0.5.23 inserts ``[prompt][output]``,
keeps KV for ``input + output[:-1]``, tags a session's frontier node only, and frees nothing on
close. The contract tests that hold unchanged are imported from tests/contract/suite.py; the ones
written against the bundled cache's figures have 0.5.23 counterparts here.

Needs sglang 0.5.23 (``.venv-sglang23``, built by ``.ci/setup-sglang23``); skipped otherwise.
"""

from __future__ import annotations

import pytest

from tests.support.engines import SGLANG_VERSION

if SGLANG_VERSION != "0.5.23":  # tests/conftest.py collects this file only beside 0.5.23
    raise RuntimeError(f"needs sglang 0.5.23 (found {SGLANG_VERSION}): run it with .venv-sglang23 "
                       "(.ci/setup-sglang23), as .ci/test does")

from array import array  # noqa: E402

from radixtop.adapters.errors import BadRequest, ReadOnly, TargetTimeout, UnknownNode, UnknownSession, Unsupported
from radixtop.adapters.model import ROOT_ID
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter  # noqa: E402
from radixtop.adapters.sglang.trees import PlainRadixTree, RustUnifiedTree, UnifiedTree  # noqa: E402
from tests.contract.suite import ContractSuite, all_children
from tests.on_sglang.ref import drive23, known23  # noqa: E402

pytestmark = pytest.mark.sglang

BPT = 256  # the "tiny" geometry: 2 layers x 2 heads x (8 + 8) x 4 bytes


@pytest.fixture(scope="module", autouse=True)
def sgl():
    try:
        return drive23.import_sglang23()
    except drive23.SGLang23UnavailableError as exc:  # pragma: no cover - a broken install
        pytest.fail(str(exc))


@pytest.fixture
def known():
    with known23.known_adapter() as built:
        yield built


@pytest.fixture
def adapter(known):
    return known[0]


@pytest.fixture
def read_only_adapter():
    with known23.known_adapter(read_only=True) as (a, _, _):
        yield a


class TestSGLang023(ContractSuite):
    """The contract checks that hold unchanged on 0.5.23. Those written against the bundled
    cache's figures (0.5.23 inserts [prompt][output], keeps KV for input + output[:-1], tags a
    session's frontier node only and frees nothing on close) have their 0.5.23 counterparts below."""

    test_chain_truncates_at_the_limit = None
    test_sessions_views_and_orders = None
    test_sessions_sort_filter_and_page_over_all_sessions = None
    test_match_is_read_only = None
    test_read_many_answers_what_each_read_answers = None
    test_read_many_answers_a_failed_read_in_its_place = None
    test_read_many_refuses_bad_input_as_a_whole = None
    test_read_many_changes_nothing = None
    test_read_many_refuses_an_op_that_is_not_a_name = None
    test_read_many_answers_a_bad_argument_in_its_place = None
    test_read_many_answers_an_out_of_range_id_as_its_single_call_does = None
    test_plan_then_close_frees_exactly_the_plan = None
    test_closing_twice_says_so_and_frees_nothing = None


# ----- helpers: what SGLang's own objects say -----


def on_owner(scheduler, fn):
    """Run ``fn`` on the scheduler thread (SGLang's tree is only touched there)."""
    return scheduler.owner.call(fn, 10.0)


def sglang_rows(cache) -> dict[int, dict]:
    """Every node by id from a direct walk of SGLang's tree, with its parent, path and subtree."""
    rows: dict[int, dict] = {}
    root = cache.root_node
    order = []
    stack = [(c, ROOT_ID, ()) for c in root.children.values()]
    while stack:
        node, parent, prefix = stack.pop()
        view = drive23.node_view(cache, node)
        path = prefix + tuple(view["tokens"])
        rows[node.id] = {**view, "parent": parent, "path": path, "children": len(node.children)}
        order.append(node)
        stack.extend((c, node.id, path) for c in node.children.values())
    for node in reversed(order):
        rows[node.id]["subtree"] = len(node.key) + sum(rows[c.id]["subtree"] for c in node.children.values())
    return rows


def frontier(cache, sid) -> set[int]:
    return {n.id for n in drive23.session_leaves(cache, sid)}


def covered(cache, sid) -> set[int]:
    """The nodes on the paths from ``sid``'s frontier nodes up to the root."""
    out, root = set(), cache.root_node
    for node in drive23.session_leaves(cache, sid):
        while node is not root:
            out.add(node.id)
            node = node.parent
    return out


def adapter_tree(a) -> dict[int, tuple]:
    """Every node the adapter shows, walked through children()/node()."""
    seen, stack = {}, [ROOT_ID]
    while stack:
        node_id = stack.pop()
        for child in a.children(node_id, 0, 1000).children:
            detail = a.node(child.id, 0, 1000)
            seen[child.id] = (child, detail)
            stack.append(child.id)
    return seen


def assert_views_agree(a, cache, pools) -> None:
    """stats, every node and the export against a direct walk of SGLang's tree."""
    st = a.stats()
    assert st.capacity_tokens == pools.allocator.size
    assert st.available_tokens == pools.allocator.available_size()
    assert st.evictable_tokens == cache.evictable_size()
    running = st.capacity_tokens - st.available_tokens - cache.evictable_size() - cache.protected_size()
    assert st.unevictable_tokens - st.protected_tokens == running >= 0
    assert st.protected_tokens == cache.protected_size()  # SGLang's protected_size, by its name
    assert st.unevictable_tokens == cache.protected_size() + running
    assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens
    assert st.available_bytes + st.evictable_bytes + st.unevictable_bytes == st.capacity_bytes
    total = cache.total_size()
    assert st.total_tokens == (total[0] if isinstance(total, tuple) else total)
    kv = pools.kv_pool
    per_token = sum(t[0].numel() * t.element_size() for t in (*kv.k_buffer, *kv.v_buffer))
    assert st.bytes_per_token == per_token == BPT  # measured on SGLang's own K/V tensors
    assert st.geometry.name == "tiny" and st.geometry.page_size == pools.page_size

    rows = sglang_rows(cache)
    shown = adapter_tree(a)
    assert set(shown) == set(rows) and st.node_count == len(rows)
    for node_id, (view, detail) in shown.items():
        row = rows[node_id]
        assert view.parent_id == row["parent"]
        assert view.tokens == len(row["tokens"]) == len(row["slots"])
        assert view.bytes == view.tokens * BPT
        assert view.lock_ref == row["lock_ref"] and view.hit_count == row["hit_count"]
        assert list(view.holders) == row["session_ids"]
        assert view.num_children == row["children"] and view.subtree_tokens == row["subtree"]
        assert view.first_tokens == tuple(row["tokens"][:16])
        assert detail.token_ids == tuple(row["tokens"])
        assert detail.path_tokens == len(row["path"])
        assert view.depth == detail.node.depth
        if not a.tree.clock_is_time:  # UnifiedRadixCache stamps a counter: no age to show
            assert view.access_age_s == view.created_age_s == 0.0
    root = a.node(ROOT_ID)
    assert root.node.subtree_tokens == st.total_tokens == sum(len(r["tokens"]) for r in rows.values())
    exported = list(a.export())[1:]
    assert {r["id"]: (r["parent"], r["tokens"], r["lock_ref"], list(r["holders"])) for r in exported} == {
        i: (r["parent"], len(r["tokens"]), r["lock_ref"], r["session_ids"]) for i, r in rows.items()}


def assert_match_agrees(a, cache, queries) -> None:
    """The adapter's read-only match equals SGLang's: first its read-only FULL match (Unified),
    then its real ``match_prefix`` (which splits nodes: run last, on the owner thread)."""
    sgl = drive23.import_sglang23()
    before = drive23.tree_rows(cache)
    ours = [a.match(q) for q in queries]
    assert drive23.tree_rows(cache) == before  # nothing split, no access time, no hit count
    for q, m in zip(queries, ours):
        assert m.query_tokens == len(q) and m.matched_bytes == m.matched_tokens * BPT
        assert (m.partial_node_id is None) == (m.partial_tokens == 0)
        path = 0 if m.node_id == ROOT_ID else a.node(m.node_id).path_tokens
        assert m.matched_tokens == path + m.partial_tokens
        core = getattr(cache, "tree_core", None)
        if core is not None and hasattr(core, "match_full_device_prefix"):
            matched, deepest, _ = core.match_full_device_prefix(sgl.RadixKey(array("q", q)))
            assert matched == m.matched_tokens
            want = m.partial_node_id if m.partial_node_id is not None else m.node_id
            assert deepest == (cache.root_node.id if want == ROOT_ID else want)
    for q, m in zip(queries, ours):  # SGLang's own match, one query at a time
        result = cache.match_prefix(sgl.MatchPrefixParams(key=sgl.RadixKey(array("q", q))))
        assert result.device_prefix_len == m.matched_tokens, q


QUERIES = ([], [1], [1, 2, 3, 4], [1, 2, 3, 4, 5, 99], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 99],
           [1, 2, 3, 4, 20, 21, 22], [1, 2, 3, 4, 9, 9], [50, 51, 52, 53, 54], [50, 51, 52, 53, 54, 55, 56],
           [30, 31, 32], [40, 41], [7, 7, 7])


# ----- UnifiedRadixCache with sessions (Python core): the views against SGLang's objects -----


def test_the_reader_and_capabilities(adapter):
    assert isinstance(adapter.tree, UnifiedTree) and adapter.tree.policy == "deref"
    assert adapter.cache._tree_core_backend == "python"
    caps = adapter.capabilities()
    assert caps.tree and caps.sessions and caps.close and caps.evict and caps.flush
    assert not caps.changes and not caps.read_only
    assert "frees 0 tokens now" in caps.reason and "counter" in caps.reason and "journal" in caps.reason


def test_views_agree_with_sglangs_own_objects(known):
    a, k, scheduler = known
    on_owner(scheduler, lambda: assert_views_agree(a, k.cache, k.pools))
    # The known cache as 0.5.23 built it: [prompt][output] nodes, KV for input + output[:-1].
    rows = sglang_rows(k.cache)
    paths = {r["path"]: r for r in rows.values()}
    assert paths[(1, 2, 3, 4)]["lock_ref"] == 1  # d's running request
    assert (50, 51, 52, 53, 54, 55) in paths and (50, 51, 52, 53, 54, 55, 56) not in paths
    st = a.stats()
    assert st.capacity_tokens == known23.CAPACITY
    assert st.unevictable_tokens - st.protected_tokens == 2 and st.node_count == len(rows)  # d's [9, 9] beyond its prefix


def test_holders_and_session_refs_agree(known):
    a, k, _ = known
    cache = k.cache
    full = cache.components[drive23.import_sglang23().ComponentType.FULL]
    rows = sglang_rows(cache)
    for sid in ("a", "b", "c"):
        assert frontier(cache, sid)
        for node_id in frontier(cache, sid):
            assert sid in a.node(node_id).node.holders
    assert "gone" not in full._session_leaves and "d" not in full._session_leaves
    # a's second turn moved its frontier: one tagged node, as SGLang indexes it
    assert len(frontier(cache, "a")) == 1
    # sessions beneath a node == the open sessions covering it == SGLang's session_ref
    for node_id, row in rows.items():
        assert a.node(node_id).sessions_beneath == row["session_ref"] == sum(
            node_id in covered(cache, s) for s in ("a", "b", "c"))


def test_sessions_under_deref(adapter, known):
    a, k, _ = known
    cache = k.cache
    page = a.sessions("id", 0, 100)
    views = {s.id: s for s in page.sessions}
    assert list(views) == sorted(views) and set(views) == {"a", "b", "c", "d", "gone"}
    assert views["gone"].state == "closed" and views["gone"].tagged_nodes == 0
    assert views["d"].state == "open" and views["d"].tagged_nodes == 0  # running, nothing tagged
    rows = sglang_rows(cache)
    for sid in ("a", "b", "c"):
        v = views[sid]
        on_path = sum(len(rows[n]["tokens"]) for n in covered(cache, sid))
        assert v.state == "open" and v.tagged_nodes == len(frontier(cache, sid))
        assert v.exclusive_bytes == 0 and v.shared_bytes == on_path * BPT  # a close frees nothing now
        assert v.locked_tokens == sum(len(rows[n]["tokens"]) for n in covered(cache, sid) if rows[n]["lock_ref"])
        assert v.last_activity_age_s is None  # 0.5.23 stamps a counter, not a time
        assert a.session(sid).node_ids == tuple(sorted(frontier(cache, sid)))
    assert views["a"].locked_tokens == 4  # the prompt, locked by d's running request
    fair = {n: rows[n]["tokens"] for n in rows}
    assert sum(v.fair_share_bytes for v in views.values()) == pytest.approx(
        sum(len(fair[n]) for n in set().union(*(covered(cache, s) for s in "abc"))) * BPT, abs=3)
    for order in ("exclusive_bytes", "shared_bytes", "last_activity"):
        assert {s.id for s in a.sessions(order, 0, 100).sessions} == set(views)
    shared = [s.shared_bytes for s in a.sessions("shared_bytes", 0, 100).sessions]
    assert shared == sorted(shared, reverse=True)
    st = a.stats()
    assert (st.open_sessions, st.closed_sessions, st.closes) == (4, 1, 1)
    with pytest.raises(UnknownSession):
        a.session("nobody")
    with pytest.raises(BadRequest):
        a.sessions("size", 0, 10)


def test_the_tree_knows_open_sessions_without_a_session_controller():
    """0.5.23 opens a generation for every request with a session id: without the server's
    session list the adapter still knows a, b, c and the running d."""
    known = known23.build_known()
    adapter = SGLangInProcessAdapter(known.cache, None, model="tiny")
    adapter.close_session("gone")
    st = adapter.stats()
    assert (st.open_sessions, st.closed_sessions) == (4, 1)
    assert {s.id: s.state for s in adapter.sessions("id", 0, 100).sessions} == {
        "a": "open", "b": "open", "c": "open", "d": "open", "gone": "closed"}
    assert adapter.plan_close("d").state == "open" and adapter.plan_close("d").released_holds == 0


def test_plan_close_under_deref(adapter, known):
    a, k, _ = known
    cache = k.cache
    before = a.stats()
    for sid in ("a", "b", "c", "d"):
        plan = a.plan_close(sid)
        assert plan.policy == "deref" and plan.state == "open"
        assert plan.freed_node_ids == () and plan.freed_tokens == plan.freed_bytes == 0
        assert plan.released_holds == len(frontier(cache, sid))
        assert {x.node_id for x in plan.kept} == frontier(cache, sid)
        assert all(x.reason == "deref" for x in plan.kept)
        assert all(x.tokens == len(cache.tree_core.node_by_id(x.node_id).key) for x in plan.kept)
    gone = a.plan_close("gone")
    assert gone.state == "closed" and gone.released_holds == 0 and gone.kept == ()
    after = a.stats()
    assert (after.version, after.available_tokens) == (before.version, before.available_tokens)
    with pytest.raises(UnknownSession):
        a.plan_close("nobody")


def test_match_agrees_with_sglangs_match(known):
    a, k, scheduler = known
    on_owner(scheduler, lambda: assert_match_agrees(a, k.cache, [list(q) for q in QUERIES]))
    m = a.match([1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 99])
    assert m.matched_tokens == 9 and m.partial_node_id is None  # r2's last output [11] has no KV


# ----- actions -----


def test_close_goes_through_release_radix_session_then_eviction_frees(known):
    a, k, scheduler = known
    cache, allocator = k.cache, k.pools.allocator
    rows = sglang_rows(cache)
    b_nodes = covered(cache, "b")
    b_tags = frontier(cache, "b")
    plan = a.plan_close("b")
    before = allocator.available_size()
    result = a.close_session("b")
    assert allocator.available_size() == before  # close only dereferences
    assert (result.policy, result.already_closed, result.freed_tokens, result.freed_bytes) == ("deref", False, 0, 0)
    assert result.freed_node_ids == () and result.released_holds == plan.released_holds == len(b_tags) == 1
    refs = cache.session_refs
    assert "b" in refs._closed_session_ids and "b" not in refs._session_generations
    assert "b" not in cache.components[0]._session_leaves
    after = sglang_rows(cache)
    assert set(after) == set(rows)  # nothing left the tree
    for node_id in rows:
        assert after[node_id]["session_ref"] == rows[node_id]["session_ref"] - (node_id in b_nodes)
    view = a.session("b").session
    assert view.state == "closed" and view.tagged_nodes == 0 and view.exclusive_bytes == 0
    st = a.stats()
    assert (st.closes, st.freed_by_close_tokens, st.closed_sessions, st.open_sessions) == (2, 0, 2, 3)

    # Eviction takes the unreferenced, unlocked nodes first -- b's former chain among them.
    unheld = {i for i, r in after.items() if r["session_ref"] == 0 and r["lock_ref"] == 0}
    assert b_nodes - {i for i, r in after.items() if r["lock_ref"]} <= unheld
    tokens = sum(len(after[i]["tokens"]) for i in unheld)
    free_before = allocator.available_size()
    evicted = a.evict(tokens)
    assert (evicted.evicted_tokens, evicted.evicted_nodes) == (tokens, len(unheld))
    assert evicted.evicted_bytes == tokens * BPT
    assert allocator.available_size() == free_before + tokens
    left = sglang_rows(cache)
    assert set(left) == set(after) - unheld and all(r["session_ref"] > 0 or r["lock_ref"] for r in left.values())
    on_owner(scheduler, cache.sanity_check)
    on_owner(scheduler, lambda: assert_views_agree(a, cache, k.pools))
    assert a.stats().evicted_tokens == tokens
    with pytest.raises(UnknownNode):  # an evicted node's id
        a.node(next(iter(unheld)))


def test_chain_truncates_at_the_limit_on_sglang(adapter, known):
    """contract.test_chain_truncates_at_the_limit, with 0.5.23's nodes: [50, 51], then
    [52, 53] and [54, 55] (each finished request's last output token has no KV)."""
    top = next(c for c in all_children(adapter, ROOT_ID) if c.first_tokens[:1] == (50,))
    whole = adapter.chain(top.id)
    assert [n.first_tokens for n in whole.nodes] == [(52, 53), (54, 55)] and not whole.truncated
    cut = adapter.chain(top.id, 1)
    assert [n.id for n in cut.nodes] == [whole.nodes[0].id] and cut.truncated


def test_match_is_read_only_on_sglang(adapter):
    """contract.test_match_is_read_only: c's admission split [5, 6] at 5 (0.5.23 matches at most
    len(input) - 1), so [1, 2, 3, 4, 5, 99] ends on a node boundary here."""
    before = adapter.stats()
    m = adapter.match([1, 2, 3, 4, 5, 99])
    assert (m.matched_tokens, m.partial_tokens, m.partial_node_id) == (5, 0, None)
    assert adapter.node(m.node_id).path_tokens == 5 and m.matched_bytes == 5 * BPT
    m = adapter.match([1, 2, 3, 4, 20, 99])
    assert (m.matched_tokens, m.partial_tokens) == (5, 0)
    m = adapter.match([50, 51, 52, 99])
    assert (m.matched_tokens, m.partial_tokens) == (3, 1) and m.partial_node_id is not None
    after = adapter.stats()
    assert (after.node_count, after.version) == (before.node_count, before.version)
    assert adapter.match([]).matched_tokens == 0 and adapter.match([]).node_id == ROOT_ID


def test_plan_then_close_frees_exactly_the_plan_deref(adapter):
    before = adapter.stats()
    plan = adapter.plan_close("a")
    assert adapter.stats().version == before.version
    result = adapter.close_session("a")
    assert sorted(result.freed_node_ids) == sorted(plan.freed_node_ids) == []
    assert (result.freed_tokens, result.freed_bytes) == (plan.freed_tokens, plan.freed_bytes) == (0, 0)
    assert adapter.stats().available_tokens == before.available_tokens
    assert {x.reason for x in plan.kept} == {"deref"}


def test_closing_twice_says_so_and_frees_nothing_deref(adapter):
    first = adapter.close_session("b")
    second = adapter.close_session("b")
    assert not first.already_closed and first.freed_tokens == 0 and first.released_holds == 1
    assert second.already_closed and second.freed_tokens == 0 and second.freed_node_ids == ()
    assert second.released_holds == 0
    assert adapter.plan_close("b").state == "closed"


def test_a_new_request_reopens_a_closed_session(known):
    a, k, scheduler = known
    a.sizes_max_age = 0.0  # a request outside the adapter: read afresh
    a.close_session("b")
    on_owner(scheduler, lambda: drive23.run_request(k.cache, k.pools, [1, 2, 3, 4, 20, 21, 22, 60], [61],
                                                  session_id="b"))
    assert a.session("b").session.state == "open" and a.plan_close("b").released_holds == 1


def test_flush_keeps_what_the_running_request_locks_then_frees_all(known):
    a, k, scheduler = known
    st = a.stats()
    flushed = a.flush()
    assert flushed.flushed and flushed.freed_tokens == st.evictable_tokens and "locked" in flushed.message
    after = a.stats()
    assert after.evictable_tokens == 0 and after.unevictable_tokens == st.unevictable_tokens
    rows = sglang_rows(k.cache)
    assert flushed.freed_nodes == st.node_count - len(rows)
    assert [r["path"] for r in rows.values()] == [(1, 2, 3, 4)]  # d's locked prefix only
    on_owner(scheduler, k.finish_running)  # d finishes: its KV joins the tree, unlocked
    assert a.stats().unevictable_tokens == 0
    assert a.flush().freed_tokens > 0 and a.stats().available_tokens == a.stats().capacity_tokens


def test_read_only_refuses_actions_but_plans(read_only_adapter):
    a = read_only_adapter
    for act in (lambda: a.close_session("b"), lambda: a.evict(1), a.flush):
        with pytest.raises(ReadOnly):
            act()
    assert a.plan_close("b").policy == "deref" and a.sessions("id", 0, 10).total == 5
    assert "read-only" in a.capabilities().reason


def test_unknown_ids(adapter):
    for read in (lambda: adapter.children(987654), lambda: adapter.node(987654), lambda: adapter.chain(987654)):
        with pytest.raises(UnknownNode):
            read()
    for act in (lambda: adapter.session("nobody"), lambda: adapter.plan_close("nobody"),
                lambda: adapter.close_session("nobody")):
        with pytest.raises(UnknownSession):
            act()
    assert "nobody" not in adapter.cache.session_refs._closed_session_ids  # never tombstoned


def test_a_stuck_scheduler_times_out_cleanly_and_runs_nothing_late(known):
    a, k, scheduler = known
    a.timeout = 0.3
    scheduler.running.clear()  # the scheduler stops draining between batches
    with pytest.raises(TargetTimeout, match="did not take the request within 0.3s"):
        a.close_session("b")
    with pytest.raises(TargetTimeout):
        a.stats()
    scheduler.running.set()
    assert a.stats().closes == 1  # only "gone": the timed-out close never ran
    assert "b" in k.cache.components[0]._session_leaves
    assert "b" not in k.cache.session_refs._closed_session_ids


@pytest.mark.parametrize("page_size", [4])
def test_paged_unified_match_and_views(page_size):
    cache, pools = drive23.build_unified_cache23(64, page_size=page_size, geometry=known23.TINY)
    drive23.run_request(cache, pools, list(range(1, 11)), [50, 51], session_id="A")
    drive23.run_request(cache, pools, [1, 2, 3, 4, 9, 9, 9, 9, 9], [60], session_id="B")
    a = SGLangInProcessAdapter(cache, None, model="tiny")
    assert a.stats().geometry.page_size == page_size
    assert_views_agree(a, cache, pools)
    assert_match_agrees(a, cache, [list(range(1, 12)), [1, 2, 3], [1, 2, 3, 4, 9, 9, 9, 9, 7], [1, 2, 3, 4, 5, 6, 7]])


# ----- 0.5.23 RadixCache: a tree, no sessions -----


def test_plain_radix_cache_tree_stats_match_evict():
    with known23.known_adapter("radix") as (a, k, scheduler):
        assert isinstance(a.tree, PlainRadixTree) and a.tree.policy is None
        caps = a.capabilities()
        assert caps.tree and caps.evict and caps.flush and not caps.sessions and not caps.close
        assert "0.5.17+ RadixCache has none" in caps.reason
        on_owner(scheduler, lambda: assert_views_agree(a, k.cache, k.pools))
        st = a.stats()
        running = st.unevictable_tokens - st.protected_tokens
        assert (st.open_sessions, st.closed_sessions, running) == (None, None, 2)  # no sessions: unknown
        assert all(not c.holders for c in all_children(a, ROOT_ID))
        for call in (lambda: a.sessions(), lambda: a.session("a"), lambda: a.plan_close("a"),
                     lambda: a.close_session("a")):
            with pytest.raises(Unsupported, match="0.5.17\\+ RadixCache has none"):
                call()
        rows = sglang_rows(k.cache)
        leaves = [r for r in rows.values() if not r["children"] and not r["lock_ref"]]
        oldest = min(leaves, key=lambda r: r["last_access_time"])  # LRU
        evicted = a.evict(1)
        assert (evicted.evicted_tokens, evicted.evicted_nodes) == (len(oldest["tokens"]), 1)
        assert oldest["id"] not in sglang_rows(k.cache)
        flushed = a.flush()
        assert flushed.freed_tokens == st.evictable_tokens - evicted.evicted_tokens and "locked" in flushed.message
        assert [r["path"] for r in sglang_rows(k.cache).values()] == [(1, 2, 3, 4)]
        on_owner(scheduler, lambda: assert_views_agree(a, k.cache, k.pools))
    with known23.known_adapter("radix") as (a, k, scheduler):
        on_owner(scheduler, lambda: assert_match_agrees(a, k.cache, [list(q) for q in QUERIES]))


def test_unified_without_sessions_python_core():
    with known23.known_adapter("unified-nosessions") as (a, k, scheduler):
        assert isinstance(a.tree, UnifiedTree) and a.tree.policy is None
        caps = a.capabilities()
        assert caps.tree and not caps.sessions and "--enable-session-radix-cache" in caps.reason
        on_owner(scheduler, lambda: assert_views_agree(a, k.cache, k.pools))
        with pytest.raises(Unsupported, match="--enable-session-radix-cache"):
            a.plan_close("a")
        evicted = a.evict(1)
        assert evicted.evicted_tokens >= 1 and evicted.evicted_nodes == 1


# ----- UnifiedRadixCache on the Rust tree core: totals, no tree -----


def test_rust_core_has_stats_but_no_tree():
    with known23.known_adapter("unified-nosessions", tree_core_backend="rust") as (a, k, scheduler):
        assert k.cache._tree_core_backend == "rust", "0.5.23's wheel ships the Rust TreeCore; it must load here"
        assert isinstance(a.tree, RustUnifiedTree)
        caps = a.capabilities()
        assert not caps.tree and not caps.sessions and not caps.close and caps.evict and caps.flush
        assert "Rust tree core" in caps.reason and "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python" in caps.reason
        st = a.stats()
        allocator = k.pools.allocator
        assert st.capacity_tokens == allocator.size and st.available_tokens == allocator.available_size()
        assert st.evictable_tokens == k.cache.evictable_size() > 0
        assert st.unevictable_tokens == k.cache.protected_size() + 2 and st.protected_tokens == k.cache.protected_size()
        assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens
        assert st.total_tokens == k.cache.total_size()[0] and st.bytes_per_token == BPT
        assert st.node_count is None and st.open_sessions is None  # it cannot tell: unknown, never 0
        for read in (lambda: a.children(ROOT_ID), lambda: a.node(ROOT_ID), lambda: a.chain(ROOT_ID),
                     lambda: a.match([1, 2, 3]), lambda: list(a.export())):
            with pytest.raises(Unsupported, match="Rust tree core"):
                read()
        with pytest.raises(Unsupported, match="no sessions"):
            a.sessions()
        evicted = a.evict(3)
        assert evicted.evicted_tokens >= 3 and evicted.evicted_nodes is None  # it counts tokens only: unknown
        assert a.stats().available_tokens == st.available_tokens + evicted.evicted_tokens
        flushed = a.flush()
        assert flushed.freed_tokens == st.evictable_tokens - evicted.evicted_tokens and flushed.freed_nodes is None
        after = a.stats()
        assert after.evictable_tokens == 0 and after.unevictable_tokens == st.unevictable_tokens


def test_tiers_come_from_the_unified_nodes_full_component():
    """HiCache's fields on 0.5.23's unified node (its FULL component's ``value`` and
    ``host_value``, what ``backuped`` reads) give the node's tiers."""
    from radixtop.adapters.sglang.trees import FULL

    with known23.known_adapter() as (a, k, _):
        kids = a.children(ROOT_ID, 0, 100).children
        assert kids and all(c.tiers == ("GPU",) for c in kids)
        node = next(iter(drive23.root_node(k.cache).children.values()))
        data = node.component_data[FULL]
        data.host_value = data.value.clone()
        assert node.backuped and a.node(node.id).node.tiers == ("GPU", "host")
        device, data.value = data.value, None
        try:
            assert a.node(node.id).node.tiers == ("host",)
        finally:
            data.value, data.host_value = device, None
