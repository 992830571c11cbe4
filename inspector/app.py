"""RadixtopApp: the dashboard over any CacheAdapter (the embedded engine, or a server by URL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from radixtop.adapters.base import MAX_READS, CacheAdapter
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable, Unsupported
from radixtop.adapters.model import ROOT_ID, Capabilities, Changes, NodeDetail, Stats
from radixtop.inspector.format import age, figures_note, human_bytes
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.modals import AskScreen, ConfirmScreen, HelpScreen
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_state import TreeState
from radixtop.inspector.tree_view import CacheTree

T = TypeVar("T")

SESSIONS_LOADED = 1000
SESSIONS_EVERY = 5.0
"""Seconds between reloads of the sessions table: attributing memory to every session walks all
their paths on the owner thread, so a live dashboard does it at this pace, not every poll
(an action reloads it at once; close plans are always exact)."""
MIN_INTERVAL, MAX_INTERVAL = 0.25, 30.0
LARGE_SHARE = 0.10
"""An eviction of more than this share of capacity asks for the count to be typed."""


def _ok(result: T | AdapterError) -> T:
    """A read_many result, or its error raised."""
    if isinstance(result, AdapterError):
        raise result
    return result


def parse_token_ids(text: str) -> list[int] | None:
    parts = text.replace(",", " ").split()
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


class RadixtopApp(App[None]):
    """Live view of one cache. Polls never overlap (the next is armed when one ends); reads and
    actions run in thread workers; actions are bound to what the user saw when the modal opened."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "radixtop"
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("p", "pause", "Pause", id="app.pause"),
        Binding("slash", "search", "Search", id="app.search"),
        Binding("c", "close_sessions", "Close", id="app.close"),
        Binding("E", "evict", "Evict", id="app.evict"),
        Binding("F", "flush", "Flush", id="app.flush"),
        Binding("f", "filter_sessions", "Filter", id="app.filter"),
        Binding("plus,equals_sign", "faster", "Faster", show=False, id="app.faster"),
        Binding("minus", "slower", "Slower", show=False, id="app.slower"),
        Binding("escape", "clear_marks", "Clear marks", show=False, id="app.clear"),
        Binding("right_square_bracket", "token_page(1)", "Next token ids", show=False, id="detail.next"),
        Binding("left_square_bracket", "token_page(-1)", "Previous token ids", show=False, id="detail.prev"),
    ]
    DETAIL_TOKENS = 64

    def __init__(self, adapter: CacheAdapter, target: str | None = None, interval: float = 1.0,
                 keymap: dict[str, str] | None = None, poll: bool = True):
        super().__init__()
        self.adapter = adapter
        self.target = target or getattr(adapter, "name", "cache")
        self.interval = interval
        self.paused = False
        self.capabilities = Capabilities()
        self._caps_stale = True
        self.tree_state = TreeState(adapter.children, fetch_chain=adapter.chain, fetch_pages=lambda wanted:
                                    adapter.read_many([("children", args) for args in wanted]))
        self.tree_lock = threading.Lock()
        self.since: int | None = None
        self.stats: Stats | None = None
        self.down: str | None = None
        self.selected_node: int | None = None
        self._detail_shape: tuple = ()  # the detail shown: each row's label and length
        self._detail_rows: list = []
        self._rows_generation = 0  # the tree state's flatten count of the rows on screen
        self.detail_offset = 0
        """First token id shown in the detail panel (``[`` and ``]`` page through them)."""
        self.marked_session: str | None = None
        self._poll_enabled = poll
        self._keymap = keymap or {}
        self._sessions_at = float("-inf")
        self._figures: tuple[float, bool] = (0.0, False)  # the sessions figures' age and refresh, as read
        self._tree_moving = False  # the last poll found the tree changed: read its pages with the stats
        self.polls = 0
        """Completed polls (tests wait on it)."""

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield HeaderBar(self.target, read_only=False, id="header")
        yield Static(id="banner")
        with Horizontal(id="main"):
            yield CacheTree(id="tree")
            with Vertical(id="side"):
                yield Static(id="detail")
                yield Static(id="sessions-title")
                yield Input(placeholder="filter sessions (enter applies, escape clears)", id="filter")
                yield SessionsTable(id="sessions")
        yield Footer()

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        self.query_one("#filter", Input).display = False
        self.query_one("#banner", Static).display = False
        self.query_one(CacheTree).focus()
        if self._poll_enabled:
            self.poll()

    # ----- polling -----

    def _set_capabilities(self, caps: Capabilities) -> None:
        self.capabilities = caps
        header = self.query_one(HeaderBar)
        header.read_only = caps.read_only
        header.render_stats()
        if not caps.tree:
            self.query_one("#detail", Static).update(Text(f"No tree from this target: {caps.reason}", style="yellow"))
            self._detail_rows, self._detail_shape = [], ()
        if not caps.sessions:
            self.query_one("#sessions-title", Static).update(Text("sessions: not available here", style="yellow"))

    # One chain: each poll arms the next as it ends, so polls never overlap. Not exclusive: on a
    # loaded machine the next may start while the last is still returning, and cancelling that
    # one would only lose it.
    @work(thread=True, group="poll", exit_on_error=False)
    def poll(self) -> None:
        """One poll: stats always; the tree, sessions and detail unless paused."""
        try:
            snap = self.collect()
        except AdapterError as exc:
            self.call_from_thread(self._show_down, exc)
        except Exception as exc:  # never a traceback on screen: say it and keep polling
            self.call_from_thread(self._show_down, AdapterError(f"{type(exc).__name__}: {exc}"))
        else:
            self.call_from_thread(self.apply_snapshot, snap)
        finally:
            self.call_from_thread(self._arm_poll)

    def collect(self) -> dict[str, Any]:
        """Read what the screen needs now (runs in a worker thread)."""
        if self._caps_stale:  # first poll, or the target is back (it may have restarted otherwise)
            self.capabilities = self.adapter.capabilities()
            self._caps_stale = False
            if threading.get_ident() == self._thread_id:
                self._set_capabilities(self.capabilities)
            else:
                self.call_from_thread(self._set_capabilities, self.capabilities)
        # One read_many: one request, and where the adapter owns the cache's thread one step of
        # it (each read apart waited for a step boundary, and over HTTP cost the target's
        # interpreter a request). The tree's pages follow in a second only when it changed.
        caps, live, now = self.capabilities, not self.paused, time.monotonic()
        reads: list[tuple[str, tuple]] = [("stats", ())]
        if live and caps.tree and caps.changes and self.since is not None:
            reads.append(("changes", (self.since,)))
        want_sessions = live and caps.sessions and now - self._sessions_at >= max(SESSIONS_EVERY, self.interval)
        if want_sessions:
            reads.append(("sessions", ("exclusive_bytes", 0, SESSIONS_LOADED)))
        selected = self.selected_node if live else None
        if selected is not None:
            reads.append(("node", (selected, self.detail_offset, self.DETAIL_TOKENS)))
        # While the tree keeps changing (a live server: every poll), its pages come in the same
        # read, so a poll is one request; they are dropped if it turns out nothing shown changed.
        pages = []
        if live and caps.tree and self._tree_moving:
            with self.tree_lock:
                pages = self.tree_state.wanted()
        if len(reads) + len(pages) > MAX_READS:
            pages = []
        results = self.adapter.read_many(reads + [("children", args) for args in pages])
        got = dict(zip((op for op, _ in reads), results, strict=False))
        snap: dict[str, Any] = {"stats": _ok(got["stats"]), "time": time.monotonic()}
        if not live:
            return snap
        if caps.tree:  # a target without a tree or sessions says so once, not each poll
            with self.tree_lock:
                self._tree_moving = self._tree_changed(snap["stats"].version, got.get("changes"))
                if self._tree_moving:
                    # pages read with the stats are good unless the tree state moved meanwhile
                    # (an expand or collapse in between): then it reads its own
                    fresh = pages and pages == self.tree_state.wanted()
                    self.tree_state.refresh(prefetched=(pages, results[len(reads):]) if fresh else None)
                snap["rows"] = list(self.tree_state.rows)
                snap["order"] = self.tree_state.order
                snap["generation"] = self.tree_state.generation
        if want_sessions:
            page = _ok(got["sessions"])
            snap["sessions"] = list(page.sessions)
            snap["figures"] = (page.figures_age_s, page.refreshing)
            self._sessions_at = now
        if selected is not None:
            detail = got["node"]
            snap["detail"] = None if isinstance(detail, AdapterError) else detail
        return snap

    def _tree_changed(self, version: int, delta: Changes | AdapterError | None) -> bool:
        """Did anything the tree shows change since the last poll? (``delta``: changes(since),
        read with the stats, where the target has it; a full reload of the loaded pages otherwise)."""
        if self.since is None or delta is None:
            self.since = version
            return True
        if isinstance(delta, Unsupported):
            return True
        delta = _ok(delta)
        self.since = delta.version
        if delta.resync:
            return True
        touched = {*delta.added, *delta.changed, *delta.removed}
        shown = set(self.tree_state.expanded)
        for loaded in self.tree_state.loaded.values():
            shown.update(c.id for c in loaded.children)
        return bool(touched & shown)

    def _read_detail(self, node_id: int) -> NodeDetail | None:
        try:
            return self.adapter.node(node_id, self.detail_offset, self.DETAIL_TOKENS)
        except AdapterError:
            return None

    def apply_snapshot(self, snap: dict[str, Any]) -> None:
        """Render a snapshot (UI thread). Paused: only the header moves."""
        if self.down is not None:
            self.down = None
            self.query_one("#banner", Static).display = False
            self.notify(f"reconnected to {self.target}", title="radixtop")
        self.stats = snap["stats"]
        header = self.query_one(HeaderBar)
        header.paused = self.paused
        header.interval = self.interval
        header.update_stats(snap["stats"], snap["time"])
        if "rows" in snap:
            self._show_rows(snap["rows"], snap["stats"].total_bytes, snap["order"], snap.get("generation"))
        if "sessions" in snap:
            self.query_one(SessionsTable).set_sessions(snap["sessions"])
            self._figures = snap.get("figures", (0.0, False))
            self._title_sessions()
        if snap.get("detail") is not None:
            self._show_detail(snap["detail"])
        self.polls += 1

    def _show_down(self, exc: AdapterError) -> None:
        self.down = exc.message
        # What comes back may be a restarted target, whose versions and ids start over: the first
        # good poll reloads capabilities, the tree and the sessions in full.
        self._caps_stale = True
        self.since = None
        self._sessions_at = float("-inf")
        banner = self.query_one("#banner", Static)
        kind = "timed out" if isinstance(exc, TargetTimeout) else "cannot reach" if isinstance(
            exc, TargetUnreachable) else "error from"
        banner.update(f"⚠ {kind} {self.target}: {exc.message} · reconnecting every {self.interval:g}s "
                      f"(showing the last good data)")
        banner.display = True

    def _arm_poll(self) -> None:
        if self._poll_enabled and self.is_running:
            self.set_timer(self.interval, self.poll)

    # ----- tree -----

    def on_cache_tree_request(self, message: CacheTree.Request) -> None:
        self.tree_op(message.op, message.row)

    @work(thread=True, group="tree", exit_on_error=False)
    def tree_op(self, op: str, row) -> None:
        try:
            with self.tree_lock:
                state = self.tree_state
                if op == "toggle" and row.node is not None:
                    state.toggle(row.node)
                elif op == "expand" and row.node is not None and not row.expanded and row.node.num_children:
                    state.toggle(row.node)
                elif op == "collapse":
                    if row.node is not None and row.expanded:
                        state.collapse(row.node.id)
                    elif row.parent_id != ROOT_ID:
                        state.collapse(row.parent_id)
                        self.call_from_thread(self.query_one(CacheTree).move_to_key, ("node", row.parent_id))
                elif op == "more":
                    state.load_more(row.parent_id)
                    state.flatten()
                elif op == "chain" and row.node is not None:
                    top = row.chain[0] if row.chain else row.node
                    length = state.fold_chain(top)
                    if length == 1:
                        self.call_from_thread(self.notify, "no chain of single children below this node")
                elif op == "order":
                    state.set_order("recency" if state.order == "bytes" else "bytes")
                    self.call_from_thread(self.notify, f"children sorted by {state.order}")
                rows, order, generation = list(state.rows), state.order, state.generation
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error", title="radixtop")
            return
        total = self.stats.total_bytes if self.stats else 1
        self.call_from_thread(self._show_rows, rows, total, order, generation)

    def _show_rows(self, rows: list, total_bytes: int, order: str, generation: int | None) -> None:
        """Rows to the tree, unless rows flattened later are already shown (a poll that read the
        tree before an expand may land after it: it must not undo the expand on screen)."""
        if generation is not None:
            if generation < self._rows_generation:
                return
            self._rows_generation = generation
        self.query_one(CacheTree).set_rows(rows, total_bytes, order)

    def on_cache_tree_selected(self, message: CacheTree.Selected) -> None:
        row = message.row
        selected = row.node.id if row is not None and row.node is not None else None
        if selected != self.selected_node:
            self.detail_offset = 0
        self.selected_node = selected
        if self.selected_node is not None:
            self.load_detail(self.selected_node)

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def load_detail(self, node_id: int) -> None:
        detail = self._read_detail(node_id)
        if detail is not None:
            self.call_from_thread(self._show_detail, detail)

    def _show_detail(self, d: NodeDetail) -> None:
        if d.node.id != self.selected_node:
            return
        n = d.node
        ids = " ".join(map(str, d.token_ids))
        more = " …" if n.tokens > len(d.token_ids) + d.token_offset else ""
        span = f"ids {d.token_offset}-{d.token_offset + len(d.token_ids)}" if n.tokens > self.DETAIL_TOKENS else "ids"
        rows = [
            ("node", f"#{n.id}  parent {'-' if n.parent_id is None else '#' + str(n.parent_id)}  depth {n.depth}"),
            ("tokens", f"{n.tokens:,} · {human_bytes(n.bytes)}  (path {d.path_tokens:,})"),
            ("subtree", f"{n.subtree_tokens:,} tok · {human_bytes(n.subtree_bytes)} · {n.num_children} children"),
            ("lock_ref", f"{n.lock_ref}   hit_count {n.hit_count}"),
            ("access", f"{age(n.access_age_s)} ago · created {age(n.created_age_s)} ago"),
            ("holders", ", ".join(n.holders) or "-"),
            ("beneath", f"{d.sessions_beneath} sessions hold something here or below"),
            (span, Text(("… " if d.token_offset else "") + ids + more, style="dim")),
        ]
        if n.text:
            rows.append(("text", n.text))
        if rows == self._detail_rows:
            return  # nothing the panel shows changed
        self._detail_rows = rows
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)  # labels keep their width; values wrap
        table.add_column(ratio=1)
        for label, value in rows:
            table.add_row(label, value)
        # The panel's height follows the number of rows and how each one wraps, which only a change
        # of some cell's length can alter (a busy node's counts and ages change on every poll):
        # a layout pass of the screen is needed only then.
        shape = tuple((label, len(value)) for label, value in rows)
        self.query_one("#detail", Static).update(table, layout=shape != self._detail_shape)
        self._detail_shape = shape

    def action_token_page(self, step: int) -> None:
        """Page the detail panel's token ids (``[`` back, ``]`` forward)."""
        if self.selected_node is None:
            return
        tokens = self.query_one(CacheTree).current.node.tokens if self.query_one(CacheTree).current else 0
        offset = self.detail_offset + step * self.DETAIL_TOKENS
        if 0 <= offset < max(tokens, 1):
            self.detail_offset = offset
            self.load_detail(self.selected_node)

    # ----- sessions -----

    def _title_sessions(self) -> None:
        table = self.query_one(SessionsTable)
        marked = f" · {len(table.marked)} marked" if table.marked else ""
        shown = f" · filter {table.filter_text!r}" if table.filter_text else ""
        note = figures_note(*self._figures)
        old = f" · {note}" if note else ""
        title = f"[b]sessions[/] {len(table.shown)} of {len(table.all)}{shown}{marked}{old}"
        line = self.query_one("#sessions-title", Static)
        if line.content != title:
            line.update(title, layout=False)  # one line, fixed height

    def on_sessions_table_chosen(self, message: SessionsTable.Chosen) -> None:
        self.show_session_chains(message.session.id)

    @work(thread=True, exclusive=True, group="chains", exit_on_error=False)
    def show_session_chains(self, session_id: str) -> None:
        """Expand the tree down to every node the session holds and mark those chains."""
        try:
            detail = self.adapter.session(session_id)
            marked: set[int] = set()
            ancestors: set[int] = set()
            for node_id in detail.node_ids[:64]:
                current: int | None = node_id
                while current is not None and current != ROOT_ID and current not in marked:
                    marked.add(current)
                    current = self.adapter.node(current, 0, 1).node.parent_id
                    if current is not None and current != ROOT_ID:
                        ancestors.add(current)
            with self.tree_lock:
                for node_id in ancestors:  # open the way down to every tagged node
                    self.tree_state.expand(node_id)
                self.tree_state.refresh()
                rows, order, generation = list(self.tree_state.rows), self.tree_state.order, self.tree_state.generation
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return

        def show() -> None:
            tree = self.query_one(CacheTree)
            self._show_rows(rows, self.stats.total_bytes if self.stats else 1, order, generation)
            tree.set_marked(frozenset(marked))
            if detail.node_ids:
                tree.move_to_key(("node", detail.node_ids[0]))
            self.notify(f"session {session_id}: {len(detail.node_ids)} nodes marked in the tree",
                        title="radixtop")

        self.call_from_thread(show)

    def action_clear_marks(self) -> None:
        self.query_one(CacheTree).set_marked(frozenset())
        table = self.query_one(SessionsTable)
        table.marked.clear()
        table.refresh()
        self._title_sessions()

    def action_filter_sessions(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            table = self.query_one(SessionsTable)
            table.set_filter(event.value)
            self._title_sessions()
            if not event.value.strip():
                event.input.display = False
            table.focus()

    # ----- live controls -----

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self._sessions_at = float("-inf")  # resuming shows fresh sessions at once
        header = self.query_one(HeaderBar)
        header.paused = self.paused
        header.render_stats()
        self.notify("paused: tree and sessions frozen, the header keeps moving" if self.paused else "live again")

    def action_faster(self) -> None:
        self.interval = max(MIN_INTERVAL, self.interval / 2)
        self._interval_changed()

    def action_slower(self) -> None:
        self.interval = min(MAX_INTERVAL, self.interval * 2)
        self._interval_changed()

    def _interval_changed(self) -> None:
        header = self.query_one(HeaderBar)
        header.interval = self.interval
        header.render_stats()
        self.notify(f"refresh every {self.interval:g}s")

    def action_help(self) -> None:
        lines = []
        seen = set()
        for widget in (self, self.query_one(CacheTree), self.query_one(SessionsTable)):
            for binding in widget._bindings.key_to_bindings.values():
                for b in binding:
                    if b.id in seen or not b.description:
                        continue
                    seen.add(b.id)
                    lines.append(f"[b]{b.key:>16}[/]  {b.description}  [dim]({b.id})[/]")
        self.push_screen(HelpScreen("\n".join(lines)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Pause / resume", "Freeze the tree and sessions (header keeps moving)", self.action_pause)
        yield SystemCommand("Search a prefix", "Jump to the longest cached prefix of token ids", self.action_search)
        yield SystemCommand("Close sessions", "Close the marked or highlighted sessions", self.action_close_sessions)
        yield SystemCommand("Evict tokens", "Evict least-recently-used unlocked leaves", self.action_evict)
        yield SystemCommand("Flush", "Free everything not locked", self.action_flush)
        yield SystemCommand("Keys", "Show every key", self.action_help)

    # ----- search -----

    def action_search(self) -> None:
        self.push_screen(AskScreen("Search the cache", "Paste token ids (comma or space separated); "
                                   "the tree jumps to the longest cached prefix.", "1, 2, 3"),
                         self._search_submitted)

    def _search_submitted(self, text: str | None) -> None:
        if not text:
            return
        tokens = parse_token_ids(text)
        if tokens is None:
            self.notify("this target has no tokenizer: paste token ids (integers)", severity="warning")
            return
        self.search(tokens)

    @work(thread=True, exclusive=True, group="search", exit_on_error=False)
    def search(self, tokens: list[int]) -> None:
        try:
            m = self.adapter.match(tokens)
            target = m.partial_node_id if m.partial_node_id is not None else m.node_id
            path: list[int] = []
            current: int | None = target
            while current is not None and current != ROOT_ID:
                current = self.adapter.node(current, 0, 1).node.parent_id
                if current is not None:
                    path.append(current)
            with self.tree_lock:
                for node_id in reversed(path):
                    self.tree_state.expand(node_id)
                self.tree_state.refresh()
                rows, order, generation = list(self.tree_state.rows), self.tree_state.order, self.tree_state.generation
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return

        def show() -> None:
            tree = self.query_one(CacheTree)
            self._show_rows(rows, self.stats.total_bytes if self.stats else 1, order, generation)
            if target != ROOT_ID:
                tree.move_to_key(("node", target))
            tree.focus()
            where = "" if m.partial_node_id is None else f" ({m.partial_tokens} tokens into #{m.partial_node_id})"
            self.notify(f"{m.matched_tokens} of {m.query_tokens} tokens cached{where}", title="search")

        self.call_from_thread(show)

    # ----- actions: plan, preview, confirm, execute -----

    def _refuse_actions(self, action: str = "") -> bool:
        caps = self.capabilities
        if caps.read_only:
            self.notify(f"{self.target} is read-only: actions are disabled", severity="warning", title="read-only")
            return True
        if action and not getattr(caps, action):
            self.notify(f"{self.target} cannot {action}: {caps.reason}", severity="warning", title="not here")
            return True
        return False

    def action_close_sessions(self) -> None:
        if self._refuse_actions("close"):
            return
        table = self.query_one(SessionsTable)
        ids = sorted(table.marked) or ([table.current.id] if table.current else [])
        if not ids:
            self.notify("no session highlighted or marked (space marks one)", severity="warning")
            return
        self.plan_closes(tuple(ids))

    @work(thread=True, exclusive=True, group="action", exit_on_error=False)
    def plan_closes(self, ids: tuple[str, ...]) -> None:
        try:
            plans = [self.adapter.plan_close(sid) for sid in ids]
        except Unsupported as exc:  # a target that closes but cannot preview: say so, then ask
            self.call_from_thread(self._confirm_blind_closes, ids, exc.message)
            return
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return
        self.call_from_thread(self._confirm_closes, plans)

    def _confirm_blind_closes(self, ids: tuple[str, ...], why: str) -> None:
        body = Text(f"{self.target} cannot show what a close frees ({why}).\n"
                    f"Sessions: {', '.join(ids)}. What was freed is read back afterwards.")
        self.push_screen(
            ConfirmScreen(f"Close {len(ids)} session(s) without a preview", body, "Close",
                          require_text=str(len(ids))),
            lambda ok: self.run_closes(ids, []) if ok else self.notify("cancelled; nothing changed"),
        )

    def _confirm_closes(self, plans: list) -> None:
        body = Table(show_edge=False)
        for col in ("session", "state", "frees now", "nodes", "stays (why)"):
            body.add_column(col)
        for p in plans:
            kept: dict[str, int] = {}
            for k in p.kept:
                kept[k.reason] = kept.get(k.reason, 0) + k.tokens
            body.add_row(p.session_id, p.state, f"{p.freed_tokens:,} tok · {human_bytes(p.freed_bytes)}",
                         str(len(p.freed_node_ids)), ", ".join(f"{v:,} tok {r}" for r, v in kept.items()) or "-")
        total = sum(p.freed_bytes for p in plans)
        bulk = len(plans) > 1
        ids = tuple(p.session_id for p in plans)  # what the user saw: the action is bound to these
        self.push_screen(
            ConfirmScreen(f"Close {len(plans)} session(s): frees {human_bytes(total)} now", body,
                          "Close", require_text=str(len(plans)) if bulk else None),
            lambda ok: self.run_closes(ids, plans) if ok else self.notify("cancelled; nothing changed"),
        )

    @work(thread=True, group="action", exit_on_error=False)
    def run_closes(self, ids: tuple[str, ...], plans: list) -> None:
        planned = {p.session_id: p for p in plans}
        lines = []
        for sid in ids:
            try:
                r = self.adapter.close_session(sid)
            except AdapterError as exc:
                lines.append(f"{sid}: {exc.message}")
                continue
            plan = planned.get(sid)
            diff = "" if plan is None or r.freed_tokens == plan.freed_tokens else \
                f" (plan said {plan.freed_tokens:,}: the cache changed in between)"
            lines.append(f"{sid}: freed {r.freed_tokens:,} tok · {human_bytes(r.freed_bytes)}{diff}")
        self.call_from_thread(self.notify, "\n".join(lines), title="closed", timeout=8)
        # A lambda: Textual reads the callback's signature, and a builtin such as set.clear has none.
        self.call_from_thread(lambda: self.query_one(SessionsTable).marked.clear())
        self._sessions_at = float("-inf")  # the sessions table shows the action at once
        self.call_from_thread(self.poll)

    def action_evict(self) -> None:
        if self._refuse_actions("evict"):
            return
        evictable = self.stats.evictable_tokens if self.stats else 0
        self.push_screen(AskScreen("Evict tokens", f"How many tokens? ({evictable:,} evictable now; whole "
                                   "least-recently-used unlocked leaves go first)", "tokens"), self._evict_count)

    def _evict_count(self, text: str | None) -> None:
        if text is None:
            return
        if not text.strip().isdigit():
            self.notify(f"not a token count: {text!r}", severity="error")
            return
        n = int(text.strip())
        st = self.stats
        bpt = st.bytes_per_token if st else 0
        large = st is not None and n >= LARGE_SHARE * st.capacity_tokens
        body = Text(f"Evict at least {n:,} tokens ({human_bytes(n * bpt)}) of "
                    f"{st.evictable_tokens if st else 0:,} evictable.")
        self.push_screen(ConfirmScreen("Evict", body, "Evict", require_text=str(n) if large else None),
                         lambda ok: self.perform_action("evict", n) if ok else self.notify("cancelled; nothing changed"))

    def action_flush(self) -> None:
        if self._refuse_actions("flush"):
            return
        st = self.stats
        body = Text(f"Free every unlocked node: {st.evictable_tokens if st else 0:,} tokens "
                    f"({human_bytes(st.evictable_bytes) if st else '-'}). Running requests keep their paths.")
        self.push_screen(ConfirmScreen("Flush the cache", body, "Flush", require_text="flush"),
                         lambda ok: self.perform_action("flush", 0) if ok else self.notify("cancelled; nothing changed"))

    @work(thread=True, group="action", exit_on_error=False)
    def perform_action(self, action: str, n: int) -> None:
        try:
            if action == "evict":
                r = self.adapter.evict(n)
                message = f"evicted {r.evicted_tokens:,} tok · {human_bytes(r.evicted_bytes)} in {r.evicted_nodes} nodes"
            else:
                r = self.adapter.flush()
                message = f"flushed {r.freed_tokens:,} tok · {human_bytes(r.freed_bytes)}" + (
                    f"; {r.message}" if r.message else "")
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return
        self.call_from_thread(self.notify, message, title=action)
        self._sessions_at = float("-inf")  # the sessions table shows the action at once
        self.call_from_thread(self.poll)


def run_dashboard(adapter: CacheAdapter, target: str | None = None, interval: float = 1.0,
                  keymap: dict[str, str] | None = None, on_exit: Callable[[], None] | None = None) -> None:
    try:
        RadixtopApp(adapter, target, interval, keymap).run()
    finally:
        if on_exit is not None:
            on_exit()
