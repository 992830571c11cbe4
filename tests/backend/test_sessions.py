"""The seed's session rules, one test per rule, and the deref close policy."""

from __future__ import annotations

import pytest

from radixtop.gpu_backend.sessions import CLOSED_SESSION_TOMBSTONE_LIMIT
from tests.support.engines import check_invariants, make_scheduler


def node_keys(s) -> list[list[int]]:
    return sorted(list(n.key) for n in s.cache.iter_nodes())


def holders(s, path: list[int]) -> set[str]:
    match = s.cache.lookup(path)
    assert match.prefix_len == len(path) and match.partial_node is None
    return set(match.last_node.session_ids or ())


def test_finishing_request_tags_the_node_where_its_key_ends():
    s = make_scheduler()
    s.request("r1", [1, 2, 3], [4], "a")
    assert holders(s, [1, 2, 3, 4]) == {"a"}
    s.request("r2", [1, 2, 3, 4], [5, 6], "b")
    assert holders(s, [1, 2, 3, 4]) == {"a"} and holders(s, [1, 2, 3, 4, 5, 6]) == {"b"}
    s.request("r3", [1, 2, 3, 4], [], "b")  # ends on an existing node: b holds it too
    assert holders(s, [1, 2, 3, 4]) == {"a", "b"}
    s.request("r4", [9, 9], [9], None)  # no session: tags nothing
    assert holders(s, [9, 9, 9]) == set()
    check_invariants(s)


def test_sglang_two_session_example_shared_node_survives_first_close():
    # SGLang's own example: two sessions end on the same node; the first close keeps it,
    # the last holder's close frees it.
    s = make_scheduler()
    s.request("r1", [1, 2, 3], [4, 5], "s1")
    s.request("r2", [1, 2, 3], [4, 5], "s2")
    assert holders(s, [1, 2, 3, 4, 5]) == {"s1", "s2"}
    first = s.close_session("s1")
    assert (first.freed_nodes, first.freed_tokens) == (0, 0)
    assert holders(s, [1, 2, 3, 4, 5]) == {"s2"}
    last = s.close_session("s2")
    # r2's match split the node at [1,2,3]: the walk frees [4,5], then its parent.
    assert (last.freed_nodes, last.freed_tokens) == (2, 5)
    assert s.cache.node_count() == 0 and s.pool.allocator.available_size() == 256
    check_invariants(s)


def test_close_walks_up_freeing_unshared_chain_and_keeps_shared_prefix():
    s = make_scheduler()
    s.request("r1", [1, 2, 3], [4], "a")  # a: [1,2,3,4]
    s.request("r2", [1, 2, 3, 4, 5], [6], "a")  # a: [5,6] below it
    s.request("r3", [1, 2, 7], [8], "b")  # b splits [1,2,3,4] into [1,2] + [3,4]
    assert node_keys(s) == [[1, 2], [3, 4], [5, 6], [7, 8]]
    expected = [s.cache.lookup([1, 2, 3, 4, 5, 6]).last_node.id, s.cache.lookup([1, 2, 3, 4]).last_node.id]
    result = s.close_session("a")
    # [5,6] freed, then its parent [3,4] (a's other tag) freed; [1,2] has b's child: kept.
    assert list(result.freed_node_ids) == expected
    assert result.freed_tokens == 4
    assert node_keys(s) == [[1, 2], [7, 8]]
    check_invariants(s)


def test_close_stops_at_a_locked_node():
    s = make_scheduler()
    s.request("r1", [1, 2, 3], [4], "a")
    s.begin("r2", [1, 2, 3, 4, 9])  # locks a's node while running
    assert s.close_session("a").freed_nodes == 0
    plan_kept = s.cache.plan_close("a")
    assert plan_kept.freed_nodes == 0
    s.finish("r2", [])
    assert node_keys(s) == [[1, 2, 3, 4], [9]]
    check_invariants(s)


def test_close_stops_at_a_node_with_children():
    s = make_scheduler()
    s.request("r1", [1, 2], [3], "a")
    s.request("r2", [1, 2, 3, 4], [5], None)  # an untagged child below a's node
    plan = s.cache.plan_close("a")
    assert plan.freed_nodes == 0 and [k.reason for k in plan.kept] == ["has_children"]
    assert s.close_session("a").freed_nodes == 0
    assert holders(s, [1, 2, 3]) == set()  # the hold is dropped all the same
    check_invariants(s)


def test_close_stops_where_another_session_still_holds():
    s = make_scheduler()
    s.request("r1", [1, 2], [3], "b")
    s.request("r2", [1, 2, 3, 4], [5], "a")
    plan = s.cache.plan_close("a")
    assert plan.freed_tokens == 2 and [k.reason for k in plan.kept] == ["shared"]
    result = s.close_session("a")
    assert (result.freed_nodes, result.freed_tokens) == (1, 2)
    assert node_keys(s) == [[1, 2, 3]]
    check_invariants(s)


def test_close_under_a_locked_node_with_two_of_its_children():
    """A session holds two children of a node a running request locks: its close frees both and
    leaves the node's count of owned children at none (a count left at one made the node owned
    by a session that holds nothing beneath it, once it unlocked)."""
    s = make_scheduler()
    s.request("r1", [1, 2, 3, 4], [5], "a")
    s.request("r2", [1, 2, 3, 4, 6], [7], "a")
    s.begin("r3", [1, 2, 3, 4, 8])  # locks [1,2,3,4]
    assert s.cache.ledger.exclusive["a"] == 3
    result = s.close_session("a")
    assert result.freed_tokens == 3
    check_invariants(s)
    s.finish("r3", [])
    check_invariants(s)


def test_close_of_a_node_above_another_sessions_leaves_it_to_that_session():
    """a holds [1,2,3], b the child [4,5] below it: a's close frees nothing (a child), and b
    alone lies beneath the node then: b's close would free both, and its figure says so."""
    s = make_scheduler()
    s.request("r1", [1, 2], [3], "a")
    s.request("r2", [1, 2, 3, 4], [5], "b")
    assert s.cache.ledger.exclusive.get("b") == 2
    assert s.close_session("a").freed_tokens == 0
    assert s.cache.ledger.exclusive.get("b") == 5 == s.cache.plan_close("b").freed_tokens
    check_invariants(s)


def test_a_rebuild_over_the_records_of_a_changed_tree_leaves_none_stale():
    """The ledger keeps each node's record on the node: a rebuild (SGLang's index starts one
    after a change it was not told of) must leave none of the old ones. Here a holder goes behind
    the ledger's back, and a node no session lies beneath any more kept a record."""
    s = make_scheduler()
    s.request("r1", [1, 2], [3], "a")
    s.request("r2", [1, 2, 3, 4], [5], "b")
    s.request("r3", [7, 8], [9], "b")
    node = s.cache.lookup([7, 8, 9]).last_node
    node.session_ids = None  # b no longer holds [7,8,9], untold
    del s.cache._session_leaves["b"][node]
    s.cache.ledger.rebuild(s.cache.root_node, lambda n: n.session_ids)
    assert node.ledger_rec is None
    assert s.cache.ledger.figures("b") == (1, 2, 5)
    check_invariants(s)


def test_a_reset_leaves_no_record_on_the_tree_before():
    """Each node keeps its record: a reset (a new root) clears the old tree's, so a request still
    naming one of its nodes finds it holding nothing (an untag of it raised before)."""
    s = make_scheduler()
    s.request("r1", [1, 2], [3], "a")
    node = s.cache.lookup([1, 2, 3]).last_node
    assert node.ledger_rec is not None
    s.cache.reset()
    assert node.ledger_rec is None and s.cache.ledger.figures("a") == (0, 0, 0)
    s.cache.ledger.untag("a", node)
    s.cache.ledger.lock_changed(node)
    assert s.cache.ledger.figures("a") == (0, 0, 0)


def test_a_ledger_on_nodes_that_cannot_keep_its_record_is_refused_at_once():
    from radixtop.gpu_backend.ledger import SessionLedger

    class Slotted:
        __slots__ = ("parent", "children", "key", "lock_ref")

    with pytest.raises(TypeError, match="cannot keep the ledger's record"):
        SessionLedger(Slotted())


def test_a_drop_inside_a_batch_leaves_the_ledger_as_untags_would():
    """``ledger.drop`` inside a ``batch`` (an owner settled at the batch's end may still name the
    session): the same records as one untag each."""
    from tests.support.engines import check_ledger_records

    s = make_scheduler()
    s.request("r1", [1, 2], [3], "a")
    s.request("r2", [7, 8], [9], "a")
    x, y = s.cache.lookup([1, 2, 3]).last_node, s.cache.lookup([7, 8, 9]).last_node
    ledger = s.cache.ledger
    with ledger.batch():
        ledger.untag("a", x)
        ledger.drop("a", [y])
    x.session_ids = y.session_ids = None
    s.cache._session_leaves.pop("a")
    check_ledger_records(s.cache)


def test_request_finishing_after_close_tags_nothing_and_register_clears_the_tombstone():
    s = make_scheduler()
    s.begin("late", [1, 2], "a")
    s.close_session("a")
    s.finish("late", [3])
    assert holders(s, [1, 2, 3]) == set()
    assert s.cache.is_session_closed("a")
    s.register_session("a")
    assert not s.cache.is_session_closed("a")
    s.request("again", [5], [6], "a")
    assert holders(s, [5, 6]) == {"a"}
    check_invariants(s)


def test_closing_unknown_or_closed_session_frees_nothing_and_is_no_error():
    s = make_scheduler()
    s.request("r1", [1], [2], "a")
    unknown = s.close_session("nobody")
    assert unknown.freed_nodes == 0 and not unknown.already_closed
    first = s.close_session("a")
    second = s.close_session("a")
    assert first.freed_nodes == 1 and not first.already_closed
    assert second.freed_nodes == 0 and second.already_closed
    check_invariants(s)


def test_tombstones_are_an_lru_of_the_last_8192_closed_ids():
    s = make_scheduler()
    s.close_session("first")
    for i in range(CLOSED_SESSION_TOMBSTONE_LIMIT - 1):
        s.close_session(f"x{i}")
    assert s.cache.is_session_closed("first")
    s.close_session("first")  # closing again makes it the newest
    s.close_session("one-more")
    assert s.cache.is_session_closed("first") and not s.cache.is_session_closed("x0")
    assert len(s.cache.closed_session_ids()) == CLOSED_SESSION_TOMBSTONE_LIMIT
    # An id that fell out of the LRU tags again (the bounded guard, as in the seed).
    s.request("r", [1], [2], "x0")
    assert holders(s, [1, 2]) == {"x0"}


def test_evicting_a_tagged_node_removes_it_from_the_session_index():
    s = make_scheduler()
    s.request("r1", [1, 2], [3], "a")
    s.request("r2", [7, 8], [9], "a")
    s.cache.match_prefix([7, 8, 9])  # keep [7,8,9]
    s.evict(1)
    assert [n.key for n in s.cache.session_nodes("a")] == [(7, 8, 9)]
    s.evict(1)
    assert s.cache.session_nodes("a") == [] and "a" not in s.cache.session_ids()
    check_invariants(s)


def test_deref_policy_drops_holds_frees_nothing_and_evicts_unheld_first():
    s = make_scheduler(close_policy="deref")
    s.request("r1", [1, 1], [1], "a")
    s.request("r2", [2, 2], [2], "b")
    s.request("r3", [3, 3], [3], None)  # unheld, and the newest
    plan = s.cache.plan_close("a")
    assert (plan.freed_nodes, plan.released_holds) == (0, 1)
    result = s.close_session("a")
    assert (result.freed_nodes, result.released_holds) == (0, 1)
    assert holders(s, [1, 1, 1]) == set()
    # Unheld nodes go first whatever their age: [1,1,1] (released) and [3,3,3], then b's.
    s.evict(6)
    assert node_keys(s) == [[2, 2, 2]]
    check_invariants(s)


@pytest.mark.parametrize("close_policy", ["free", "deref"])
def test_plan_close_changes_nothing_and_equals_the_close(close_policy):
    s = make_scheduler(close_policy=close_policy)
    s.request("r1", [1, 2, 3], [4], "a")
    s.request("r2", [1, 2, 3, 4, 5], [6], "a")
    s.request("r3", [1, 2, 9], [9], "b")
    s.begin("r4", [1, 2, 9, 9, 7], "b")
    before = (node_keys(s), s.stats())
    plan = s.cache.plan_close("a")
    assert (node_keys(s), s.stats()) == before
    result = s.close_session("a")
    assert sorted(plan.freed_node_ids) == sorted(result.freed_node_ids)
    assert (plan.freed_tokens, plan.freed_bytes) == (result.freed_tokens, result.freed_bytes)
    assert plan.freed_bytes == plan.freed_tokens * s.geometry.bytes_per_token
    check_invariants(s)
