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
