"""The dashboard's data side without a screen: what a Poller reads for a request, and what it
remembers between polls (the memray-live seam: the App only applies the Snapshot it gets)."""

from __future__ import annotations

import dataclasses

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import TargetUnreachable
from radixtop.inspector.poller import Poller, PollRequest, Snapshot
from radixtop.inspector.tree_ops import Collapse, CycleOrder, Expand, Toggle
from tests.support.engines import build_engine


class Recording(BundledAdapter):
    """Notes the ops of every read_many and whether capabilities were asked."""

    def __init__(self, engine):
        super().__init__(engine)
        self.batches: list[list[str]] = []
        self.capability_reads = 0

    def read_many(self, reads):
        self.batches.append([op for op, _ in reads])
        return super().read_many(reads)

    def capabilities(self):
        self.capability_reads += 1
        return super().capabilities()


@pytest.fixture
def adapter():
    engine = build_engine()
    yield Recording(engine)
    engine.stop()


def test_a_first_poll_reads_everything_in_one_read_and_is_frozen(adapter):
    poller = Poller(adapter)
    snap = poller.collect(PollRequest())
    assert isinstance(snap, Snapshot)
    assert snap.capabilities is not None and snap.capabilities.tree
    assert snap.stats.node_count > 0
    assert snap.tree is not None and snap.tree.rows and isinstance(snap.tree.rows, tuple)
    assert snap.sessions is not None and snap.sessions.sessions
    assert snap.detail is None  # nothing selected
    assert adapter.batches[0] == ["stats", "sessions"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.stats = None  # type: ignore[misc]


def test_later_polls_do_not_reread_capabilities_or_sessions_until_due(adapter):
    poller = Poller(adapter)
    poller.collect(PollRequest())
    snap = poller.collect(PollRequest())
    assert adapter.capability_reads == 1 and snap.capabilities is None
    assert snap.sessions is None and "sessions" not in adapter.batches[-1]
    poller.sessions_due()
    assert poller.collect(PollRequest()).sessions is not None


def test_a_paused_request_reads_the_stats_only(adapter):
    poller = Poller(adapter)
    poller.collect(PollRequest())
    row = poller.collect(PollRequest()).tree.rows[0]
    snap = poller.collect(PollRequest(live=False, selected_node=row.node.id))
    assert adapter.batches[-1] == ["stats"]
    assert snap.tree is None and snap.sessions is None and snap.detail is None


def test_the_selected_node_comes_with_the_poll(adapter):
    poller = Poller(adapter)
    row = poller.collect(PollRequest()).tree.rows[0]
    snap = poller.collect(PollRequest(selected_node=row.node.id, detail_offset=0))
    assert snap.detail is not None and snap.detail.node.id == row.node.id
    assert "node" in adapter.batches[-1]


def test_after_a_lost_target_the_next_poll_reloads_capabilities_and_sessions(adapter):
    poller = Poller(adapter)
    poller.collect(PollRequest())
    adapter.engine.stop()
    with pytest.raises(TargetUnreachable):
        poller.collect(PollRequest())
    poller.lost()
    assert poller._caps_stale and poller._since is None


def test_tree_operations_return_rows_of_a_later_generation(adapter):
    poller = Poller(adapter)
    first = poller.collect(PollRequest()).tree
    expandable = next(r for r in first.rows if r.node is not None and r.node.num_children)
    update = poller.tree_op(Toggle(expandable.node))
    assert update.tree.generation > first.generation
    assert len(update.tree.rows) > len(first.rows)
    assert any(r.parent_id == expandable.node.id for r in update.tree.rows)


def test_tree_operations_read_the_state_when_they_run_not_the_row_they_were_made_from(adapter):
    """Keys pressed faster than the tree loads are made from rows that do not show the keys before
    them yet: expand then collapse, both made from the same collapsed row, collapse it; collapse on
    a row that is no longer expanded collapses its parent (and moves there), as a slow press does."""
    poller = Poller(adapter)
    first = poller.collect(PollRequest()).tree
    row = next(r for r in first.rows if r.node is not None and r.node.num_children)
    poller.tree_op(Expand(row.node))
    assert row.node.id in poller.tree.expanded
    assert poller.tree_op(Collapse(row.node, row.parent_id)).move_to is None
    assert row.node.id not in poller.tree.expanded
    poller.tree_op(Expand(row.node))
    child = next(r for r in poller.tree.rows if r.parent_id == row.node.id)
    update = poller.tree_op(Collapse(child.node, child.parent_id))  # a leaf, or not expanded: its parent
    assert row.node.id not in poller.tree.expanded and update.move_to == ("node", row.node.id)
    order = poller.tree.order
    assert poller.tree_op(CycleOrder()).note == f"children sorted by {poller.tree.order}" != f"children sorted by {order}"


def test_a_sessions_read_the_target_refuses_fails_alone(adapter):
    """An older server that does not know a sort order refuses the sessions read: the poll stands
    (stats, tree), the error is said, and the next query is read again."""
    from radixtop.adapters.errors import BadRequest
    from radixtop.inspector.poller import SessionsQuery

    real = adapter.read_many

    def refusing(reads):
        return [BadRequest("order must be one of exclusive_bytes, shared_bytes, last_activity, id")
                if op == "sessions" else result for (op, _), result in zip(reads, real(reads))]

    adapter.read_many = refusing
    poller = Poller(adapter)
    snap = poller.collect(PollRequest(sessions=SessionsQuery("fair_share_bytes")))
    assert snap.stats is not None and snap.tree is not None and snap.sessions is None
    assert "order must be one of" in snap.sessions_error
    adapter.read_many = real
    again = poller.collect(PollRequest(sessions=SessionsQuery("exclusive_bytes")))  # a new query: read now
    assert again.sessions is not None and again.sessions_error is None


def test_search_and_a_sessions_chains_read_their_paths_at_one_moment():
    """The nodes above a search's hit and a session's chains come from one ``paths`` read (one
    hold of the owner), not node by node: even where every single-node read finds its node gone
    (a cache that changes between any two reads), both open the tree down to what they show."""
    from radixtop.adapters.errors import UnknownNode

    class Changing(BundledAdapter):
        def node(self, node_id, token_offset=0, token_limit=256):
            raise UnknownNode(f"node {node_id} is not in the tree (evicted since)")

    engine = build_engine()
    try:
        poller = Poller(Changing(engine))
        poller.collect(PollRequest())
        match, target, rows = poller.search([1, 2, 3, 4, 20, 21, 99])
        assert match.matched_tokens == 6 and target in {r.node.id for r in rows.rows if r.node}
        detail, marked, rows = poller.session_chains("a")
        assert set(detail.node_ids) <= marked and set(detail.node_ids) <= {r.node.id for r in rows.rows if r.node}
    finally:
        engine.stop()
