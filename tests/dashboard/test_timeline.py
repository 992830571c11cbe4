"""The dashboard's timeline (``T``, issue 29's time travel): under the header, so the sparklines
stay in sight, the tree at a past moment, stepped with keys, as ``radixtop then`` prints it; never
further back than the history reaches, nor past now; the target's ids shown as written."""

from __future__ import annotations

import asyncio
import time

import pytest
from textual.widgets import Static

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp, binding_ids
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.timeline import ThenTree, TimelineScreen
from tests.dashboard.test_doctor_panel import HOSTILE
from tests.support.engines import build_engine


@pytest.fixture
def engine():
    e = build_engine(born_before_s=0.002)  # (its reach, in an earlier millisecond than its requests, held nothing)
    yield e
    e.stop()


async def shown(pilot, screen: TimelineScreen, needle: str) -> str:
    """The report once it holds ``needle`` (each step is a read off the UI thread)."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        text = str(screen.query_one("#timeline-report", Static).render())
        if needle in text:
            return text
        assert asyncio.get_running_loop().time() < deadline, f"{needle!r} never shown: {text!r}"
        await pilot.pause(0.05)


async def test_T_steps_the_tree_back_and_forth_from_the_historys_reach_to_now(engine):
    assert "app.then" in binding_ids()
    built = time.time()
    time.sleep(1.3)
    engine.call(lambda s: (s.request("h1", [70, 71], [72], HOSTILE), s.close_session(HOSTILE)))  # (came and went)
    engine.call(lambda s: s.close_session("b"))  # (3 tokens freed by its close)
    time.sleep(1.3)
    engine.call(lambda s: s.request("late", [90, 91, 92, 93], [94], None))  # (stored since)
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("T")
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        assert app.query_one(HeaderBar).region.bottom <= screen.query_one("#timeline-strip").region.y  # (below it)
        text = await shown(pilot, screen, "the tree at")
        assert screen.since is not None and screen.since <= built
        assert screen.at == screen.since  # (10 s back is before the reach: the reach it is)
        assert "0 tokens cached" in text
        assert "sessions' memory then: no session held any" in text  # (known from the reach: none then)
        await pilot.press("v")  # (the tree then, empty: the pane says so)
        tree = screen.query_one(ThenTree)
        await rows_until(pilot, tree, lambda rows: tree.note)
        await pilot.pause(0.1)
        assert tree.rows == [] and "the tree held nothing then" in tree.render_line(tree.HEADER_LINES).text
        await pilot.press("v")
        await pilot.press("minus")  # steps of 1 s
        assert "step 1s" in str(screen.query_one("#timeline-keys", Static).render())
        await pilot.press("right_square_bracket")
        assert screen.at == screen.since + 1.0
        text = await shown(pilot, screen, "left since")
        assert screen.view.at == screen.at and screen.view.left_by_cause == {"closed": screen.view.left_tokens}
        assert "freed by closes" in text and "stored since" in text
        assert (screen.view.stored_tokens, screen.view.left_tokens) == (5, 3)  # (what came and went is neither)
        for _ in range(3):
            await pilot.press("right_curly_bracket")
        assert screen.at <= time.time()
        await shown(pilot, screen, "the tree then is the tree now")
        await pilot.press("left_square_bracket")
        await pilot.press("escape")
        assert not isinstance(app.screen, TimelineScreen)


async def rows_until(pilot, tree, ok, keys=()) -> list:
    """The tree then's rows once ``ok(rows)`` (each read off the UI thread), pressing ``keys`` between reads."""
    deadline = asyncio.get_running_loop().time() + 10
    while not ok(tree.rows):
        assert asyncio.get_running_loop().time() < deadline, [r.node for r in tree.rows]
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.05)
    return list(tree.rows)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_v_browses_the_tree_then_node_by_node_with_what_left_since_marked(engine, size):
    """``v`` in the timeline: the tree at the moment, opened node by node with the tree's own keys;
    the nodes b's close freed since are there, in yellow, with why; a step to now, they are gone;
    every token the stats counted then is below the root."""
    before = BundledAdapter(engine).stats().total_tokens
    time.sleep(1.3)
    engine.call(lambda s: s.close_session("b"))  # (3 tokens freed by its close)
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=size) as pilot:
        await pilot.press("T")
        screen = app.screen
        await shown(pilot, screen, "the tree at")
        await pilot.press("minus", "left_curly_bracket")  # (steps of 1 s: 10 back, to the reach)
        await pilot.press("right_square_bracket")
        await shown(pilot, screen, "left since")
        await pilot.press("v")
        tree = screen.query_one(ThenTree)
        assert tree.has_focus and "v report" in str(screen.query_one("#timeline-keys", Static).render())
        await rows_until(pilot, tree, lambda rows: rows)
        assert sum(r.node.subtree_tokens for r in tree.rows if r.depth == 0) == before
        await pilot.press("home")
        rows = await rows_until(pilot, tree, lambda rows: any(r.node and r.node.left_at for r in rows),
                                keys=("right", "down"))
        closed = [r for r in rows if r.node is not None and r.node.left_at is not None]
        assert {(r.node.left_cause, r.node.left_by) for r in closed} == {("closed", "b")}
        line = next(i for i, r in enumerate(tree.rows) if r.node is closed[0].node)
        tree.scroll_to_row(line)
        await pilot.pause(0.1)
        painted = tree.render_line(line - tree.scroll_offset.y + tree.HEADER_LINES)
        assert "closed" in painted.text and any(s.style and s.style.color and s.style.color.name == "yellow"
                                                for s in painted._segments)
        await pilot.press("n")  # (now: nothing left since)
        await rows_until(pilot, tree, lambda rows: rows and not any(r.node and r.node.left_at for r in rows))
        from radixtop.adapters.errors import BadRequest

        def refused(*_):
            raise BadRequest("the history reaches back to 09:00:00 only: ask for a later moment")

        shown_then = screen.then_children
        screen.then_children = refused  # (a step the target refuses: no rows of another moment under it)
        await pilot.press("left_square_bracket")
        await rows_until(pilot, tree, lambda rows: not rows)
        await pilot.pause(0.1)
        assert "not shown: the history reaches back to 09:00:00 only" in tree.render_line(tree.HEADER_LINES).text
        screen.then_children = shown_then
        await pilot.press("v")
        assert not tree.display
        await pilot.press("escape")


async def test_T_on_a_target_without_a_history_says_so_in_one_line():
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler

    e = Engine(Scheduler(get_geometry("tiny"), 64, device="cpu", history=False), None).start()
    try:
        app = RadixtopApp(BundledAdapter(e), interval=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("T")
            screen = app.screen
            text = await shown(pilot, screen, "keeps no history")
            assert len(text.splitlines()) == 1
    finally:
        e.stop()


def test_the_timelines_words_show_a_sessions_id_as_written():
    from radixtop.adapters.model import BranchView, ThenView
    from radixtop.adapters.text import then_lines

    branch = BranchView(4, None, 1, 3, 10.0, 10.0, {"evicted": 3}, (HOSTILE,))
    view = ThenView(5.0, 10, 7, 3, 1, {"evicted": 3}, (branch,), 1, 0, 0, (), 0, 0.0)
    text = "\n".join(then_lines(view, 20.0))
    assert "held by [b]evil[/b]?[2J" in text and "\x1b" not in text
