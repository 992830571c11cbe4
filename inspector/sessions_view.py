"""SessionsTable: a virtual table of sessions (Line API), sortable by any column, filterable."""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip

from radixtop.adapters.model import SessionView
from radixtop.inspector.format import age, human_bytes
from radixtop.inspector.rows_view import RowsView, cursor_bindings


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    cell: object  # SessionView -> str
    sort_key: object  # SessionView -> comparable (ascending = what "sorted by" shows first)


COLUMNS: tuple[Column, ...] = (
    Column("session", 14, lambda s: s.id, lambda s: s.id),
    Column("state", 6, lambda s: s.state, lambda s: s.state),
    Column("tagged", 6, lambda s: str(s.tagged_nodes), lambda s: -s.tagged_nodes),
    Column("exclusive", 10, lambda s: human_bytes(s.exclusive_bytes), lambda s: -s.exclusive_bytes),
    Column("shared", 10, lambda s: human_bytes(s.shared_bytes), lambda s: -s.shared_bytes),
    Column("fair", 10, lambda s: human_bytes(s.fair_share_bytes), lambda s: -s.fair_share_bytes),
    Column("locked", 7, lambda s: f"{s.locked_tokens:,}", lambda s: -s.locked_tokens),
    Column("active", 6, lambda s: age(s.last_activity_age_s),
           lambda s: float("inf") if s.last_activity_age_s is None else s.last_activity_age_s),
)
_HEADER = Style(bold=True, underline=True)
_CURSOR = Style(reverse=True)
_MARKED = Style(color="magenta", bold=True)


class SessionsTable(RowsView):
    """All loaded sessions, one line each; the first line is the column header."""

    HEADER_LINES = 1
    BINDINGS = [
        *cursor_bindings("sessions"),
        Binding("s", "next_sort", "Sort col", id="sessions.sort"),
        Binding("r", "reverse_sort", "Reverse", show=False, id="sessions.reverse"),
        Binding("space,m", "mark", "Mark", id="sessions.mark"),
        Binding("enter", "show_chains", "Show in tree", id="sessions.select"),
    ]

    DEFAULT_CSS = """
    SessionsTable { height: 1fr; overflow-x: hidden; }
    """

    class Chosen(Message):
        """Enter on a session: mark its chains in the tree."""

        def __init__(self, session: SessionView) -> None:
            self.session = session
            super().__init__()

    class Highlighted(Message):
        def __init__(self, session: SessionView | None) -> None:
            self.session = session
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.all: list[SessionView] = []
        self.shown: list[SessionView] = []
        self.sort_column = 3  # exclusive
        self.sort_reverse = False
        self.filter_text = ""
        self.marked: set[str] = set()
        self._cursor_id: str | None = None

    def set_sessions(self, sessions: list[SessionView]) -> None:
        self.all = sessions
        self._reshape()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self._reshape()

    def _reshape(self) -> None:
        rows = self.all
        if self.filter_text:
            needle = self.filter_text.lower()
            rows = [s for s in rows if needle in s.id.lower() or needle == s.state]
        col = COLUMNS[self.sort_column]
        rows = sorted(rows, key=lambda s: (col.sort_key(s), s.id), reverse=self.sort_reverse)
        self.shown = rows
        self.marked &= {s.id for s in self.all}
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        # The cursor stays on its session as the order changes, once the user has moved it;
        # until then it stays on the top row (the biggest session now, not the first one seen).
        index = next((i for i, s in enumerate(rows) if s.id == self._cursor_id), None) if self.moved else None
        self.cursor = index if index is not None else min(self.cursor, max(len(rows) - 1, 0))
        self.refresh()

    @property
    def current(self) -> SessionView | None:
        return self.shown[self.cursor] if 0 <= self.cursor < len(self.shown) else None

    @property
    def row_count(self) -> int:
        return len(self.shown)

    def cursor_changed(self, index: int) -> None:
        session = self.current
        self._cursor_id = session.id if session else None
        self.post_message(self.Highlighted(session))

    def _visible_columns(self, width: int) -> list[int]:
        """Columns that fit, in order of importance (session, exclusive, shared, state, ...)."""
        chosen, used = [], 1
        for i in (0, 3, 4, 1, 6, 2, 5, 7):
            if used + COLUMNS[i].width + 1 <= width or not chosen:
                chosen.append(i)
                used += COLUMNS[i].width + 1
        return sorted(chosen)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        visible = self._visible_columns(width)
        if y == 0:
            titles = []
            for i in visible:
                col = COLUMNS[i]
                arrow = ("▲" if self.sort_reverse else "▼") if i == self.sort_column else " "
                titles.append(f"{col.title}{arrow}".rjust(col.width) if i > 1 else f"{col.title}{arrow}".ljust(col.width))
            return Strip([Segment(" " + " ".join(titles), _HEADER)]).crop_extend(0, width, None)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.shown):
            if not self.shown and y == 1:
                note = "no sessions" + (f" match {self.filter_text!r}" if self.filter_text else "")
                return Strip([Segment(f" {note}", Style(dim=True))]).crop_extend(0, width, None)
            return Strip.blank(width)
        session = self.shown[index]
        cells = []
        for i in visible:
            col = COLUMNS[i]
            text = str(col.cell(session))[: col.width]
            cells.append(text.rjust(col.width) if i > 1 else text.ljust(col.width))
        mark = "●" if session.id in self.marked else " "
        style = _MARKED if session.id in self.marked else (Style(dim=True) if session.state == "closed" else Style())
        strip = Strip([Segment(mark + " ".join(cells), style)])
        if index == self.cursor:
            strip = strip.apply_style(_CURSOR if self.has_focus else Style(underline=True))
        return strip.crop_extend(0, width, None)

    def action_next_sort(self) -> None:
        self.sort_column = (self.sort_column + 1) % len(COLUMNS)
        self._reshape()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._reshape()

    def action_mark(self) -> None:
        session = self.current
        if session is None:
            return
        self.marked.symmetric_difference_update({session.id})
        self.action_cursor_down()
        self.refresh()

    def action_show_chains(self) -> None:
        if self.current is not None:
            self.post_message(self.Chosen(self.current))
