"""The dashboard's ``w`` (issue 29): asks for a prompt (token ids, or text where the target has a
tokenizer), then says why it missed in a modal, as ``radixtop why`` prints it; the target's ids
shown as written, never as markup or a terminal code."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Static

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp, binding_ids
from radixtop.inspector.modals import AskScreen, WhyScreen
from radixtop.inspector.sessions_view import SessionsTable
from tests.dashboard.test_doctor_panel import HOSTILE
from tests.support.engines import build_engine


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def why_screen(pilot, app, text: str) -> WhyScreen:
    await pilot.press("w")
    assert isinstance(app.screen, AskScreen)
    app.screen.query_one("#ask-input").value = text
    await pilot.press("enter")
    return await opened(pilot, app)


async def opened(pilot, app) -> WhyScreen:
    deadline = asyncio.get_running_loop().time() + 10
    while not isinstance(app.screen, WhyScreen):
        assert asyncio.get_running_loop().time() < deadline, "the why panel did not open"
        await pilot.pause(0.05)
    await pilot.pause()
    return app.screen


async def test_w_says_why_a_prompt_missed_with_the_target_ids_as_written(engine):
    assert "app.why" in binding_ids()
    engine.call(lambda s: (s.request("h1", [70, 71], [72], HOSTILE), s.close_session(HOSTILE)))
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await why_screen(pilot, app, "30, 31, 32")
        assert "0 of 3 tokens cached" in screen.text and "freed by the close of session gone" in screen.text
        await pilot.press("escape")
        assert not isinstance(app.screen, WhyScreen)
        screen = await why_screen(pilot, app, "70 71 72")
        shown = str(screen.query_one("#why-report", Static).render())
        assert "freed by the close of session [b]evil[/b]?[2J" in shown and "\x1b" not in shown
        await pilot.press("w")
        assert not isinstance(app.screen, WhyScreen)


async def test_w_on_the_sessions_table_tells_the_story_of_the_session_under_the_cursor(engine):
    """On the sessions table, ``w`` answers for the highlighted session (``radixtop why --session``):
    its requests' hits and what it held that left, when and why; its id shown as written."""
    engine.call(lambda s: (s.request("h1", [80, 81, 82], [83], HOSTILE), s.request("h2", [80, 81, 82, 83, 84], [85], HOSTILE),
                           s.evict_asked(1 << 30, "the test")))
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(SessionsTable)
        deadline = asyncio.get_running_loop().time() + 10
        while not any(row.id == HOSTILE for row in table.rows):
            assert asyncio.get_running_loop().time() < deadline, "the session is not listed"
            await pilot.pause(0.05)
        table.focus()
        for _ in range(len(table.rows)):
            await pilot.pause()
            if table.current is not None and table.current.id == HOSTILE:
                break
            await pilot.press("down")
        assert table.current.id == HOSTILE
        await pilot.press("w")
        shown = str((await opened(pilot, app)).query_one("#why-report", Static).render())
        assert "session [b]evil[/b]?[2J: 2 requests" in shown and "\x1b" not in shown, shown
        assert "4 of 8 prompt tokens cached" in shown, shown  # (the second hit the first's 4)
        assert "evicted on request (the test)" in shown, shown
        assert "why --session" in app.screen.footer
