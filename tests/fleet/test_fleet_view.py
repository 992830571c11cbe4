"""The dashboard's fleet view, driven with Pilot over injected fleet views: rows by pressure, the
cursor staying on its worker as rows move, Enter on a worker that can open pushing its dashboard
(whose q comes back to the fleet, the cursor on the same worker), and a worker that cannot open
saying why."""

from __future__ import annotations

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import TargetUnreachable
from radixtop.adapters.fleet.model import DuplicatePrefix, Duplicates, FleetView, WorkerRow, by_pressure
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.cache_screen import CacheScreen
from radixtop.inspector.fleet_view import FleetScreen, FleetTable
from tests.support.engines import build_engine


def row(worker: str, protected: int | None, reachable: bool = True, source: str = "radixtop", why: str = "") -> WorkerRow:
    known = protected is not None
    return WorkerRow(worker, None, worker if source == "radixtop" else None, source, reachable, why=why,
                     capacity_tokens=1000 if known else None, available_tokens=100 if known else None,
                     evictable_tokens=900 - protected if known else None, unevictable_tokens=protected,
                     bytes_per_token=256 if known else None, open_sessions=3 if known else None)


def view(*rows: WorkerRow, dups: Duplicates | None = None) -> FleetView:
    return FleetView("fleet test", by_pressure(rows), 0.0, 0.01, duplicates=dups)


class Views:
    """Hands out the given views one poll at a time (the last one again after)."""

    def __init__(self, *views: FleetView) -> None:
        self.views = list(views)

    def __call__(self) -> FleetView:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


class Opener:
    """``open_worker`` for the fleet view: notes each row it is asked to open and opens a bundled
    cache in its place (``fail``: refuses, as a worker that went away does)."""

    def __init__(self, engine, fail: bool = False) -> None:
        self.engine, self.fail = engine, fail
        self.rows: list[WorkerRow] = []
        self.released = 0

    def __call__(self, row: WorkerRow):
        self.rows.append(row)
        if self.fail:
            raise TargetUnreachable(f"cannot reach {row.worker}: refused")
        adapter = BundledAdapter(self.engine, name=row.worker)
        adapter.release = lambda: setattr(self, "released", self.released + 1)
        return adapter, row.worker


@pytest.fixture
def opener():
    engine = build_engine()
    yield Opener(engine)
    engine.stop()


def fleet_app(poll, open_worker=None, **kwargs) -> RadixtopApp:
    return RadixtopApp(home=FleetScreen(poll, open_worker=open_worker, auto_poll=False, **kwargs))


async def wait_polls(app: RadixtopApp, pilot, n: int) -> None:
    for _ in range(200):
        if app.home.polls >= n:
            return
        await pilot.pause(0.02)
    raise AssertionError(f"{app.home.polls} polls, wanted {n}")


async def wait_screen(app: RadixtopApp, pilot, kind: type) -> None:
    for _ in range(200):
        if isinstance(app.screen, kind):
            await pilot.pause()
            return
        await pilot.pause(0.02)
    raise AssertionError(f"{app.screen!r}, wanted a {kind.__name__}")


async def test_rows_by_pressure_and_enter_opens_the_worker(opener):
    first = view(row("http://a:1", 100), row("http://b:1", 500), row("http://down:1", None, reachable=False,
                                                                          source="none", why="refused"))
    app = fleet_app(Views(first), opener)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        table = app.query_one(FleetTable)
        assert [r.worker for r in table.rows] == ["http://b:1", "http://a:1", "http://down:1"]
        assert "50%" in table.render_line(1).text and "?" in table.render_line(3).text
        assert "http://down:1: refused" in str(app.query_one("#reasons").render())
        await pilot.press("down", "enter")
        await wait_screen(app, pilot, CacheScreen)
        assert app.screen.target == "http://a:1"
    assert opener.rows and opener.rows[-1].worker == "http://a:1"


async def test_a_worker_without_a_dashboard_says_why_and_the_view_stays(opener):
    app = fleet_app(Views(view(row("http://down:1", None, reachable=False, source="none", why="refused"))), opener)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        await pilot.press("enter")
        await pilot.pause(0.05)
        assert app.is_running and opener.rows == [] and app.screen is app.home
        assert any("has no dashboard to open: refused" in n.message for n in app._notifications)
        await pilot.press("q")


async def test_the_cursor_follows_its_worker_when_the_order_changes_and_back_from_a_worker(opener):
    before = view(row("http://a:1", 100), row("http://b:1", 500))
    after = view(row("http://a:1", 800), row("http://b:1", 500))  # a is now the most pressed
    app = fleet_app(Views(before, after))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        table = app.query_one(FleetTable)
        await pilot.press("down")
        assert table.current.worker == "http://a:1"
        await pilot.press("r")
        await wait_polls(app, pilot, 2)
        assert [r.worker for r in table.rows] == ["http://a:1", "http://b:1"] and table.current.worker == "http://a:1"
    back = fleet_app(Views(after), opener)
    async with back.run_test(size=(160, 30)) as pilot:
        await wait_polls(back, pilot, 1)
        await pilot.press("down", "enter")  # b's dashboard
        await wait_screen(back, pilot, CacheScreen)
        await pilot.press("q")  # back to the fleet, which polls again at once
        await wait_screen(back, pilot, FleetScreen)
        await wait_polls(back, pilot, 2)
        assert back.query_one(FleetTable).current.worker == "http://b:1"


async def test_a_workers_dashboard_is_a_screen_q_comes_back_and_the_hidden_fleet_does_not_poll(opener):
    """Enter pushes the worker's dashboard over the fleet view in the same app; while it shows,
    the fleet view does not poll; its q pops back to the fleet (which polls again at once and
    keeps its cursor), and lets go of the worker's adapter; q in the fleet view quits."""
    app = RadixtopApp(home=FleetScreen(Views(view(row("http://a:1", 100), row("http://b:1", 500))), 0.05, opener))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 3)  # polling on its own
        await pilot.press("down", "enter")
        await wait_screen(app, pilot, CacheScreen)
        cache = app.screen
        assert app.screen_stack == [app.home, cache] and cache.target == "http://a:1"
        while cache.polls < 1:
            await pilot.pause(0.02)
        hidden = app.home.polls
        await pilot.pause(0.3)  # six of the fleet's intervals
        assert app.home.polls == hidden  # a hidden screen does not poll
        await pilot.press("q")
        await wait_screen(app, pilot, FleetScreen)
        await wait_polls(app, pilot, hidden + 1)
        assert app.query_one(FleetTable).current.worker == "http://a:1" and opener.released == 1
        assert app.is_running
        await pilot.press("q")
        await pilot.pause(0.1)
        assert not app.is_running


async def test_ctrl_c_in_the_fleet_view_says_which_key_quits_and_on_a_workers_dashboard_comes_back(opener):
    app = fleet_app(Views(view(row("http://a:1", 100))), opener)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running and [(n.message, n.markup) for n in app._notifications] == [
            ("Press [b]q[/b] to quit the app", True)]
        await pilot.press("enter")
        await wait_screen(app, pilot, CacheScreen)
        await pilot.press("question_mark", "ctrl+c")  # over the help, too
        await wait_screen(app, pilot, FleetScreen)
        assert app.screen_stack == [app.home] and opener.released == 1


async def test_a_worker_that_cannot_be_opened_says_why_in_a_toast():
    opener = Opener(None, fail=True)
    app = fleet_app(Views(view(row("http://a:1", 100))), opener)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert [r.worker for r in opener.rows] == ["http://a:1"] and app.screen is app.home and app.is_running
        assert any("cannot reach http://a:1: refused" in n.message and n.severity == "error"
                   for n in app._notifications)


async def test_duplicates_and_a_failed_source_are_shown():
    dups = Duplicates((DuplicatePrefix("m:default", 0xABC, 4, 64, ("1", "2"), 64, 16384),), 64, 16384, 16, 256)
    app = fleet_app(Views(view(row("http://a:1", 10), dups=dups),
                          FleetView("smg http://gw", (), 0.0, 0.0, error="cannot reach SMG")))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        text = str(app.query_one("#dups").render())
        assert "on 1, 2" in text and "duplicated 16.0 KiB" in text
        assert "16.0 KiB in 1 prefixes" in str(app.query_one("#summary").render())
        await pilot.press("r")
        await wait_polls(app, pilot, 2)
        assert "cannot reach SMG" in str(app.query_one("#summary").render())
        assert app.query_one(FleetTable).rows == ()


def test_fleet_view_look(snap_compare):
    """The fleet view's look, pinned: rows by pressure, '?' for unknowns, a down row in red with
    its reason, the duplicates below."""
    dups = Duplicates((DuplicatePrefix("llama:default", 0x5A5A, 8, 128, ("1", "2@1"), 128, 32768),), 128, 32768,
                      16, 256)
    fixed = view(row("http://10.0.0.5:30100", 300), row("http://10.0.0.6:30100", 700),
                 row("http://10.0.0.7:30000", None, source="sglang", why="unknown: available and evictable apart"),
                 row("http://10.0.0.8:30100", None, reachable=False, source="none",
                     why="radixtop: cannot reach http://10.0.0.8:30100: [Errno 111] Connection refused"),
                 dups=dups)
    async def polled(pilot) -> None:
        await wait_polls(pilot.app, pilot, 1)

    assert snap_compare(fleet_app(lambda: fixed), terminal_size=(150, 24), run_before=polled)


async def test_at_80_columns_a_workers_host_and_port_show_whole():
    """The worker column holds the longest host:port (the scheme goes first): neither the host
    nor the port is cut."""
    from tests.dashboard.test_snapshots import screen_lines

    long = "http://worker-17.us-east.example.com:30100"
    app = fleet_app(lambda: view(row(long, 300), row("http://10.0.0.5:30100", 700)))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_polls(app, pilot, 1)
        await pilot.pause()
        text = "\n".join(screen_lines(app))
        assert "worker-17.us-east.example.com:30100 " in text, text
        assert " 10.0.0.5:30100 " in text and "…" not in text.split("\n")[3], text
