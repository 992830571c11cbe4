"""The sessions' figures of a KV-event block tree, kept as the tree changes (``BlockLedger``),
against the from-scratch oracle (``BlockTree.attribute``) after every step of random event
sequences: chains stored under known, unknown (detached) and no parents, blocks stored again by
other sessions, removals (parents first, as vLLM may), splits and clears."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixtop.adapters.events.block_tree import BlockTree
from radixtop.gpu_backend.ledger.orders import ROW_KEYS, SessionOrders
from radixtop.gpu_backend.owner.slices import run_to_end

SESSIONS = st.sampled_from(["a", "b", "c", "d"])
KEYS = st.integers(0, 24)  # few keys: stored again, removed and re-stored often


def kept(tree: BlockTree) -> dict[str, tuple[int, int, int, float]]:
    ledger = tree.ledger
    ledger.settle()
    return {sid: (*ledger.figures(sid), ledger.shares(sid, ledger.held.get(sid, ()))[0]) for sid in tree.holding}


def oracle(tree: BlockTree) -> dict[str, tuple[int, int, int, float]]:
    return {sid: (f.tagged_nodes, f.exclusive, f.path, f.fair) for sid, f in tree.attribute().sessions.items()}


def assert_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for sid, figures in want.items():
        assert got[sid][:3] == figures[:3], sid
        assert got[sid][3] == pytest.approx(figures[3]), sid


class BlockTreeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree = BlockTree()
        self.ts = 0.0

    def _tick(self) -> float:
        self.ts += 1.0
        return self.ts

    @rule(parent=st.none() | KEYS, chain=st.lists(st.tuples(KEYS, st.integers(1, 3)), min_size=1, max_size=4),
          session=st.none() | SESSIONS)
    def store(self, parent, chain, session):
        ts = self._tick()
        for key, n in chain:
            self.tree.store(key, parent, tuple(range(n)), ts, session)
            parent = key

    @rule(key=KEYS)
    def remove(self, key):
        self.tree.remove(key)

    @rule()
    def clear(self):
        self.tree.clear(self._tick())

    @invariant()
    def kept_figures_equal_the_oracle(self):
        tree = self.tree
        assert_equal(kept(tree), oracle(tree))
        att = tree.attribute()
        ledger = tree.ledger
        assert ledger.beneath(tree.root) == att.beneath[0]
        for node in tree.iter_nodes():
            assert ledger.beneath(node) == att.beneath[node.id]
        held = {sid: {n.id for n in nodes} for sid, nodes in ledger.held.items()}
        assert held == {sid: {n.id for n in tree.iter_nodes() if sid in n.holders} for sid in tree.holding}
        assert set(ledger.path) <= set(tree.holding) and set(ledger.exclusive) <= set(tree.holding)

    @invariant()
    def the_fair_share_order_kept_on_the_tree_is_the_rows_ranking(self):
        """The sessions by fair share, either way, kept on the tree across the steps
        (``PathSums``: a session reaches into its last node as far as its last block), are the
        sessions' own rows ranked from scratch; by locked tokens (none in KV events), by id."""
        tree, ledger = self.tree, self.tree.ledger
        ledger.settle()
        if getattr(self, "orders", None) is None or self.orders.ledger is not ledger:
            self.orders = SessionOrders(ledger, 3, known=ledger.tags.__contains__, is_closed=lambda sid: False,
                                        seen_at=tree.last_store.get, leaves_of=lambda sid: ledger.held.get(sid, ()),
                                        everyone=lambda: ledger.tags)
        orders = self.orders
        rows = [orders.row(sid) for sid in tree.holding]
        for order in ("fair_share_bytes", "locked_tokens"):
            for reverse in (False, True):
                got, total, _, age = run_to_end(orders.page_pass(order, 0, 10, reverse=reverse))
                assert (got, total, age) == (sorted(rows, key=ROW_KEYS[order], reverse=reverse), len(rows), 0.0)
        assert "fair_share_bytes" in orders._paths  # kept, not ranked


TestBlockTreeFigures = BlockTreeMachine.TestCase
TestBlockTreeFigures.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])


def test_a_session_reaches_into_a_node_as_far_as_its_last_block():
    """In a node (a run of blocks), a session's path ends at the last block it stored there,
    unless it stored one below; the tokens only one session reaches are its own."""
    tree = BlockTree()
    tree.store("a", None, (1, 1), 1.0, "s1")
    tree.store("b", "a", (2, 2), 1.0, "s2")
    tree.store("c", "b", (3, 3), 1.0, "s1")  # one node a-b-c: s1 reaches its end, s2 only to b
    (node,) = tree.iter_nodes()
    tree.ledger.settle()  # a session's end in a node is settled at the next read
    assert (node.tokens, node.under, node.part) == (6, None, {"s1": 6, "s2": 4})
    assert kept(tree) == {"s1": (1, 2, 6, 1 + 1 + 2), "s2": (1, 0, 4, 2.0)}
    tree.store("x", "c", (4,), 2.0, "s2")  # extends the node: s2 reaches one token further
    assert kept(tree) == {"s1": (1, 0, 6, 2 + 1), "s2": (1, 1, 7, 2 + 1 + 1)}
    tree.store("y", "b", (5,), 3.0, "s1")  # a branch after b: s1 is under the head a-b now
    head, tail = tree.blocks["a"].node, tree.blocks["c"].node
    tree.ledger.settle()
    assert (head.tokens, head.under, head.part, tail.part) == (4, {"s1": 2, "s2": 1}, {"s1": 2, "s2": 4},
                                                              {"s1": 2, "s2": 3})
    assert kept(tree) == {"s1": (3, 1, 7, 2 + 1 + 1), "s2": (2, 1, 7, 2 + 1 + 1)}
    tree.remove("y")
    tree.remove("x")
    tree.remove("c")  # s1's last block in the tail goes, and the tail with it: s1 reaches a's end only
    assert kept(tree) == {"s1": (1, 0, 2, 1.0), "s2": (1, 2, 4, 1 + 2.0)}
    assert_equal(kept(tree), oracle(tree))


def test_the_sessions_read_ranks_by_the_kept_figures_at_every_read():
    """The adapter's sessions page is the ledger's now: no pass, no age, and each change of the
    tree is in the next read."""
    from radixtop.adapters.events.adapter import EventTreeAdapter
    from radixtop.adapters.events.wire import Batch, Stored

    adapter = EventTreeAdapter(name="events", bytes_per_token=2)
    adapter.apply_batch(0, Batch(1.0, None, [Stored((1, 2), None, (1, 2, 3, 4), 2, "GPU", session_id="s1"),
                                       Stored((3,), 2, (5, 6), 2, "GPU", session_id="s2")]))
    page = adapter.sessions()
    assert [(v.id, v.exclusive_bytes, v.shared_bytes) for v in page.sessions] == [("s2", 4, 8), ("s1", 0, 8)]
    assert page.figures_age_s == 0.0 and page.figures_current
    adapter.apply_batch(1, Batch(2.0, None, [Stored((4, 5, 6), 1, (7, 8, 9, 10, 11, 12), 2, "GPU", session_id="s1")]))
    page = adapter.sessions()
    assert [(v.id, v.exclusive_bytes) for v in page.sessions] == [("s1", 12), ("s2", 4)]
    rows = {v.id: v for v in page.sessions}
    for order, key in ROW_KEYS.items():
        got = [v.id for v in adapter.sessions(order=order).sessions]
        assert set(got) == set(rows), order
    assert adapter.session("s1").node_ids and adapter.node(0).sessions_beneath == 2
