"""The fleet view: one line per worker and DP rank, the most pressed first (a virtual table, Line
API), with the source's summary above and Dynamo's duplicated prefixes below. Enter on a worker
pushes that worker's own dashboard (a CacheScreen); its q comes back here."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Footer, Static

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.fleet.format import COLUMNS, cells, duplicate_cells, reasons, summary, why_closed
from radixtop.adapters.fleet.model import FleetView, WorkerRow
from radixtop.adapters.text import inert
from radixtop.inspector.cache_screen import CacheScreen
from radixtop.inspector.poll_loop import PolledScreen, PollLoop, read_in_thread
from radixtop.inspector.rows_view import RowsView, cursor_bindings

WIDTHS = dict(zip(COLUMNS, (30, 3, 8, 14, 10, 10, 10, 8, 8, 5, 5, 5)))
WORKER_MAX = 60
"""The widest the worker column grows to hold a whole host:port."""


def worker_text(worker: str) -> str:
    """A worker as the column shows it: host:port (and any path), without the scheme."""
    return worker.split("://", 1)[-1]
_HEADER = Style(bold=True, underline=True)
_CURSOR = Style(reverse=True)
_DOWN = Style(color="red")
_NOTE = Style(color="yellow")


class FleetTable(RowsView):
    """The rows of the last poll; the cursor stays on the same worker across polls."""

    HEADER_LINES = 1
    BINDINGS = [*cursor_bindings("fleet"), Binding("enter", "open", "Open worker", id="fleet.open")]
    DEFAULT_CSS = "FleetTable { height: 1fr; overflow-x: hidden; }"

    class Opened(Message):
        """Enter on a worker."""

        def __init__(self, row: WorkerRow) -> None:
            self.row = row
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: tuple[WorkerRow, ...] = ()
        self.widths = dict(WIDTHS)
        """Each column's width now: the worker column holds the longest host:port (to WORKER_MAX)."""

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def current(self) -> WorkerRow | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    def set_rows(self, rows: tuple[WorkerRow, ...]) -> None:
        """New rows; the cursor follows the worker it was on (rows move as pressure changes)."""
        key = self.current.key if self.current is not None else None
        self.rows = rows
        self.widths["worker"] = min(max([WIDTHS["worker"], *(len(worker_text(r.worker)) for r in rows)]), WORKER_MAX)
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        at = next((i for i, r in enumerate(rows) if r.key == key), None)
        self.cursor = at if at is not None else min(self.cursor, max(len(rows) - 1, 0))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            widths = self.widths
            titles = [c.ljust(widths[c]) if c in ("worker", "from", "state") else c.rjust(widths[c]) for c in COLUMNS]
            return Strip([Segment(" " + " ".join(titles), _HEADER)]).crop_extend(0, width, None)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            if not self.rows and y == 1:
                return Strip([Segment(" no workers", Style(dim=True))]).crop_extend(0, width, None)
            return Strip.blank(width)
        row = self.rows[index]
        texts = []
        for col, text in zip(COLUMNS, cells(row)):
            w = self.widths[col]
            text = inert(worker_text(text) if col == "worker" else text)
            if len(text) > w:
                text = ("…" + text[-(w - 1):]) if col == "worker" else text[: w - 1] + "…"
            texts.append(text.ljust(w) if col in ("worker", "from", "state") else text.rjust(w))
        strip = Strip([Segment(" " + " ".join(texts), Style() if row.reachable else _DOWN)])
        if index == self.cursor:
            strip = strip.apply_style(_CURSOR if self.has_focus else Style(underline=True))
        return strip.crop_extend(0, width, None)

    def clicked_twice(self, index: int) -> None:
        self.action_open()

    def action_open(self) -> None:
        if self.current is not None:
            self.post_message(self.Opened(self.current))


class FleetScreen(PolledScreen):
    """Polls ``poll`` (a blocking call, run in a thread; one at a time, re-armed when it ends)
    and shows its view. Enter on a worker that can open pushes its dashboard, made by
    ``open_worker(row) -> (adapter, label)``; q there comes back here, the cursor on the same
    worker (the rows stay while it is hidden, and it polls again at once); q here quits."""

    TITLE = "radixtop fleet"
    BINDINGS = [
        Binding("r", "refresh_now", "Refresh", id="fleet.refresh"),
        Binding("q", "app.quit", "Quit", id="fleet.quit"),
    ]
    DEFAULT_CSS = """
    #summary { height: auto; padding: 0 1; background: $boost; }
    #reasons { height: auto; max-height: 8; padding: 0 1; }
    #dups { height: auto; max-height: 12; padding: 0 1; }
    """

    def __init__(self, poll: Callable[[], FleetView], interval: float = 2.0,
                 open_worker: Callable[[WorkerRow], tuple[CacheAdapter, str]] | None = None, *,
                 auto_poll: bool = True) -> None:
        super().__init__()
        self.interval = interval
        self._open_worker = open_worker
        self.view: FleetView | None = None
        self.opened: CacheAdapter | None = None
        """The adapter of the worker whose dashboard is open (released when it closes)."""
        self.poll_loop = PollLoop(self, lambda: poll, self.apply_view, self._poll_failed, lambda: self.interval,
                                  group="fleet-poll", auto=auto_poll)
        self.polls = 0
        """Completed polls (tests wait on it)."""

    def compose(self) -> ComposeResult:
        yield Static("polling the fleet…", id="summary")
        yield FleetTable(id="fleet")
        yield Static(id="reasons")
        yield Static(id="dups")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(FleetTable).focus()
        self.poll_loop.poll()

    def _poll_failed(self, error: Exception) -> None:
        # The pollers say failures in the view; anything else is a bug, said.
        self.apply_view(FleetView("fleet", (), 0.0, 0.0, error=f"{type(error).__name__}: {error}"))

    def apply_view(self, view: FleetView) -> None:
        self.view = view
        self.query_one("#summary", Static).update(Text(inert(summary(view)),
                                                       style="bold red" if view.error else "bold"))
        self.query_one(FleetTable).set_rows(view.rows)
        down = {r.key for r in view.rows if not r.reachable}
        lines = Text()
        for line in reasons(view) + [f"note: {n}" for n in view.notes]:
            lines.append(inert(line) + "\n", style=_DOWN if line.split(": ", 1)[0] in down else _NOTE)
        self.query_one("#reasons", Static).update(lines)
        dups = duplicate_cells(view)
        text = Text()
        if dups:
            text.append("cached on more than one worker (Dynamo's dump)\n", style="bold")
            for prefix, tokens, holders, dup in dups[:10]:
                text.append(inert(f"{prefix}  {tokens} tokens  on {holders}  duplicated {dup}") + "\n")
        self.query_one("#dups", Static).update(text)
        self.polls += 1

    def on_fleet_table_opened(self, message: FleetTable.Opened) -> None:
        row = message.row
        if self._open_worker is None:  # (a view that opens nothing: a test's fixed views)
            return
        why = why_closed(row)
        if why is not None:
            self.notify(inert(f"{row.key} has no dashboard to open: {why}"), severity="warning", markup=False)
            return
        read_in_thread(self, partial(self._open_worker, row), self._show_worker, group="open", title="radixtop")

    def _show_worker(self, opened: tuple[CacheAdapter, str]) -> None:
        adapter, label = opened
        self.opened = adapter
        self.app.push_screen(CacheScreen(adapter, label, 1.0), lambda _: self.release(adapter))

    def release(self, adapter: CacheAdapter | None = None) -> None:
        """Let go of a worker's adapter: ``adapter``, whose dashboard closed; by default the one
        still open (the app ended)."""
        adapter = adapter or self.opened
        if adapter is self.opened:
            self.opened = None
        if adapter is not None:
            adapter.release()

    def action_refresh_now(self) -> None:
        self.poll_loop.poll()
