"""The fleet view: one line per worker and DP rank, the most pressed first (a virtual table, Line
API), with the source's summary above and Dynamo's duplicated prefixes below. Enter on a worker
ends the view with that row: the caller opens the worker's own dashboard, then the fleet again."""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Footer, Static

from radixtop.adapters.fleet.format import COLUMNS, cells, duplicate_cells, reasons, summary
from radixtop.adapters.fleet.model import FleetView, WorkerRow
from radixtop.adapters.text import inert
from radixtop.inspector.rows_view import RowsView, cursor_bindings

WIDTHS = dict(zip(COLUMNS, (30, 3, 8, 14, 10, 10, 10, 8, 8, 5, 5, 5)))
_HEADER = Style(bold=True, underline=True)
_CURSOR = Style(reverse=True)
_DOWN = Style(color="red")
_NOTE = Style(color="yellow")


def drillable(row: WorkerRow) -> bool:
    """A worker whose own dashboard can open: its radixtop, or SGLang's routes (totals only)."""
    return row.source in ("radixtop", "sglang")


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
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        at = next((i for i, r in enumerate(rows) if r.key == key), None)
        self.cursor = at if at is not None else min(self.cursor, max(len(rows) - 1, 0))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            titles = [c.ljust(WIDTHS[c]) if c in ("worker", "from", "state") else c.rjust(WIDTHS[c]) for c in COLUMNS]
            return Strip([Segment(" " + " ".join(titles), _HEADER)]).crop_extend(0, width, None)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            if not self.rows and y == 1:
                return Strip([Segment(" no workers", Style(dim=True))]).crop_extend(0, width, None)
            return Strip.blank(width)
        row = self.rows[index]
        texts = []
        for col, text in zip(COLUMNS, cells(row)):
            w = WIDTHS[col]
            text = inert(text)
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


class FleetApp(App[WorkerRow | None]):
    """Polls ``poll`` (a blocking call, run in a thread; one at a time, re-armed when it ends)
    and shows its view. Enter on a worker that can open exits with its row; q exits with None."""

    TITLE = "radixtop fleet"
    BINDINGS = [
        Binding("r", "refresh_now", "Refresh", id="fleet.refresh"),
        Binding("q", "quit", "Quit", id="fleet.quit"),
    ]
    DEFAULT_CSS = """
    #summary { height: auto; padding: 0 1; background: $boost; }
    #reasons { height: auto; max-height: 8; padding: 0 1; }
    #dups { height: auto; max-height: 12; padding: 0 1; }
    """

    class Polled(Message):
        def __init__(self, view: FleetView) -> None:
            self.view = view
            super().__init__()

    def __init__(self, poll: Callable[[], FleetView], interval: float = 2.0, *, auto_poll: bool = True,
                 cursor_key: str | None = None) -> None:
        super().__init__()
        self._poll, self.interval, self._auto = poll, interval, auto_poll
        self._cursor_key = cursor_key
        self._polling = False
        self._timer: Timer | None = None
        self.view: FleetView | None = None
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
        self.poll()

    def poll(self) -> None:
        if self._polling:
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._polling = True
        self._poll_worker()

    @work(thread=True, group="fleet-poll", exit_on_error=False)
    def _poll_worker(self) -> None:
        try:
            view = self._poll()
        except Exception as exc:  # the pollers say failures in the view; anything else is a bug, said
            view = FleetView("fleet", (), 0.0, 0.0, error=f"{type(exc).__name__}: {exc}")
        self.post_message(self.Polled(view))

    def on_fleet_app_polled(self, message: Polled) -> None:
        self._polling = False
        if not self.is_running:
            return
        self.apply_view(message.view)
        if self._auto:
            self._timer = self.set_timer(self.interval, self.poll)

    def apply_view(self, view: FleetView) -> None:
        self.view = view
        self.query_one("#summary", Static).update(Text(inert(summary(view)),
                                                       style="bold red" if view.error else "bold"))
        table = self.query_one(FleetTable)
        table.set_rows(view.rows)
        if self._cursor_key is not None:  # back from a worker: the cursor on it again
            at = next((i for i, r in enumerate(view.rows) if r.key == self._cursor_key), None)
            if at is not None:
                table.cursor = at
            self._cursor_key = None
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
        if not drillable(row):
            why = row.why or "no radixtop and no engine figures"
            self.notify(inert(f"{row.key} has no dashboard to open: {why}"), severity="warning", markup=False)
            return
        self.exit(row)

    def action_refresh_now(self) -> None:
        self.poll()
