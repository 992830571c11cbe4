"""SessionsTable: a virtual table over all the target's sessions (Line API): the target sorts,
filters and pages them; the table holds the window of rows around the cursor. SessionsTitle and
FilterBox: the lines above it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Input, Static

from radixtop.adapters.model import SessionsPage, SessionView
from radixtop.adapters.text import age, figures_note, human_bytes, inert
from radixtop.inspector.format import literal
from radixtop.inspector.poller import SESSIONS_LOADED, SessionsQuery
from radixtop.inspector.rows_view import RowsView, cursor_bindings, pane_binding


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    cell: object  # SessionView -> str
    order: str
    """The target's order for this column (``CacheAdapter.sessions``)."""
    descending: bool
    """That order shows the column's values falling down the table (sizes, open before closed);
    False: rising (ids A to Z, ages newest first). The header's arrow says which, the same way
    for every column: ▼ falling, ▲ rising."""


SORT_KEYS = {"id": "id", "state": "state", "tagged_nodes": "tagged_nodes", "exclusive_bytes": "exclusive_bytes",
             "shared_bytes": "shared_bytes", "fair_share_bytes": "fair_share_bytes", "locked_tokens": "locked_tokens",
             "last_activity": "last_activity_age_s"}
"""The target's order -> the view's field it sorts by (to sort the rows on screen at once)."""

COLUMNS: tuple[Column, ...] = (
    Column("session", 14, lambda s: s.id, "id", False),
    Column("state", 6, lambda s: s.state, "state", True),
    Column("tagged", 6, lambda s: str(s.tagged_nodes), "tagged_nodes", True),
    Column("exclusive", 10, lambda s: human_bytes(s.exclusive_bytes), "exclusive_bytes", True),
    Column("shared", 10, lambda s: human_bytes(s.shared_bytes), "shared_bytes", True),
    Column("fair", 10, lambda s: human_bytes(s.fair_share_bytes), "fair_share_bytes", True),
    Column("locked", 7, lambda s: "?" if s.locked_tokens is None else f"{s.locked_tokens:,}", "locked_tokens", True),
    Column("active", 6, lambda s: age(s.last_activity_age_s), "last_activity", False),
)
_HEADER = Style(bold=True, underline=True)
_CURSOR = Style(reverse=True)
_MARKED = Style(color="magenta", bold=True)
_LOADING = Style(dim=True)


class SessionsTable(RowsView):
    """All the target's sessions in the order of the sort column, one line each (those outside
    the loaded window show as … until they come); the first line is the column header."""

    HEADER_LINES = 1
    BINDINGS = [
        *cursor_bindings("sessions"),
        Binding("s", "next_sort", "Sort", id="sessions.sort"),
        Binding("r", "reverse_sort", "Reverse", show=False, id="sessions.reverse"),
        Binding("space,m", "mark", "Mark", id="sessions.mark"),
        Binding("enter", "show_chains", "In tree", id="sessions.select"),
        pane_binding("sessions"),
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

    class QueryChanged(Message):
        """The order, filter or window changed: the rows must be read again."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.page: SessionsPage | None = None
        self.rows: tuple[SessionView, ...] = ()
        """The loaded window: rows ``first`` .. ``first + len(rows)`` of ``total``."""
        self.first = 0
        self.total = 0
        self.sort_column = 3  # exclusive
        self.sort_reverse = False
        self.filter_text = ""
        self.window = 0
        """The first row the table wants loaded (around the cursor)."""
        self.marked: set[str] = set()

    @property
    def query(self) -> SessionsQuery:
        return SessionsQuery(COLUMNS[self.sort_column].order, self.sort_reverse, self.filter_text, self.window,
                             self.loaded_rows)

    @property
    def shown_rows(self) -> int:
        """Rows on screen (below the column header)."""
        return max(self.size.height - self.HEADER_LINES, 1)

    @property
    def loaded_rows(self) -> int:
        """Rows the table loads around its cursor: three of its screens, the cursor's in the
        middle (it moves half a screen before the next window), at least ``SESSIONS_LOADED``.
        Every loaded row is read at every poll on the target's owner thread (a live server's
        scheduler): what the pane shows and a margin, not a fixed 200."""
        return max(SESSIONS_LOADED, 3 * self.shown_rows)

    def set_page(self, page: SessionsPage) -> None:
        """The target's answer to ``query`` (or to an older one, until the new one comes)."""
        self.page, self.rows, self.first, self.total = page, page.sessions, page.offset, page.total
        self.virtual_size = Size(self.size.width, self.total + 1)
        # The cursor keeps its place (the row position): the session under it after a reload is
        # the one the order puts there now; after a close the next one moves up under it.
        self.cursor = min(self.cursor, max(self.total - 1, 0))
        self.refresh()

    def set_filter(self, text: str) -> None:
        text = text.strip()
        if text != self.filter_text:
            self.filter_text = text
            self._query_changed(reset=True)

    def _query_changed(self, reset: bool) -> None:
        if reset:
            self.window = 0
            self.cursor = 0
            self.scroll_to(y=0, animate=False)
        self.refresh()
        self.post_message(self.QueryChanged())

    def row(self, index: int) -> SessionView | None:
        """Row ``index`` of the whole order, where loaded."""
        at = index - self.first
        return self.rows[at] if 0 <= at < len(self.rows) else None

    @property
    def current(self) -> SessionView | None:
        return self.row(self.cursor)

    @property
    def row_count(self) -> int:
        return self.total

    def cursor_changed(self, index: int) -> None:
        session = self.current
        self.post_message(self.Highlighted(session))
        # Near the end of the loaded window (or outside it): load the window around the cursor.
        # A cursor a screen or more inside the window has every row on screen loaded.
        loaded = self.loaded_rows
        margin = max(self.shown_rows, loaded // 4)
        if self.total > len(self.rows) and not (
                self.first + margin <= index < self.first + len(self.rows) - margin
                or (self.first == 0 and index < margin)
                or (self.first + len(self.rows) >= self.total and index >= self.first)):
            window = max(0, min(index - loaded // 2, self.total - loaded))
            if window != self.window:
                self.window = window
                self._query_changed(reset=False)

    def _visible_columns(self, width: int) -> list[int]:
        """Columns that fit, in order of importance: session, exclusive, shared, fair share (what
        an operator ranks sessions by), state, ..."""
        chosen, used = [], 1
        for i in (0, 3, 4, 5, 1, 6, 2, 7):
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
                falling = col.descending != self.sort_reverse
                arrow = ("▼" if falling else "▲") if i == self.sort_column else " "
                titles.append(f"{col.title}{arrow}".rjust(col.width) if i > 1 else f"{col.title}{arrow}".ljust(col.width))
            return Strip([Segment(" " + " ".join(titles), _HEADER)]).crop_extend(0, width, None)
        index = self.scroll_offset.y + y - 1
        if index >= self.total:
            if not self.total and y == 1:
                note = "no sessions" + (inert(f" match {self.filter_text!r}") if self.filter_text else "")
                return Strip([Segment(f" {note}", _LOADING)]).crop_extend(0, width, None)
            return Strip.blank(width)
        session = self.row(index)
        if session is None:  # outside the loaded window: it is on its way
            strip = Strip([Segment(" …", _LOADING)])
        else:
            cells = []
            for i in visible:
                col = COLUMNS[i]
                text = inert(str(col.cell(session)))[: col.width]
                cells.append(text.rjust(col.width) if i > 1 else text.ljust(col.width))
            mark = "●" if session.id in self.marked else " "
            style = _MARKED if session.id in self.marked else (Style(dim=True) if session.state == "closed" else Style())
            strip = Strip([Segment(mark + " ".join(cells), style)])
        if index == self.cursor:
            strip = strip.apply_style(_CURSOR if self.has_focus else Style(underline=True))
        return strip.crop_extend(0, width, None)

    def action_next_sort(self) -> None:
        """The next column on screen (a hidden one is not in the cycle)."""
        visible = self._visible_columns(self.size.width)
        later = [i for i in visible if i > self.sort_column]
        self.sort_column = later[0] if later else visible[0]
        self._sort_shown()
        self._query_changed(reset=True)

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._sort_shown()
        self._query_changed(reset=True)

    def _sort_shown(self) -> None:
        """Sort the rows on screen by the new order at once, from the top (the target's page of
        it follows): what the cursor, Home and space act on is what the header's arrow says."""
        col = COLUMNS[self.sort_column]
        field = SORT_KEYS[col.order]
        by_id = sorted(self.rows, key=lambda s: s.id)  # ties as the target breaks them: by id
        descending = col.descending != self.sort_reverse

        def key(s: SessionView) -> tuple[bool, Any]:  # an unknown figure (None) sorts last either way
            value = getattr(s, field)
            return (value is None) != descending, 0 if value is None else value

        self.rows = tuple(sorted(by_id, key=key, reverse=descending))
        self.first = 0

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


class SessionsTitle(Static):
    """The line above the sessions: 'sessions 10,632 · figures 1s old', or with a filter
    'sessions 37 of 10,632 · filter 's5''; how old the figures are is always said (the ranking is
    what the operator acts on)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._figures: tuple[float, bool, bool] = (0.0, False, False)  # age, refreshing, current, as read
        self._read: tuple[float, int] = (0.0, 0)  # when the sessions were read, the cache's version then

    def figures_read(self, page: SessionsPage, taken_at: float, version: int) -> None:
        """A poll read the sessions at ``taken_at``, the cache at ``version``."""
        self._figures = (page.figures_age_s, page.refreshing, page.figures_current)
        self._read = (taken_at, version)

    def show(self, table: SessionsTable, polled_at: float, version: int | None,
             open_sessions: int | None = None) -> None:
        """The title for ``table`` as of the latest poll (at ``polled_at``, the cache at ``version``,
        ``open_sessions`` of its sessions open: the table lists the closed ones too)."""
        page = table.page
        parts = ["[b]sessions[/]"]
        open_part = ""
        if page is not None and page.contains == table.filter_text:
            parts[0] += (f" {page.total:,} of {page.all_sessions:,}" if page.contains and page.all_sessions is not None
                         else f" {page.total:,}")
            if open_sessions is not None and not page.contains:  # (filtered: "37 of 10,632")
                open_part = f" ({open_sessions:,} open)"
        if table.filter_text:
            parts.append(f"filter {literal(repr(table.filter_text))}")
        if table.marked:
            parts.append(f"{len(table.marked)} marked")
        if page is not None:
            # The sessions are read every few seconds, the stats every poll: the figures are as old
            # as the target said, and as long again as since they were read; exact ("unchanged")
            # only while the cache's version has not moved since.
            age_s, refreshing, current = self._figures
            read_at, read_version = self._read
            current = current and version == read_version
            parts.append(figures_note(age_s + max(0.0, polled_at - read_at), refreshing, current))
        title = " · ".join(parts)
        if open_part:  # the open count where it fits: how old the figures are is always said
            with_open = parts[0] + open_part + title[len(parts[0]):]
            width = self.content_region.width or self.size.width
            if len(Text.from_markup(with_open).plain) <= width or not width:
                title = with_open
        if self.content != title:
            self.update(title, layout=False)  # one line, fixed height

    def unavailable(self) -> None:
        """The target has no sessions."""
        self.update(Text("sessions: not available here", style="yellow"))


class FilterBox(Input):
    """The sessions filter: Enter applies it; Escape clears it (and the table's filter) and
    leaves the box, as it says."""

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    def action_clear_filter(self) -> None:
        self.value = ""
        self.post_message(self.Submitted(self, ""))
