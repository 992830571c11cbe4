"""s sorts the rows on screen at once, and the target's page follows (issue 26, item 6): Home and
space right after s act on the order the header's arrow says, and a page of the old order that
lands meanwhile does not undo it."""

from __future__ import annotations

import threading

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.sessions_view import COLUMNS, SessionsTable
from tests.dashboard.test_dashboard import settle
from tests.support.engines import build_engine


class SlowShared(BundledAdapter):
    """Reads of the sessions by shared bytes wait until ``answer`` is set (a large target's
    sessions read, seconds long)."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.answer = threading.Event()

    def read_many(self, reads):
        if any(op == "sessions" and args[0] == "shared_bytes" for op, args in reads):
            self.answer.wait(10)
        return super().read_many(reads)


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def test_s_sorts_the_rows_shown_at_once_and_marks_follow_them(engine):
    adapter = SlowShared(engine)
    app = RadixtopApp(adapter, interval=0.2)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            table = app.query_one(SessionsTable)
            assert [s.id for s in table.rows] == ["b", "a", "c", "d", "gone"]  # exclusive bytes, falling
            table.focus()
            await pilot.press("down", "down")
            await pilot.press("s")  # shared bytes: the target has not answered yet
            assert COLUMNS[table.sort_column].order == "shared_bytes"
            assert [s.id for s in table.rows] == ["a", "c", "b", "d", "gone"]
            await pilot.pause(0.5)  # polls of the other figures land meanwhile
            assert [s.id for s in table.rows] == ["a", "c", "b", "d", "gone"]
            await pilot.press("home", "space")
            assert table.marked == {"a"}
            adapter.answer.set()
            await settle(pilot, app, polls=2)
            assert [s.id for s in table.rows] == ["a", "c", "b", "d", "gone"] and table.marked == {"a"}
    finally:
        adapter.answer.set()


class HeldOld(SlowShared):
    """Also holds a read of the sessions by exclusive bytes while ``hold`` is set (saying so in
    ``held``), until ``let_go``."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.hold, self.held, self.let_go = threading.Event(), threading.Event(), threading.Event()

    def read_many(self, reads):
        if self.hold.is_set() and any(op == "sessions" and args[0] == "exclusive_bytes" for op, args in reads):
            self.held.set()
            self.let_go.wait(10)
        return super().read_many(reads)


async def test_a_page_of_the_old_order_that_lands_after_s_does_not_undo_the_sort(engine):
    adapter = HeldOld(engine)
    app = RadixtopApp(adapter, interval=0.2)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            table = app.query_one(SessionsTable)
            table.focus()
            adapter.hold.set()
            for _ in range(200):  # a poll of the old order is out
                if adapter.held.is_set():
                    break
                await pilot.pause(0.02)
            assert adapter.held.is_set()
            polls = app.home.polls
            await pilot.press("s")
            adapter.let_go.set()
            for _ in range(200):  # it lands (the next poll, of the new order, waits in its thread)
                if app.home.polls > polls:
                    break
                await pilot.pause(0.02)
            await pilot.pause()
            assert app.home.polls == polls + 1
            assert [s.id for s in table.rows] == ["a", "c", "b", "d", "gone"]
    finally:
        adapter.let_go.set()
        adapter.answer.set()


async def test_every_column_sorts_where_a_figure_is_unknown():
    """A KV-event tree tells no locks (None) and may not know a session's last activity: s on
    each column sorts the rows shown, the unknown ones last, and nothing fails."""
    import time

    from radixtop.adapters.events.adapter import EventTreeAdapter
    from radixtop.adapters.events.wire import Batch, Stored

    adapter = EventTreeAdapter(name="events", bytes_per_token=2, capacity_tokens=100)
    adapter.apply_batch(0, Batch(time.time(), 0, [Stored((1, 2), None, (7, 8), 1, "GPU", session_id="a"),
                                                  Stored((3,), 2, (9,), 1, "GPU", session_id="b")]))
    app = RadixtopApp(adapter, target="events", interval=0.2)
    async with app.run_test(size=(320, 48)) as pilot:  # wide enough for every column
        await settle(pilot, app, polls=2)
        table = app.query_one(SessionsTable)
        assert len(table.rows) == 2
        table.focus()
        await pilot.pause()
        seen = set()
        for _ in COLUMNS:
            await pilot.press("s")
            await pilot.pause()
            seen.add(COLUMNS[table.sort_column].order)
            assert {s.id for s in table.rows} == {"a", "b"}
        assert seen == {c.order for c in COLUMNS}  # every column was the sort column once
        await settle(pilot, app)
        assert app.home.down is None and app.is_running
