"""RowsView: a virtual list of rows with a cursor (Line API), the base of the tree and the table.

Work per frame follows the screen, not the data: a subclass renders the lines on screen only. This
base owns what both views share: the cursor, keeping it in view, the keys that move it, and clicks.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.reactive import reactive
from textual.scroll_view import ScrollView


def cursor_bindings(view: str) -> list[Binding]:
    """The cursor keys of a view, with ids ``<view>.up`` etc. (for ``--keymap``)."""
    return [
        Binding("up,k", "cursor_up", "Up", show=False, id=f"{view}.up"),
        Binding("down,j", "cursor_down", "Down", show=False, id=f"{view}.down"),
        Binding("pageup", "page_up", "Page up", show=False, id=f"{view}.page_up"),
        Binding("pagedown", "page_down", "Page down", show=False, id=f"{view}.page_down"),
        Binding("home,ctrl+home", "first", "First row", show=False, id=f"{view}.first"),
        Binding("end,ctrl+end", "last", "Last row", show=False, id=f"{view}.last"),
    ]


def pane_binding(view: str) -> Binding:
    """Tab to the next pane, shown in the footer (the screen's own tab binding is hidden); last in
    a view's bindings, so the footer shows the view's keys first."""
    return Binding("tab", "app.focus_next", "Pane", id=f"{view}.pane")


class RowsView(ScrollView, can_focus=True):
    """A cursor over ``row_count`` rows shown below ``HEADER_LINES`` fixed lines."""

    HEADER_LINES = 0
    """Lines at the top that are not rows (a column header)."""

    cursor = reactive(0, always_update=True)
    """Index of the highlighted row."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.moved = False
        """The user has moved the cursor (until then a view may keep it on the top row)."""

    @property
    def row_count(self) -> int:
        raise NotImplementedError

    def cursor_changed(self, index: int) -> None:
        """After the cursor moved to ``index`` (the subclass says so to whoever listens)."""

    def clicked_twice(self, index: int) -> None:
        """A second click on the row under the cursor."""

    # ----- the cursor -----

    def watch_cursor(self, new: int) -> None:
        self.scroll_to_row(new)
        self.refresh()
        self.cursor_changed(new)

    def scroll_to_row(self, index: int) -> None:
        top, height = self.scroll_offset.y, max(self.size.height - self.HEADER_LINES, 1)
        if index < top:
            self.scroll_to(y=index, animate=False)
        elif index >= top + height:
            self.scroll_to(y=index - height + 1, animate=False)

    def _move(self, index: int) -> None:
        self.moved = True
        index = max(0, min(index, self.row_count - 1))
        if index != self.cursor:
            self.cursor = index

    def _page(self) -> int:
        return max(self.size.height - self.HEADER_LINES - 1, 1)

    def action_cursor_up(self) -> None:
        self._move(self.cursor - 1)

    def action_cursor_down(self) -> None:
        self._move(self.cursor + 1)

    def action_page_up(self) -> None:
        self._move(self.cursor - self._page())

    def action_page_down(self) -> None:
        self._move(self.cursor + self._page())

    def action_first(self) -> None:
        self._move(0)

    def action_last(self) -> None:
        self._move(self.row_count - 1)

    def on_click(self, event) -> None:
        """A click moves the cursor to the row; a second click on it is the subclass's."""
        offset = event.get_content_offset(self)
        if offset is None:
            return
        index = self.scroll_offset.y + offset.y - self.HEADER_LINES
        if 0 <= index < self.row_count:
            if index == self.cursor and event.chain >= 2:
                self.clicked_twice(index)
            self._move(index)
