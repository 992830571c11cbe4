"""How many session rows a poll asks the target for: what the pane shows and a margin, not a
fixed 200 (each row is read on the cache's owner thread at every poll: on a live SGLang, its
scheduler's time); scrolling still finds every row on screen loaded."""

from __future__ import annotations

from contextlib import asynccontextmanager

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.poller import SESSIONS_LOADED, Poller, PollRequest, SessionsQuery
from radixtop.inspector.sessions_view import SessionsTable
from tests.dashboard.test_dashboard import many_sessions_engine, settle


class AskedRows(BundledAdapter):
    """Notes the rows every sessions read asks for."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.asked: list[int] = []

    def read_many(self, reads):
        self.asked.extend(args[2] for op, args in reads if op == "sessions")
        return super().read_many(reads)


@asynccontextmanager
async def sessions_pane(size: tuple[int, int], polls: int = 1):
    """The dashboard on many sessions at ``size``, after ``polls`` polls: (the adapter noting the
    rows asked, the app, its pilot, the sessions table)."""
    engine = many_sessions_engine()
    try:
        adapter = AskedRows(engine)
        app = RadixtopApp(adapter, interval=0.2)
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app, polls=polls)
            yield adapter, app, pilot, app.query_one(SessionsTable)
    finally:
        engine.stop()


def on_screen(table: SessionsTable) -> range:
    """The rows of the whole order the pane shows now."""
    top = table.scroll_offset.y
    return range(top, min(top + table.size.height - table.HEADER_LINES, table.total))


def test_a_poll_reads_the_rows_its_query_asks_for():
    """The poller asks for the query's rows; a query that differs only in its rows answers the
    same window (a page read before the pane was resized is still the table's)."""
    engine = many_sessions_engine(300)
    try:
        adapter = AskedRows(engine)
        snap = Poller(adapter).collect(PollRequest(sessions=SessionsQuery(limit=40)))
        assert adapter.asked == [40]
        assert len(snap.sessions.sessions) == 40 and snap.sessions.total == 300
        assert SessionsQuery(limit=40) == SessionsQuery(limit=120)
        assert SessionsQuery().limit == SESSIONS_LOADED
    finally:
        engine.stop()


async def test_a_48_line_terminal_asks_for_a_few_screens_of_sessions_not_200():
    """At 160x48 the pane shows 27 rows: every poll asks for at most four screens of them
    (it asked for 200, read at every poll)."""
    async with sessions_pane((160, 48), polls=3) as (adapter, app, pilot, table):
        shown = table.shown_rows
        assert shown == 27
        assert adapter.asked and all(shown < rows <= 4 * shown for rows in adapter.asked), adapter.asked
        assert len(table.rows) == adapter.asked[-1] < 200
        assert all(table.row(i) is not None for i in on_screen(table))


async def test_scrolling_through_the_sessions_finds_every_row_on_screen_loaded():
    """Down a row at a time, a page at a time, and back up, across many loaded windows (the
    table loads fewer rows now, so more often): after each poll every row on screen and the
    cursor's are loaded, and they are the rows of the whole order at those places."""
    async with sessions_pane((160, 48)) as (adapter, app, pilot, table):
        everyone = [s.id for s in BundledAdapter(adapter.engine).sessions("exclusive_bytes", 0, 10_000).sessions]
        table.focus()

        async def check() -> None:
            await settle(pilot, app)
            rows = on_screen(table)
            assert table.cursor in rows
            assert [table.row(i).id if table.row(i) else None for i in rows] == everyone[rows.start:rows.stop]

        windows = set()
        for _ in range(60):  # row by row, past two windows' edges
            await pilot.press("down")
            windows.add(table.window)
        await check()
        for _ in range(12):
            await pilot.press("pagedown")
            await check()
            windows.add(table.window)
        for _ in range(16):  # back to the top, past it
            await pilot.press("pageup")
            await check()
            windows.add(table.window)
        assert table.cursor == 0
        assert len(windows) >= 4  # the table moved its window several times


async def test_a_tall_pane_loads_three_of_its_screens():
    """A pane taller than the floor's three screens asks for three of its own, and a page down
    finds its rows loaded."""
    async with sessions_pane((200, 100), polls=2) as (adapter, app, pilot, table):
        shown = table.shown_rows
        assert 3 * shown > SESSIONS_LOADED
        assert adapter.asked[-1] == 3 * shown == len(table.rows)
        table.focus()
        for _ in range(3):
            await pilot.press("pagedown")
            await settle(pilot, app)
            assert all(table.row(i) is not None for i in on_screen(table))
