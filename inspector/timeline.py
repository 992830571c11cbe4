"""The timeline (issue 29's time travel): the tree at a past moment, stepped back and forth, told
from the tree now (``CacheAdapter.then``: what left since, when, why and whose; what was stored
since; the sessions then), and the tree then itself, browsed node by node as the tree now is
(``CacheAdapter.then_children``; ``v`` switches between the two). It opens under the header, so
the sparklines above stay in sight; the strip at its top runs from as far back as the history
reaches to now, with the moment shown."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.widgets import Static

from radixtop.adapters.errors import AdapterError
from radixtop.adapters.model import NodeView
from radixtop.adapters.text import age, human_bytes, inert, one_line
from radixtop.inspector.tree_ops import CycleOrder, TreeOp
from radixtop.inspector.tree_state import Row, TreeState
from radixtop.inspector.tree_view import CacheTree

STEPS = (1.0, 10.0, 60.0, 600.0, 3600.0)
"""The step sizes ``+`` and ``-`` go through (seconds)."""


def strip(at: float, since: float | None, now: float, width: int) -> Text:
    """One line: the history's reach on the left, now on the right, the moment marked between."""
    left = time.strftime("%H:%M:%S", time.localtime(since)) if since is not None else "?"
    inner = max(width - len(left) - len("now") - 4, 3)
    line = Text()
    line.append(left, style="dim")
    line.append(" ├")
    if since is not None and now > since:
        spot = min(inner - 1, max(0, round((at - since) / (now - since) * (inner - 1))))
        line.append("─" * spot)
        line.append("●", style="bold yellow")
        line.append("─" * (inner - spot - 1))
    else:
        line.append("─" * inner)
    line.append("┤ ")
    line.append("now", style="dim")
    return line


def _left_cell(n: NodeView) -> str:
    """Why a node of the tree then is not in the tree now, in a few cells ('' for one that is)."""
    if n.left_at is None:
        return ""
    by = f" {inert(n.left_by)}" if n.left_cause == "closed" and n.left_by else ""
    return {"evicted": "evicted", "closed": "closed", "flushed": "flushed",
            "evict_action": "evict", "unknown": "not told"}.get(n.left_cause or "", "left") + by


_THEN_COLUMNS: tuple[tuple[str, int, Any], ...] = (
    ("tokens", 7, lambda n: f"{n.tokens:,}"),
    ("subtree", 10, lambda n: human_bytes(n.subtree_bytes)),
    ("holders", 7, lambda n: "?" if n.holders is None else str(len(n.holders))),  # ?: not kept for a node still here
    ("left", 5, lambda n: "" if n.left_at is None else age(n.access_age_s)),
    ("why", 14, lambda n: _left_cell(n)[:14]),
)
_LEFT = Style(color="yellow")
_NOTE = Style(italic=True)


class ThenTree(CacheTree):
    """The tree at the timeline's moment: the nodes still in the tree now, with their figures then,
    and those that left since in yellow, with how long ago and why (holders: the sessions that held
    them when they left; of a node still here, not kept)."""

    DEFAULT_CSS = """
    ThenTree { height: 1fr; overflow-x: hidden; }
    """
    note = ""
    """What the pane says where it has no rows (the tree empty then, or the moment refused)."""

    def render_line(self, y: int) -> Strip:
        if not self.rows and self.note and y == self.HEADER_LINES:
            return Strip([Segment("  " + self.note, _NOTE)]).crop_extend(0, self._width, None)
        return super().render_line(y)

    def _segments(self, row: Row, width: int) -> list[Segment]:
        segments = super()._segments(row, width)
        if row.node is not None and row.node.left_at is not None:
            segments = [Segment(s.text, (s.style or Style()) + _LEFT) for s in segments]
        return segments

    @staticmethod
    def _shown_columns(width: int) -> range | tuple[int, ...]:
        return (1, 4) if width < 64 else (0, 1, 3, 4) if width < 90 else range(len(_THEN_COLUMNS))

    def _columns(self, node: NodeView, width: int) -> str:
        return "".join(" " + str(_THEN_COLUMNS[i][2](node)).rjust(_THEN_COLUMNS[i][1])
                       for i in self._shown_columns(width))

    def _header(self, width: int) -> str:
        cols = "".join(" " + _THEN_COLUMNS[i][0].rjust(_THEN_COLUMNS[i][1]) for i in self._shown_columns(width))
        left = "  node then · largest first"
        return left[: max(width - len(cols), 0)].ljust(max(width - len(cols), 0)) + cols

    def _request(self, op: TreeOp) -> None:
        if isinstance(op, CycleOrder):
            self.app.notify("the tree then is sorted by its subtrees then only", title="then")
            return
        super()._request(op)


class TimelineScreen(ModalScreen[None]):
    """The tree at a moment, the moment stepped with keys; each step one ``then`` read, off the UI
    thread (the answer of the latest step shows: a slow one does not come after a newer)."""

    DEFAULT_CSS = """
    TimelineScreen { align: center top; }
    TimelineScreen > Vertical {
        margin-top: 6; width: 100%; height: 1fr; background: $surface; border-top: solid $accent;
        padding: 0 1;
    }
    TimelineScreen #timeline-strip { height: 1; }
    TimelineScreen VerticalScroll { height: 1fr; }
    TimelineScreen ThenTree { display: none; }
    TimelineScreen.tree ThenTree { display: block; }
    TimelineScreen.tree VerticalScroll { display: none; }
    TimelineScreen #timeline-keys { height: 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("escape,q,T", "close", "Close", id="timeline.close"),
        Binding("left_square_bracket,left", "step(-1)", "Step back", id="timeline.back"),
        Binding("right_square_bracket,right", "step(1)", "Step forward", id="timeline.forward"),
        Binding("left_curly_bracket", "step(-10)", "Ten steps back", id="timeline.back10"),
        Binding("right_curly_bracket", "step(10)", "Ten steps forward", id="timeline.forward10"),
        Binding("plus,equals_sign", "resize(1)", "Longer steps", id="timeline.longer"),
        Binding("minus", "resize(-1)", "Shorter steps", id="timeline.shorter"),
        Binding("n", "now", "Now", id="timeline.now"),
        Binding("v", "switch", "Tree then / report", id="timeline.view"),
    ]

    def __init__(self, then: Callable[[float], Any], then_children: Callable[..., Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.then_of, self.then_children, self.clock = then, then_children, clock
        self.tree_state = TreeState(self._children_then)
        self.tree_at: float | None = None
        """The moment whose tree the tree view shows (None: not read yet)."""
        self.tree_lock = threading.Lock()
        self.tree_asked = 0
        self.step_index = 1
        self.at = clock() - STEPS[self.step_index]
        self.since: float | None = None
        self.view: Any = None
        self.asked = 0
        """The steps asked for: an answer shows only if it is the latest's."""
        self.first_at: float | None = None
        """The first moment to show, once the history's reach is known."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(id="timeline-strip")
            with VerticalScroll():
                yield Static("reading…", id="timeline-report", markup=False)
            yield ThenTree(id="timeline-tree")
            yield Static(id="timeline-keys", markup=False)

    def on_mount(self) -> None:
        # the tree now first (always within reach): its answer says how far back the history
        # reaches, and the first step back goes no further
        self.first_at, self.at = self.at, self.clock()
        self.ask()

    def keys_line(self) -> str:
        view = "v report" if self.has_class("tree") else "v tree then"
        return (f"[ ] step {age(STEPS[self.step_index])} · {{ }} ×10 · + - step · n now · {view} · "
                "esc closes")

    def ask(self) -> None:
        self.asked += 1
        asked, at = self.asked, self.at
        self.render_strip()
        if self.has_class("tree"):
            self.read_tree()

        def run() -> None:
            try:
                view = self.then_of(at)
            except AdapterError as exc:
                self.app.call_from_thread(self.refused, asked, exc.message)
                return
            self.app.call_from_thread(self.show, asked, view)

        self.run_worker(run, group="then", exclusive=False, thread=True, exit_on_error=False)

    def show(self, asked: int, view: Any) -> None:
        if asked != self.asked:
            return
        from radixtop.adapters.text import then_lines

        self.view, self.since = view, view.history_since
        if self.first_at is not None:
            at, self.first_at = max(self.first_at, view.history_since), None
            if at < self.at:
                self.at = at
                self.ask()
                return
        self.query_one("#timeline-report", Static).update("\n".join(then_lines(view, self.clock(), shown=5, sessions_shown=20)))
        self.render_strip()

    def refused(self, asked: int, message: str) -> None:
        if asked != self.asked:
            return
        self.first_at = None  # (the next answer shows as it comes)
        self.query_one("#timeline-report", Static).update(message)
        self.app.notify(message, severity="error", title="then")

    def render_strip(self) -> None:
        width = max((self.size.width or self.app.size.width) - 2, 20)
        self.query_one("#timeline-strip", Static).update(strip(self.at, self.since, self.clock(), width))
        self.query_one("#timeline-keys", Static).update(self.keys_line())

    def action_step(self, steps: int) -> None:
        self.first_at = None  # (a key pressed before the first answer: the keys' moment it is)
        now = self.clock()
        at = min(now, self.at + steps * STEPS[self.step_index])
        if self.since is not None:
            at = max(at, self.since)
        if at != self.at:
            self.at = at
            self.ask()

    def action_resize(self, by: int) -> None:
        self.step_index = min(len(STEPS) - 1, max(0, self.step_index + by))
        self.render_strip()

    def action_now(self) -> None:
        self.first_at = None
        self.at = self.clock()
        self.ask()

    def action_close(self) -> None:
        self.dismiss(None)

    # ----- the tree then -----

    def _children_then(self, node_id: int, offset: int, limit: int, order: str) -> Any:
        assert self.then_children is not None and self.tree_at is not None
        return self.then_children(self.tree_at, node_id, offset, limit)

    def action_switch(self) -> None:
        if self.then_children is None:
            self.app.notify("this target cannot show its tree at a past moment node by node", title="then")
            return
        self.toggle_class("tree")
        self.render_strip()
        if self.has_class("tree"):
            self.query_one(ThenTree).focus()
            self.read_tree()

    def read_tree(self) -> None:
        """The tree view at the moment shown: every node open in it read again at that moment (a
        node not in the tree then closes), off the UI thread; the latest asked shows."""
        if self.tree_at == self.at and self.tree_state.rows:
            return
        self.tree_asked += 1
        asked, at = self.tree_asked, self.at

        def run() -> None:
            with self.tree_lock:
                if asked != self.tree_asked:  # (a later step's read came first, or is waiting: it shows)
                    return
                self.tree_at = at
                try:
                    self.tree_state.refresh(follow_splits=False)
                except AdapterError as exc:
                    self.tree_at = None
                    self.app.call_from_thread(self.refused_tree, asked, exc.message)
                    return
                rows = list(self.tree_state.rows)
            self.app.call_from_thread(self.show_tree, asked, rows)

        self.run_worker(run, group="then-tree", exclusive=False, thread=True, exit_on_error=False)

    def show_tree(self, asked: int, rows: list[Row]) -> None:
        if asked != self.tree_asked:
            return
        top = self.tree_state.loaded.get(0)
        total = sum(c.subtree_bytes for c in top.children) if top is not None else 1
        tree = self.query_one(ThenTree)
        tree.note = "the tree held nothing then"
        tree.set_rows(rows, total, "bytes")
        tree.refresh()

    def refused_tree(self, asked: int, message: str) -> None:
        """The tree then could not be read at the moment shown: no rows of another moment under it."""
        if asked == self.tree_asked:
            tree = self.query_one(ThenTree)
            tree.note = f"not shown: {one_line(message)}"
            tree.set_rows([], 1, "bytes")
            tree.refresh()
            self.app.notify(message, severity="error", title="then")

    def on_cache_tree_request(self, message: CacheTree.Request) -> None:
        """A key on the tree then (expand, collapse, a page more, a chain): applied off the UI
        thread, in order, at the moment shown."""
        message.stop()
        op = message.op
        asked = self.tree_asked

        def run() -> None:
            with self.tree_lock:
                if self.tree_at is None:
                    return
                try:
                    outcome = op.apply(self.tree_state)
                    self.tree_state.flatten()
                except AdapterError as exc:
                    self.app.call_from_thread(self.refused_tree, asked, exc.message)
                    return
                rows = list(self.tree_state.rows)
            self.app.call_from_thread(self.show_tree, asked, rows)
            if outcome.move_to is not None:
                self.app.call_from_thread(self.query_one(ThenTree).move_to_key, outcome.move_to)
            if outcome.note:
                self.app.call_from_thread(self.app.notify, outcome.note)

        self.run_worker(run, group="then-tree", exclusive=False, thread=True, exit_on_error=False)
