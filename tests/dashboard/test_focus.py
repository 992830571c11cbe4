"""Where the keys go (issue 26, item 4): a filter box left open after filtering gives up the
focus, so command keys are never typed into it; tab cycles tree -> detail -> sessions."""

from __future__ import annotations

import pytest
from textual.widgets import Input

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.detail import DetailPanel
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree
from tests.dashboard.test_dashboard import settle
from tests.support.engines import build_engine


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def test_tab_cycles_the_panes_and_skips_an_applied_filter(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        tree, detail, table = app.query_one(CacheTree), app.query_one(DetailPanel), app.query_one(SessionsTable)
        seen = []
        for _ in range(4):
            seen.append(app.focused)
            await pilot.press("tab")
            await pilot.pause()
        assert seen == [tree, detail, table, tree]
        await pilot.press("f", *"gone", "enter")
        await settle(pilot, app)
        box = app.query_one("#filter", Input)
        assert box.display and box.value == "gone" and table.has_focus  # the box says the filter
        seen = []
        for _ in range(4):
            await pilot.press("tab")
            await pilot.pause()
            seen.append(app.focused)
        assert seen == [tree, detail, table, tree]
        await pilot.press("p")  # a command key: pauses, never typed into the box
        assert app.home.paused and box.value == "gone"
        await pilot.press("f")  # f goes back to the box, to change the filter
        assert box.has_focus
        await pilot.press("escape")
        await settle(pilot, app)
        assert not box.display and table.filter_text == ""
