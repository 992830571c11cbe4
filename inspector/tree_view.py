"""CacheTree: the virtual tree (Line API); work per frame follows the screen, not the cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip

from radixtop.adapters.model import NodeView
from radixtop.adapters.text import age, human_bytes, one_line
from radixtop.inspector.format import share_style
from radixtop.inspector.rows_view import RowsView, cursor_bindings, pane_binding
from radixtop.inspector.tree_ops import Collapse, CycleOrder, Expand, FoldChain, LoadMore, Toggle, TreeOp
from radixtop.inspector.tree_state import Row

_CURSOR = Style(reverse=True)
_DIM = Style(dim=True)
_MARK = Style(bold=True, color="magenta")
_HEADER = Style(bold=True, underline=True)


def _preview(node: NodeView, text: bool = True) -> str:
    """The node's first tokens: as text where the target decoded them (and ``text``), else ids."""
    if text and node.text:
        return one_line(node.text)
    tokens = " ".join(map(str, node.first_tokens[:8]))
    return tokens + (" …" if node.tokens > 8 else "")


# The right-hand columns, (title, width, cell) each; a narrow tree keeps the first and the third.
_COLUMNS: tuple[tuple[str, int, object], ...] = (
    ("tokens", 7, lambda n: f"{n.tokens:,}"),
    ("bytes", 10, lambda n: human_bytes(n.bytes)),
    ("subtree", 10, lambda n: human_bytes(n.subtree_bytes)),
    ("locks", 5, lambda n: "?" if n.lock_ref is None else str(n.lock_ref)),  # ?: the target cannot tell
    ("holders", 7, lambda n: "?" if n.holders is None else str(len(n.holders))),
    ("used", 5, lambda n: age(n.access_age_s)),
)
_NARROW = (0, 2)


def _chain_view(chain: Sequence[NodeView]) -> NodeView:
    """A folded chain as one node: all its tokens and bytes, the top's subtree (the chain and all
    below it: what the parent's page sorts it by), the top's locks, every holder, the latest use."""
    top = chain[0]
    holders = (None if any(n.holders is None for n in chain)
               else tuple(dict.fromkeys(h for n in chain for h in n.holders or ())))
    return replace(top, tokens=sum(n.tokens for n in chain), bytes=sum(n.bytes for n in chain),
                   holders=holders, access_age_s=min(n.access_age_s for n in chain),
                   num_children=chain[-1].num_children)


def _label(indent: str, ids: str, rest: str, width: int) -> str:
    """A row's left part in ``width`` cells: the preview (``rest``) is cut first, then the
    indent; the node ids never (the operator acts on them)."""
    indent = indent[: max(width - len(ids), 0)]
    left = indent + ids + rest
    if len(left) <= width:
        return left
    if len(indent + ids) >= width:
        return indent + ids
    return left[: width - 1] + "…"


class CacheTree(RowsView):
    """Rows come from a TreeState (set by the app); the cursor follows a row's key. The first
    line names the columns."""

    HEADER_LINES = 1

    BINDINGS = [
        *cursor_bindings("tree"),
        Binding("enter,space", "toggle", "Expand", id="tree.toggle"),
        Binding("right,l", "expand", "Expand", show=False, id="tree.expand"),
        Binding("left,h", "collapse", "Collapse", show=False, id="tree.collapse"),
        Binding("x", "fold_chain", "Chain", id="tree.chain"),
        Binding("o", "cycle_order", "Sort", id="tree.order"),
        Binding("t", "toggle_text", "Text/ids", show=False, id="tree.text"),
        pane_binding("tree"),
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
        """Ask for a tree operation (the screen applies them off the UI thread, in order)."""

        def __init__(self, op: TreeOp) -> None:
            self.op = op
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: Sequence[Row] = ()
        self.total_bytes = 1
        self.marked_ids: frozenset[int] = frozenset()
        self.order = "bytes"
        self.show_text = True
        """Previews as text where the target has a tokenizer (t: as token ids)."""
        self._cursor_key: tuple[str, int] | None = None
        # What each line shows now (row index -> segments), so that a refresh repaints only the
        # lines whose text or colour changed: a live cache changes a few rows per poll.
        self._painted: dict[int, list[Segment]] = {}
        self._painted_header = ""

    # ----- data in -----

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: Sequence[Row], total_bytes: int, order: str) -> None:
        """New rows; the cursor stays on the same row key (or the nearest place)."""
        self.rows = rows
        self.total_bytes = max(total_bytes, 1)
        self.order = order
        self.virtual_size = Size(self.size.width, len(rows) + self.HEADER_LINES)
        index = None
        if self._cursor_key is not None:
            index = next((i for i, r in enumerate(rows) if r.key == self._cursor_key), None)
        if index is None:
            index = min(self.cursor, max(len(rows) - 1, 0))
        current = rows[index] if 0 <= index < len(rows) else None
        if index != self.cursor or (current.key if current else None) != self._cursor_key:
            self.cursor = index  # the row under the cursor changed: say so (detail reloads)
        self._refresh_changed_lines()

    @property
    def _width(self) -> int:
        """The width the rows have (less a vertical scrollbar where one shows)."""
        return self.scrollable_content_region.width or self.size.width

    def _refresh_changed_lines(self) -> None:
        width, top = self._width, self.scroll_offset.y
        painted = self._painted
        header = self._header(width)
        if header != self._painted_header:  # (the order or the width changed)
            self._painted_header = header
            self.refresh_line(top)
        for index in range(top, top + self.size.height - self.HEADER_LINES):
            now = self._segments(self.rows[index], width) if index < len(self.rows) else None
            if painted.get(index) != now:
                self.refresh_line(index + self.HEADER_LINES)
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
        width = self._width
        if y == 0:
            self._painted_header = self._header(width)
            return Strip([Segment(self._painted_header, _HEADER)]).crop_extend(0, width, None)
        index = self.scroll_offset.y + y - self.HEADER_LINES
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
            ids, rest = f"#{row.chain[0].id} ⋯ #{node.id}", f" chain of {len(row.chain)} nodes"
            node = _chain_view(row.chain)  # its columns are the whole chain's
        else:
            # ┄ before the preview (a long preview is cut at the end): one child below, x folds
            ids, rest = f"#{node.id}", f"{' ┄' if node.num_children == 1 else ''} {_preview(node, self.show_text)}"
        cols = self._columns(node, width)
        left_width = max(width - len(cols), 10)
        left = _label(indent, marker + ids, rest, left_width)
        style = share_style(node.subtree_bytes / self.total_bytes)
        if node.id in self.marked_ids:
            style = style + _MARK
        return [Segment(left.ljust(left_width), style), Segment(cols, _DIM if not node.lock_ref else Style())]

    @staticmethod
    def _shown_columns(width: int) -> Sequence[int]:
        """Narrow views keep tokens and subtree bytes; 160 columns give the tree 94, 92 beside a
        scrollbar: every column still fits (50 cells), and 42 are left for the node and its text."""
        return _NARROW if width < 64 else (0, 1, 2) if width < 90 else range(len(_COLUMNS))

    def _columns(self, node: NodeView, width: int) -> str:
        return "".join(" " + str(_COLUMNS[i][2](node)).rjust(_COLUMNS[i][1])  # type: ignore[operator]
                       for i in self._shown_columns(width))

    def _header(self, width: int) -> str:
        cols = "".join(" " + _COLUMNS[i][0].rjust(_COLUMNS[i][1]) for i in self._shown_columns(width))
        order = {"bytes": "largest subtree first", "recency": "most recent first", "tokens": "most tokens first"}
        left = f"  node · {order.get(self.order, self.order)}"
        return left[: max(width - len(cols), 0)].ljust(max(width - len(cols), 0)) + cols

    def clicked_twice(self, index: int) -> None:
        self.action_toggle()

    # ----- keys -----

    @property
    def _node_row(self) -> Row | None:
        """The row under the cursor where it is a node (or a chain), not a "more" row."""
        row = self.current
        return row if row is not None and row.node is not None else None

    def _request(self, op: TreeOp) -> None:
        self.post_message(self.Request(op))

    def action_toggle(self) -> None:
        row = self.current
        if row is not None and row.kind == "more":
            self._request(LoadMore(row.parent_id))
        elif (row := self._node_row) is not None:
            self._request(Toggle(row.node))

    def action_expand(self) -> None:
        if (row := self._node_row) is not None:
            self._request(Expand(row.node))

    def action_collapse(self) -> None:
        row = self.current
        if row is not None:
            self._request(Collapse(row.node, row.parent_id))

    def action_toggle_text(self) -> None:
        self.show_text = not self.show_text
        self._painted.clear()
        self.refresh()

    def action_fold_chain(self) -> None:
        if (row := self._node_row) is not None:
            self._request(FoldChain(row.chain[0] if row.chain else row.node))

    def action_cycle_order(self) -> None:
        self._request(CycleOrder())
