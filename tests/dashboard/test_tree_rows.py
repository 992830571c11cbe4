"""The tree's rows stay live: a folded chain updates like every other row (issue 26, item 2)."""

from __future__ import annotations

import asyncio

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.tree_view import CacheTree, _chain_view
from tests.dashboard.test_dashboard import idle, node_id_for, settle
from tests.support.engines import build_engine


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def wait_for(pilot, condition, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await pilot.pause(0.05)


async def test_a_folded_chain_updates_like_every_other_row(engine):
    """[5,6] -> [7,8] -> [10,11] folded with x; the chain's tail then grows by a turn of session
    a: the row gets the new node, its tokens, and its top's subtree (never less than below it)."""
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("enter")
        await idle(pilot, app)
        tree = app.query_one(CacheTree)
        top = node_id_for(engine, [1, 2, 3, 4, 5, 6])
        tree.move_to_key(("node", top))
        await pilot.press("x")
        await idle(pilot, app)

        def chain_row():
            return next(r for r in tree.rows if r.kind == "chain")

        assert [n.tokens for n in chain_row().chain] == [2, 2, 2]
        before = _chain_view(chain_row().chain)
        engine.call(lambda s: s.request("r9", [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14], [15], "a"))
        await wait_for(pilot, lambda: len(chain_row().chain) == 4, "the chain's new tail shows")
        now = _chain_view(chain_row().chain)
        assert now.tokens == 2 + 2 + 2 + 4 > before.tokens
        fresh = adapter.node(top).node
        assert now.subtree_bytes == fresh.subtree_bytes > before.subtree_bytes
        assert now.subtree_bytes >= max(n.subtree_bytes for n in chain_row().chain)
