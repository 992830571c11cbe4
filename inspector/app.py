"""RadixtopApp: the dashboard over any CacheAdapter (the embedded engine, or a server by URL).

The App only applies data and dispatches keys: a Poller (``poller.py``) reads the target in worker
threads and hands back frozen Snapshots, which arrive here as one message each and are applied on
the App's own thread; the actions' flows are in ``actions.py``, the views in their own modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable
from radixtop.adapters.model import ROOT_ID, Capabilities, NodeDetail, Stats
from radixtop.adapters.text import figures_note, inert
from radixtop.inspector.actions import ActionFlows
from radixtop.inspector.detail import DetailPanel
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.modals import AskScreen, DoctorScreen, HelpScreen
from radixtop.inspector.poller import DETAIL_TOKENS, Poller, PollRequest, Snapshot, TreeRows
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree

MIN_INTERVAL, MAX_INTERVAL = 0.25, 30.0


def parse_token_ids(text: str) -> list[int] | None:
    parts = text.replace(",", " ").split()
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


class FilterBox(Input):
    """The sessions filter: Enter applies it; Escape clears it (and the table's filter) and
    leaves the box, as it says."""

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    def action_clear_filter(self) -> None:
        self.value = ""
        self.post_message(self.Submitted(self, ""))


class RadixtopApp(ActionFlows, App[None]):
    """Live view of one cache. Polls never overlap (the next is armed when one ends); reads and
    actions run in thread workers; actions are bound to what the user saw when the modal opened."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "radixtop"
    BINDINGS = [
        # In the footer in this order: the actions first, then how to find every other key (at 80
        # columns these must stay visible; what follows may be cut).
        Binding("c", "close_sessions", "Close", id="app.close"),
        Binding("E", "evict", "Evict", id="app.evict"),
        Binding("F", "flush", "Flush", id="app.flush"),
        Binding("f", "filter_sessions", "Filter", id="app.filter"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("slash", "search", "Search", id="app.search"),
        Binding("D", "doctor", "Leak doctor", show=False, id="app.doctor"),
        Binding("p", "pause", "Pause", id="app.pause"),
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True, id="app.interrupt"),
        Binding("plus,equals_sign", "faster", "Faster", show=False, id="app.faster"),
        Binding("minus", "slower", "Slower", show=False, id="app.slower"),
        Binding("escape", "clear_marks", "Clear marks", show=False, id="app.clear"),
        Binding("right_square_bracket", "token_page(1)", "Next token ids", show=False, id="detail.next"),
        Binding("left_square_bracket", "token_page(-1)", "Previous token ids", show=False, id="detail.prev"),
    ]

    class Polled(Message):
        """A poll's snapshot, from the poll worker."""

        def __init__(self, snapshot: Snapshot) -> None:
            self.snapshot = snapshot
            super().__init__()

    class PollFailed(Message):
        """A poll that the target failed, from the poll worker."""

        def __init__(self, error: AdapterError) -> None:
            self.error = error
            super().__init__()

    def __init__(self, adapter: CacheAdapter, target: str | None = None, interval: float = 1.0,
                 keymap: dict[str, str] | None = None, poll: bool = True):
        super().__init__()
        self.adapter = adapter
        self.poller = Poller(adapter)
        self.target = target or getattr(adapter, "name", "cache")
        self.interval = interval
        self.paused = False
        self.stats: Stats | None = None
        """The last good poll's stats."""
        self.down: str | None = None
        """Why the target is unreachable now; None while polls succeed."""
        self.selected_node: int | None = None
        self._rows_generation = 0  # the tree state's flatten count of the rows on screen
        self.detail_offset = 0
        """First token id shown in the detail panel (``[`` and ``]`` page through them)."""
        self._poll_enabled = poll
        self._keymap = keymap or {}
        self.sessions_table = SessionsTable(id="sessions")
        self._quit_asked = False
        self._sessions_error: str | None = None  # said once, until the sessions read works again
        self._figures: tuple[float, bool, bool] = (0.0, False, False)  # age, refreshing, current, as read
        self._figures_read: tuple[float, int] = (0.0, 0)  # when the sessions were read, the cache's version then
        self._polled_at = 0.0  # the latest snapshot's time
        self._polling = False
        self._poll_again = False
        self._poll_timer: Timer | None = None
        self.polls = 0
        """Completed polls (tests wait on it)."""

    @property
    def capabilities(self) -> Capabilities:
        return self.poller.capabilities

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield HeaderBar(self.target, read_only=False, id="header")
        yield Static(id="banner")
        with Horizontal(id="main"):
            yield CacheTree(id="tree")
            with Vertical(id="side"):
                yield DetailPanel(id="detail")
                yield Static(id="sessions-title")
                yield FilterBox(placeholder="filter sessions (enter applies, escape clears)", id="filter")
                yield self.sessions_table
        yield Footer(compact=True, show_command_palette=False)  # (ctrl+p still opens it; ? lists it)

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        self.query_one("#filter", Input).display = False
        self.query_one("#banner", Static).display = False
        self.query_one(CacheTree).focus()
        if self._poll_enabled:
            self.poll()

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every note is plain text with control codes made visible (they quote session ids,
        targets' names and errors): a note never reads a target's words as markup."""
        super().notify(inert(message, lines=True), title=inert(title), severity=severity, timeout=timeout,
                       markup=markup)

    def notice_from_thread(self, text: str) -> None:
        """A note on screen, from a thread other than the app's (plain text: it may quote a
        target's words); dropped when the app is not running."""
        try:
            self.call_from_thread(self.notify, text, title="radixtop", severity="warning", timeout=30,
                                  markup=False)
        except RuntimeError:  # not running (yet, or any more): nobody to tell
            pass

    # ----- polling -----

    def poll_request(self) -> PollRequest:
        return PollRequest(not self.paused, self.selected_node, self.detail_offset, self.interval,
                           self.sessions_table.query)

    def poll(self) -> None:
        """Start a poll now; with one in flight, the next starts as soon as it ends (one chain)."""
        if self._polling:
            self._poll_again = True
            return
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None
        self._polling = True
        self._poll_worker(self.poll_request())

    @work(thread=True, group="poll", exit_on_error=False)
    def _poll_worker(self, request: PollRequest) -> None:
        try:
            self.post_message(self.Polled(self.poller.collect(request)))
        except AdapterError as exc:
            self.post_message(self.PollFailed(exc))
        except Exception as exc:  # never a traceback on screen: say it and keep polling
            self.post_message(self.PollFailed(AdapterError(f"{type(exc).__name__}: {exc}")))

    def on_radixtop_app_polled(self, message: Polled) -> None:
        if self.is_running:  # not while shutting down: the widgets are gone
            self.apply_snapshot(message.snapshot)
            self._poll_done()

    def on_radixtop_app_poll_failed(self, message: PollFailed) -> None:
        self.poller.lost()
        if self.is_running:
            self._show_down(message.error)
            self._poll_done()

    def _poll_done(self) -> None:
        self._polling = False
        if self._poll_again:
            self._poll_again = False
            self.poll()
        elif self._poll_enabled and self.is_running:
            self._poll_timer = self.set_timer(self.interval, self.poll)

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Show a snapshot (UI thread). Paused: only the header moves."""
        if snap.capabilities is not None:
            self._set_capabilities(snap.capabilities)
        if self.down is not None:
            self.down = None
            self.query_one("#banner", Static).display = False
            self.query_one(HeaderBar).down = False
            self.notify(f"reconnected to {self.target}", title="radixtop")
        self.stats = snap.stats
        self._polled_at = snap.taken_at
        header = self.query_one(HeaderBar)
        header.paused = self.paused
        header.interval = self.interval
        header.update_stats(snap.stats, snap.taken_at)
        if snap.tree is not None:
            self._show_rows(snap.tree)
        if snap.sessions is not None:
            self.query_one(SessionsTable).set_page(snap.sessions)
            self._figures = (snap.sessions.figures_age_s, snap.sessions.refreshing, snap.sessions.figures_current)
            self._figures_read = (snap.taken_at, snap.stats.version)
        if self.query_one(SessionsTable).page is not None:
            self._title_sessions()  # every poll: the figures' age counts between reads of the sessions
        if snap.sessions_error is not None and snap.sessions_error != self._sessions_error:
            self.notify(f"sessions: {snap.sessions_error}", severity="error", title="radixtop", markup=False)
        self._sessions_error = snap.sessions_error if snap.sessions is None else None
        if snap.detail is not None:
            self._show_detail(snap.detail)
        self.polls += 1

    def _set_capabilities(self, caps: Capabilities) -> None:
        header = self.query_one(HeaderBar)
        header.read_only = caps.read_only
        header.render_stats()
        if not caps.tree:
            self.query_one(DetailPanel).show_message(Text(f"No tree from this target: {inert(caps.reason)}", style="yellow"))
        if not caps.sessions:
            self.query_one("#sessions-title", Static).update(Text("sessions: not available here", style="yellow"))

    def _show_down(self, exc: AdapterError) -> None:
        self.down = exc.message
        banner = self.query_one("#banner", Static)
        kind = "timed out" if isinstance(exc, TargetTimeout) else "cannot reach" if isinstance(
            exc, TargetUnreachable) else "error from"
        text = Text(f"⚠ {kind} {inert(self.target)}: {inert(exc.message)} · reconnecting every {self.interval:g}s "
                    f"(showing the last good data)")  # plain text: a target's message is not markup
        if banner.content != text:
            banner.update(text)
        banner.display = True
        header = self.query_one(HeaderBar)
        if not header.down:
            header.down = True
            header.render_stats()

    # ----- tree -----

    def on_cache_tree_request(self, message: CacheTree.Request) -> None:
        self.tree_op(message.op, message.row)

    @work(thread=True, group="tree", exit_on_error=False)
    def tree_op(self, op: str, row) -> None:
        try:
            update = self.poller.tree_op(op, row)
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error", title="radixtop")
            return

        def show() -> None:
            self._show_rows(update.tree)
            if update.move_to is not None:
                self.query_one(CacheTree).move_to_key(update.move_to)
            if update.note:
                self.notify(update.note)

        self.call_from_thread(show)

    def _show_rows(self, tree: TreeRows) -> None:
        """Rows to the tree, unless rows flattened later are already shown (a poll that read the
        tree before an expand may land after it: it must not undo the expand on screen)."""
        if tree.generation < self._rows_generation:
            return
        self._rows_generation = tree.generation
        self.query_one(CacheTree).set_rows(tree.rows, self.stats.total_bytes if self.stats else 1, tree.order)

    # ----- detail -----

    def on_cache_tree_selected(self, message: CacheTree.Selected) -> None:
        row = message.row
        selected = row.node.id if row is not None and row.node is not None else None
        if selected != self.selected_node:
            self.detail_offset = 0
        self.selected_node = selected
        if self.selected_node is not None:
            self.load_detail(self.selected_node, self.detail_offset)

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def load_detail(self, node_id: int, offset: int) -> None:
        detail = self.poller.detail(node_id, offset)
        if detail is not None:
            self.call_from_thread(self._show_detail, detail)

    def _show_detail(self, detail: NodeDetail) -> None:
        # The cursor, or the page of token ids, may have moved on since this was read (a poll that
        # read page 0 can land after ``]``): show only the node and page the operator is on.
        if detail.node.id == self.selected_node and detail.token_offset == self.detail_offset:
            self.query_one(DetailPanel).show(detail)

    def action_token_page(self, step: int) -> None:
        """Page the detail panel's token ids (``[`` back, ``]`` forward)."""
        row = self.query_one(CacheTree).current
        if self.selected_node is None or row is None or row.node is None:
            return
        offset = self.detail_offset + step * DETAIL_TOKENS
        if 0 <= offset < max(row.node.tokens, 1):
            self.detail_offset = offset
            self.load_detail(self.selected_node, offset)

    # ----- sessions -----

    def _title_sessions(self) -> None:
        """'sessions 10,632 · figures 1s old', or with a filter 'sessions 37 of 10,632 · filter
        's5''; how old the figures are is always said (the ranking is what the operator acts on)."""
        table = self.query_one(SessionsTable)
        page = table.page
        parts = ["[b]sessions[/]"]
        if page is not None and page.contains == table.filter_text:
            parts[0] += (f" {page.total:,} of {page.all_sessions:,}" if page.contains and page.all_sessions is not None
                         else f" {page.total:,}")
        if table.filter_text:
            parts.append(f"filter {literal(repr(table.filter_text))}")
        if table.marked:
            parts.append(f"{len(table.marked)} marked")
        if page is not None:
            # The sessions are read every few seconds, the stats every poll: the figures are as old
            # as the target said, and as long again as since they were read; exact ("unchanged")
            # only while the cache's version has not moved since.
            age_s, refreshing, current = self._figures
            read_at, version = self._figures_read
            current = current and self.stats is not None and self.stats.version == version
            parts.append(figures_note(age_s + max(0.0, self._polled_at - read_at), refreshing, current))
        title = " · ".join(parts)
        line = self.query_one("#sessions-title", Static)
        if line.content != title:
            line.update(title, layout=False)  # one line, fixed height

    def on_sessions_table_query_changed(self, message: SessionsTable.QueryChanged) -> None:
        self._title_sessions()
        self.poll()  # the poller reads the sessions at once for a new query

    def on_sessions_table_chosen(self, message: SessionsTable.Chosen) -> None:
        self.show_session_chains(message.session.id)

    @work(thread=True, exclusive=True, group="chains", exit_on_error=False)
    def show_session_chains(self, session_id: str) -> None:
        """Expand the tree down to every node the session holds and mark those chains."""
        try:
            detail, marked, tree = self.poller.session_chains(session_id)
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return

        def show() -> None:
            view = self.query_one(CacheTree)
            self._show_rows(tree)
            view.set_marked(marked)
            if detail.node_ids:
                view.move_to_key(("node", detail.node_ids[0]))
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
            self.poller.sessions_due()  # resuming shows fresh sessions at once
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

    async def action_quit(self) -> None:
        """q or ctrl+c: quit; while an action (a close, an evict, a flush) is in flight, ask once
        (its result would not be seen), and quit at the second press."""
        busy = any(w.group == "action" and w.is_running for w in self.workers)
        if busy and not self._quit_asked:
            self._quit_asked = True
            self.notify("an action is still running: press again to quit without its result",
                        severity="warning", title="quit?")
            return
        self.exit()

    def action_help(self) -> None:
        """Every key as it is bound now (after ``--keymap``), written as people write keys (``?``,
        ``]``, ``ctrl+c``), with the id ``--keymap`` takes."""
        keys: dict[str, list[str]] = {}
        described: dict[str, str] = {}
        for widget in (self, self.query_one(CacheTree), self.query_one(SessionsTable)):
            for bindings in widget._bindings.key_to_bindings.values():
                for b in bindings:
                    if b.id is None or not b.description:  # (Textual's own, such as ctrl+q)
                        continue
                    remapped = self._keymap.get(b.id)
                    if remapped is not None:
                        b = b.with_key(remapped.split(",")[0].strip())
                    shown = self.get_key_display(b)
                    if shown not in keys.setdefault(b.id, []):
                        keys[b.id].append(shown)
                    described.setdefault(b.id, b.description)
        lines = [f"[b]{literal(' '.join(keys[i]).rjust(16))}[/]  {literal(described[i])}  [dim]({i})[/]" for i in keys]
        self.push_screen(HelpScreen("\n".join(lines)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Pause / resume", "Freeze the tree and sessions (header keeps moving)", self.action_pause)
        yield SystemCommand("Search a prefix", "Jump to the longest cached prefix of token ids", self.action_search)
        yield SystemCommand("Close sessions", "Close the marked or highlighted sessions", self.action_close_sessions)
        yield SystemCommand("Evict tokens", "Evict least-recently-used unlocked leaves", self.action_evict)
        yield SystemCommand("Flush", "Free everything not locked", self.action_flush)
        yield SystemCommand("Leak doctor", "Memory nobody can use now, and what frees it", self.action_doctor)
        yield SystemCommand("Keys", "Show every key", self.action_help)

    # ----- the leak doctor -----

    def action_doctor(self) -> None:
        self.notify("the leak doctor is reading the cache…", title="doctor", timeout=2)
        self.run_doctor()

    @work(thread=True, exclusive=True, group="doctor", exit_on_error=False)
    def run_doctor(self) -> None:
        from radixtop.adapters.text import diagnosis_text

        try:
            diagnosis = self.adapter.diagnose()
        except AdapterError as exc:
            self.call_from_thread(self.notify, inert(exc.message), severity="error", title="doctor")
            return
        report = inert(diagnosis_text(diagnosis), lines=True)  # it quotes the target's ids
        self.call_from_thread(self.push_screen, DoctorScreen(report, diagnosis.healthy))

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
            match, target, tree = self.poller.search(tokens)
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return

        def show() -> None:
            view = self.query_one(CacheTree)
            self._show_rows(tree)
            if target != ROOT_ID:
                view.move_to_key(("node", target))
            view.focus()
            where = "" if match.partial_node_id is None else \
                f" ({match.partial_tokens} tokens into #{match.partial_node_id})"
            self.notify(f"{match.matched_tokens} of {match.query_tokens} tokens cached{where}", title="search")

        self.call_from_thread(show)


def literal(text: str) -> str:
    """``text`` shown as written inside Textual markup: every ``[`` escaped (Rich's ``escape``
    leaves a ``[`` that opens no tag, and Textual then reads ``[b][[/]`` as the text ``[[/]``)."""
    return text.replace("[", "\\[")


def binding_ids() -> list[str]:
    """The ids ``--keymap`` takes: every binding of the dashboard that has one."""
    return [b.id for cls in (RadixtopApp, CacheTree, SessionsTable) for b in cls.BINDINGS
            if isinstance(b, Binding) and b.id]


def run_dashboard(adapter: CacheAdapter, target: str | None = None, interval: float = 1.0,
                  keymap: dict[str, str] | None = None, on_exit: Callable[[], None] | None = None,
                  notices: Callable[[Callable[[str], None]], None] | None = None) -> None:
    """Run the dashboard until it quits. ``notices``, when given, is handed the function that puts
    a note on screen from any thread (the embedded demo's watcher says so when it restarts it)."""
    try:
        app = RadixtopApp(adapter, target, interval, keymap)
        if notices is not None:
            notices(app.notice_from_thread)
        app.run()
    finally:
        if on_exit is not None:
            on_exit()
