"""The dashboard's fleet view, driven with Pilot over injected fleet views: rows by pressure, the
cursor staying on its worker as rows move, Enter on a worker that can open ending the view with
its row (the caller opens its dashboard), and a worker that cannot open saying why."""

from __future__ import annotations

from radixtop.adapters.fleet.model import DuplicatePrefix, Duplicates, FleetView, WorkerRow, by_pressure
from radixtop.inspector.fleet_view import FleetApp, FleetTable


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


async def wait_polls(app: FleetApp, pilot, n: int) -> None:
    for _ in range(200):
        if app.polls >= n:
            return
        await pilot.pause(0.02)
    raise AssertionError(f"{app.polls} polls, wanted {n}")


async def test_rows_by_pressure_and_enter_opens_the_worker():
    first = view(row("http://a:1", 100), row("http://b:1", 500), row("http://down:1", None, reachable=False,
                                                                          source="none", why="refused"))
    app = FleetApp(Views(first), auto_poll=False)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        table = app.query_one(FleetTable)
        assert [r.worker for r in table.rows] == ["http://b:1", "http://a:1", "http://down:1"]
        assert "50%" in table.render_line(1).text and "?" in table.render_line(3).text
        assert "http://down:1: refused" in str(app.query_one("#reasons").render())
        await pilot.press("down", "enter")
    assert app.return_value is not None and app.return_value.worker == "http://a:1"


async def test_a_worker_without_a_dashboard_says_why_and_the_view_stays():
    app = FleetApp(Views(view(row("http://down:1", None, reachable=False, source="none", why="refused"))),
                   auto_poll=False)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        await pilot.press("enter")
        await pilot.pause(0.05)
        assert app.is_running and app.return_value is None
        assert any("has no dashboard to open: refused" in n.message for n in app._notifications)
        await pilot.press("q")


async def test_the_cursor_follows_its_worker_when_the_order_changes_and_back_from_a_worker():
    before = view(row("http://a:1", 100), row("http://b:1", 500))
    after = view(row("http://a:1", 800), row("http://b:1", 500))  # a is now the most pressed
    app = FleetApp(Views(before, after), auto_poll=False)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_polls(app, pilot, 1)
        table = app.query_one(FleetTable)
        await pilot.press("down")
        assert table.current.worker == "http://a:1"
        await pilot.press("r")
        await wait_polls(app, pilot, 2)
        assert [r.worker for r in table.rows] == ["http://a:1", "http://b:1"] and table.current.worker == "http://a:1"
    back = FleetApp(Views(after), auto_poll=False, cursor_key="http://b:1")
    async with back.run_test(size=(160, 30)) as pilot:
        await wait_polls(back, pilot, 1)
        assert back.query_one(FleetTable).current.worker == "http://b:1"


async def test_duplicates_and_a_failed_source_are_shown():
    dups = Duplicates((DuplicatePrefix("m:default", 0xABC, 4, 64, ("1", "2"), 64, 16384),), 64, 16384, 16, 256)
    app = FleetApp(Views(view(row("http://a:1", 10), dups=dups),
                         FleetView("smg http://gw", (), 0.0, 0.0, error="cannot reach SMG")), auto_poll=False)
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

    assert snap_compare(FleetApp(lambda: fixed, auto_poll=False), terminal_size=(150, 24), run_before=polled)
