"""DetailPanel: everything about the node under the tree's cursor, one labelled row per fact."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from radixtop.adapters.model import NodeDetail
from radixtop.adapters.text import age, human_bytes, inert, known
from radixtop.inspector.poller import DETAIL_TOKENS
from radixtop.inspector.rows_view import pane_binding


def detail_rows(d: NodeDetail) -> list[tuple[str, str | Text]]:
    """(label, value) for each line of the panel. What came from the target (holders, text) is
    plain text: never markup, never a terminal control code."""
    n = d.node
    ids = " ".join(map(str, d.token_ids))
    more = " …" if n.tokens > len(d.token_ids) + d.token_offset else ""
    span = f"ids {d.token_offset}-{d.token_offset + len(d.token_ids)}" if n.tokens > DETAIL_TOKENS else "ids"
    rows: list[tuple[str, str | Text]] = [
        ("node", f"#{n.id}  parent {'-' if n.parent_id is None else '#' + str(n.parent_id)}  depth {n.depth}"),
        ("tokens", f"{n.tokens:,} · {human_bytes(n.bytes)}  (path {d.path_tokens:,})"),
        ("subtree", f"{n.subtree_tokens:,} tok · {human_bytes(n.subtree_bytes)} · {n.num_children} children"),
        ("lock_ref", f"{known(n.lock_ref)}   hit_count {known(n.hit_count)}"),
        ("access", f"{age(n.access_age_s)} ago · created {age(n.created_age_s)} ago"),
        ("holders", Text("unknown" if n.holders is None else inert(", ".join(n.holders)) or "-")),
        ("beneath", "unknown" if d.sessions_beneath is None
         else f"{d.sessions_beneath} sessions hold something here or below"),
        (span, Text(("… " if d.token_offset else "") + ids + more, style="dim")),
    ]
    if n.tiers is not None:  # a target with storage tiers (SGLang): where this node's KV is
        rows.insert(5, ("tiers", Text(inert(" + ".join(n.tiers)) or "-")))  # the target's names: plain text
    if d.group is not None:  # a hybrid model's KV group (vLLM)
        rows.insert(2, ("group", Text(inert(d.group))))
    if d.lora is not None:  # a LoRA adapter's blocks (vLLM)
        rows.insert(2, ("lora", Text(inert(d.lora))))
    text = d.text if d.text is not None else n.text
    if text:  # the page as text, where the target has a tokenizer (the ids above, one glance away)
        rows.append(("text", Text(inert(text, lines=True))))
    return rows


class DetailPanel(Static, can_focus=True):
    """Shows a NodeDetail, or a one-line message where there is none (a target without a tree).
    A pane tab stops at, between the tree and the sessions."""

    BINDINGS = [pane_binding("detail")]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rows: list[tuple[str, str | Text]] = []
        self._shape: tuple = ()  # each row's label and length, as shown

    def show(self, detail: NodeDetail) -> None:
        rows = detail_rows(detail)
        if rows == self._rows:
            return  # nothing the panel shows changed
        self._rows = rows
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)  # labels keep their width; values wrap
        table.add_column(ratio=1)
        for label, value in rows:
            table.add_row(label, value)
        # The panel's height follows the number of rows and how each one wraps, which only a change
        # of some cell's length can alter (a busy node's counts and ages change on every poll):
        # a layout pass of the screen is needed only then.
        shape = tuple((label, len(value)) for label, value in rows)
        self.update(table, layout=shape != self._shape)
        self._shape = shape

    def show_message(self, text: Text) -> None:
        self._rows, self._shape = [], ()
        self.update(text)
