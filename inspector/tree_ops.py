"""The tree operations a key asks for, one small class each, applied to a TreeState in order.

Pure data (no textual). A key press makes one operation from the row under the cursor; the screen
queues it and one loader applies the queue in order (``Poller.tree_op``), so quick presses run as
pressed. Whether a node is expanded is read from the state when the operation runs, not from the
row on screen, which may not show the presses before it yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixtop.adapters.model import ROOT_ID, NodeView
from radixtop.inspector.tree_state import TreeState


@dataclass(frozen=True)
class Outcome:
    """What an operation asks of the screen besides the new rows."""

    move_to: tuple[str, int] | None = None
    """The row key the cursor goes to (None: it stays on its row)."""
    note: str = ""
    """Said in a toast (empty: nothing to say)."""


class TreeOp:
    """One operation on the tree's state; runs in a worker thread, under the poller's tree lock."""

    def apply(self, state: TreeState) -> Outcome:
        raise NotImplementedError


@dataclass(frozen=True)
class Toggle(TreeOp):
    """Enter on a node: expand it, or collapse it if it is expanded."""

    node: NodeView

    def apply(self, state: TreeState) -> Outcome:
        state.toggle(self.node)
        return Outcome()


@dataclass(frozen=True)
class Expand(TreeOp):
    """Right: expand a node that has children and is not expanded yet."""

    node: NodeView

    def apply(self, state: TreeState) -> Outcome:
        if self.node.num_children and not state.is_expanded(self.node.id):
            state.toggle(self.node)
        return Outcome()


@dataclass(frozen=True)
class Collapse(TreeOp):
    """Left: collapse an expanded node; on any other row, collapse its parent and go there."""

    node: NodeView | None
    """None on a "more" row."""
    parent_id: int

    def apply(self, state: TreeState) -> Outcome:
        if self.node is not None and state.is_expanded(self.node.id):
            state.collapse(self.node.id)
            return Outcome()
        if self.parent_id != ROOT_ID:
            state.collapse(self.parent_id)
            return Outcome(move_to=("node", self.parent_id))
        return Outcome()


@dataclass(frozen=True)
class LoadMore(TreeOp):
    """Enter on a "more" row: load the parent's next page of children."""

    parent_id: int

    def apply(self, state: TreeState) -> Outcome:
        state.load_more(self.parent_id)
        state.flatten()
        return Outcome()


@dataclass(frozen=True)
class FoldChain(TreeOp):
    """x: fold the run of single children below ``top`` into one row, or unfold it."""

    top: NodeView

    def apply(self, state: TreeState) -> Outcome:
        if state.fold_chain(self.top) == 1:
            return Outcome(note="no chain of single children below this node")
        return Outcome()


@dataclass(frozen=True)
class CycleOrder(TreeOp):
    """o: sort children by bytes, then by recency, and round again."""

    def apply(self, state: TreeState) -> Outcome:
        state.set_order("recency" if state.order == "bytes" else "bytes")
        return Outcome(note=f"children sorted by {state.order}")
