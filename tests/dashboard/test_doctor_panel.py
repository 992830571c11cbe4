"""The dashboard's leak doctor: D opens the findings as plain text; escape closes them."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Static

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp, binding_ids
from radixtop.inspector.modals import DoctorScreen
from tests.support.engines import build_engine

HOSTILE = "[b]evil[/b]\x1b[2J"


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def doctor_screen(pilot, app) -> DoctorScreen:
    await pilot.press("D")
    deadline = asyncio.get_running_loop().time() + 10
    while not isinstance(app.screen, DoctorScreen):
        assert asyncio.get_running_loop().time() < deadline, "the doctor's panel did not open"
        await pilot.pause(0.05)
    await pilot.pause()
    return app.screen


async def test_d_opens_the_doctor_healthy_then_with_a_finding_shown_as_written(engine):
    assert "app.doctor" in binding_ids()
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await doctor_screen(pilot, app)
        assert screen.healthy and "healthy: nothing found" in screen.text
        await pilot.press("escape")
        assert not isinstance(app.screen, DoctorScreen)

        def tag_after_close(s) -> None:  # a closed session whose id is markup and a terminal code tags a node
            s.request("x1", [70, 71], [72], HOSTILE)
            s.close_session(HOSTILE)
            s.cache._closed_session_ids.pop(HOSTILE)
            s.request("x2", [80, 81], [82], HOSTILE)
            s.cache._closed_session_ids[HOSTILE] = None

        engine.call(tag_after_close)
        screen = await doctor_screen(pilot, app)
        assert not screen.healthy and "[tombstone_tags] closed session '[b]evil[/b]" in screen.text
        shown = str(screen.query_one("#doctor-report", Static).render())
        assert "[b]evil[/b]?[2J" in shown and "\x1b" not in shown  # as written, never markup or a code
        assert "means:" in shown and "fix:" in shown
        await pilot.press("D")
        assert not isinstance(app.screen, DoctorScreen)
