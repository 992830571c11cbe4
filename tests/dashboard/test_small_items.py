"""Smaller dashboard items (issue 26, item 7): the sessions title's open count, the DOWN banner's
cause said once and no 'last good data' that never was, the fair-share column at 160x48."""

from __future__ import annotations

import asyncio

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import TargetUnreachable
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.sessions_view import SessionsTable
from tests.dashboard.test_dashboard import screen_text, settle
from tests.dashboard.test_snapshots import screen_lines
from tests.support.engines import build_engine


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


class Unreachable(BundledAdapter):
    """Reads fail as an unreachable target's while ``down``, with the client's own words."""

    def __init__(self, engine, down: bool):
        super().__init__(engine)
        self.down = down

    def read_many(self, reads):
        if self.down:
            raise TargetUnreachable("cannot reach http://10.0.0.9:8765: [Errno 111] Connection refused")
        return super().read_many(reads)


async def wait_down(pilot, app) -> str:
    deadline = asyncio.get_running_loop().time() + 10
    while app.home.down is None:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the dashboard never said the target is down")
        await pilot.pause(0.05)
    await pilot.pause()
    return str(app.query_one("#banner").content)


async def test_the_sessions_title_says_how_many_of_them_are_open(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        st = adapter.stats()
        total = app.query_one(SessionsTable).total
        assert total == 5 and st.open_sessions == 4
        assert any(f"sessions {total} ({st.open_sessions} open)" in line for line in screen_lines(app))


async def test_the_down_banner_says_its_cause_once_and_never_data_it_never_had(engine):
    adapter = Unreachable(engine, down=True)
    app = RadixtopApp(adapter, "http://10.0.0.9:8765", interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        banner = await wait_down(pilot, app)
        assert banner.count("cannot reach") == 1 and banner.count("http://10.0.0.9:8765") == 1, banner
        assert "last good data" not in banner and "no data from it yet" in banner, banner
    adapter = Unreachable(engine, down=False)
    app = RadixtopApp(adapter, "a cache", interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        adapter.down = True
        banner = await wait_down(pilot, app)
        assert banner.startswith("⚠ cannot reach a cache: cannot reach http://10.0.0.9:8765"), banner
        assert "showing the last good data" in banner, banner


async def test_the_fair_share_column_shows_at_160x48(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        header = next(line for line in screen_lines(app) if "exclusive" in line and "session" in line)
        assert "fair" in header, header
        assert "fair" in screen_text(app)
