"""CacheTree: the virtual tree (Line API); work per frame follows the screen, not the cache."""

from __future__ import annotations

from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip

from radixtop.adapters.model import NodeView
from radixtop.inspector.format import age, human_bytes, share_style
from radixtop.inspector.rows_view import RowsView, cursor_bindings
from radixtop.inspector.tree_state import Row

_CURSOR = Style(reverse=True)
_DIM = Style(dim=True)
_MARK = Style(bold=True, color="magenta")


def _preview(node: NodeView) -> str:
    if node.text:
        return node.text.replace("\n", "⏎")
    tokens = " ".join(map(str, node.first_tokens[:8]))
    return tokens + (" …" if node.tokens > 8 else "")


class CacheTree(RowsView):
    """Rows come from a TreeState (set by the app); the cursor follows a row's key."""

    BINDINGS = [
        *cursor_bindings("tree"),
        Binding("enter,space", "toggle", "Expand", id="tree.toggle"),
        Binding("right,l", "expand", "Expand", show=False, id="tree.expand"),
        Binding("left,h", "collapse", "Collapse", show=False, id="tree.collapse"),
        Binding("x", "fold_chain", "Chain", id="tree.chain"),
        Binding("o", "cycle_order", "Sort", id="tree.order"),
    ]

    DEFAULT_CSS = """
    CacheTree { height: 1fr; overflow-x: hidden; }
    """

    class Selected(Message):
        """The cursor moved to a row (or its node changed)."""

        def __init__(self, row: Row | None) -> None:
            self.row = row
            super().__init__()

    class Request(Message):
        """Ask the app to run a tree operation (loading happens off the UI thread)."""

        def __init__(self, op: str, row: Row) -> None:
            self.op = op
            self.row = row
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: Sequence[Row] = ()
        self.total_bytes = 1
        self.marked_ids: frozenset[int] = frozenset()
        self.order = "bytes"
        self._cursor_key: tuple[str, int] | None = None
        # What each line shows now (row index -> segments), so that a refresh repaints only the
        # lines whose text or colour changed: a live cache changes a few rows per poll.
        self._painted: dict[int, list[Segment]] = {}

    # ----- data in -----

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: Sequence[Row], total_bytes: int, order: str) -> None:
        """New rows; the cursor stays on the same row key (or the nearest place)."""
        self.rows = rows
        self.total_bytes = max(total_bytes, 1)
        self.order = order
        self.virtual_size = Size(self.size.width, len(rows))
        index = None
        if self._cursor_key is not None:
            index = next((i for i, r in enumerate(rows) if r.key == self._cursor_key), None)
        if index is None:
            index = min(self.cursor, max(len(rows) - 1, 0))
        current = rows[index] if 0 <= index < len(rows) else None
        if index != self.cursor or (current.key if current else None) != self._cursor_key:
            self.cursor = index  # the row under the cursor changed: say so (detail reloads)
        self._refresh_changed_lines()

    def _refresh_changed_lines(self) -> None:
        width, top = self.size.width, self.scroll_offset.y
        painted = self._painted
        for index in range(top, top + self.size.height):
            now = self._segments(self.rows[index], width) if index < len(self.rows) else None
            if painted.get(index) != now:
                self.refresh_line(index)
        if len(painted) > 4 * max(self.size.height, 1):  # scrolled far: forget what is off screen
            for index in [i for i in painted if not top <= i < top + self.size.height]:
                del painted[index]

    def set_marked(self, ids: frozenset[int]) -> None:
        self.marked_ids = ids
        self.refresh()

    @property
    def current(self) -> Row | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    def move_to_key(self, key: tuple[str, int]) -> None:
        index = next((i for i, r in enumerate(self.rows) if r.key == key), None)
        if index is not None:
            self.cursor = index

    def cursor_changed(self, index: int) -> None:
        row = self.current
        self._cursor_key = row.key if row else None
        self.post_message(self.Selected(row))

    # ----- rendering -----

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        index = self.scroll_offset.y + y
        if index >= len(self.rows):
            self._painted[index] = None
            return Strip.blank(width)
        segments = self._segments(self.rows[index], width)
        self._painted[index] = segments
        strip = Strip(segments)
        if index == self.cursor and self.has_focus:
            strip = strip.apply_style(_CURSOR)
        elif index == self.cursor:
            strip = strip.apply_style(Style(underline=True))
        return strip.crop_extend(0, width, None)

    def _segments(self, row: Row, width: int) -> list[Segment]:
        indent = "  " * row.depth
        if row.kind == "more":
            return [Segment(f"{indent}  … {row.more:,} more (enter loads the next page)", _DIM)]
        node = row.node
        expandable = node.num_children > 0
        marker = ("▾ " if row.expanded else "▸ ") if expandable else "  "
        if row.kind == "chain":
            tokens = sum(n.tokens for n in row.chain)
            label = f"#{row.chain[0].id} ⋯ #{node.id} chain of {len(row.chain)} nodes, {tokens:,} tok"
        else:
            label = f"#{node.id} {_preview(node)}"
            if node.num_children == 1:
                label += "  ┄"
        cols = self._columns(node, width)
        left_width = max(width - len(cols), 10)
        left = f"{indent}{marker}{label}"
        if len(left) > left_width:
            left = left[: left_width - 1] + "…"
        style = share_style(node.subtree_bytes / self.total_bytes)
        if node.id in self.marked_ids:
            style = style + _MARK
        return [Segment(left.ljust(left_width), style), Segment(cols, _DIM if node.lock_ref == 0 else Style())]

    def _columns(self, node: NodeView, width: int) -> str:
        """Right-hand columns; narrow views keep tokens and subtree bytes only."""
        if width < 64:
            return f" {node.tokens:>6,}t {human_bytes(node.subtree_bytes):>10}"
        parts = [f"{node.tokens:>7,}t", f"{human_bytes(node.bytes):>10}", f"{human_bytes(node.subtree_bytes):>10}"]
        if width >= 88:  # 160 columns give the tree 94
            parts.append(f"L{node.lock_ref:<2}")
            parts.append(f"{len(node.holders):>3}h")
            parts.append(f"{age(node.access_age_s):>5}")
        return " " + " ".join(parts)

    def clicked_twice(self, index: int) -> None:
        self.action_toggle()

    # ----- keys -----

    def _request(self, op: str) -> None:
        row = self.current
        if row is not None:
            self.post_message(self.Request(op, row))

    def action_toggle(self) -> None:
        row = self.current
        if row is not None:
            self._request("more" if row.kind == "more" else "toggle")

    def action_expand(self) -> None:
        self._request("expand")

    def action_collapse(self) -> None:
        self._request("collapse")

    def action_fold_chain(self) -> None:
        self._request("chain")

    def action_cycle_order(self) -> None:
        row = self.current or Row("more", 0)
        self.post_message(self.Request("order", row))
