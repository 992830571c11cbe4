"""CacheScreen: the live view of one cache (header, tree, detail, sessions) over any CacheAdapter.

The screen only applies data and dispatches keys: a Poller (``poller.py``) reads the target in
worker threads and hands back frozen Snapshots, which the poll loop (``poll_loop.py``) brings to
the UI thread; tree operations queue up and run one at a time, in the order pressed; the actions'
flows are in ``actions.py``, the reads a key asks for in ``lookups.py``, the views in their own
modules.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from functools import partial

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import Input, Static
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable
from radixtop.adapters.model import Capabilities, NodeDetail, Stats
from radixtop.adapters.text import inert
from radixtop.inspector.actions import ACTIONS, ActionFlows
from radixtop.inspector.detail import DetailPanel
from radixtop.inspector.footer import KeysFooter
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.lookups import Lookups
from radixtop.inspector.modals import HelpScreen, help_text
from radixtop.inspector.poll_loop import PolledScreen, PollLoop, read_in_thread
from radixtop.inspector.poller import DETAIL_TOKENS, Poller, PollRequest, Snapshot, TreeRows, TreeUpdate
from radixtop.inspector.sessions_view import FilterBox, SessionsTable, SessionsTitle
from radixtop.inspector.tree_ops import TreeOp
from radixtop.inspector.tree_view import CacheTree

MIN_INTERVAL = 0.25
"""The fastest refresh ``+`` goes to (seconds between polls)."""
MAX_INTERVAL = 30.0
"""The slowest refresh ``-`` goes to."""


class CacheScreen(PolledScreen):
    """Live view of one cache. Polls never overlap (the next is armed when one ends); reads and
    actions run in thread workers; actions are bound to what the user saw when the modal opened."""

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
        Binding("w", "why", "Why missed", show=False, id="app.why"),
        Binding("T", "then", "Then: the tree at a past moment", show=False, id="app.then"),
        Binding("p", "pause", "Pause", id="app.pause"),
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("plus,equals_sign", "faster", "Faster", show=False, id="app.faster"),
        Binding("minus", "slower", "Slower", show=False, id="app.slower"),
        Binding("escape", "clear_marks", "Clear marks", show=False, id="app.clear"),
        Binding("right_square_bracket", "token_page(1)", "Next token ids", show=False, id="detail.next"),
        Binding("left_square_bracket", "token_page(-1)", "Previous token ids", show=False, id="detail.prev"),
        # Where the target cannot close, evict or flush, those keys leave the footer (check_action)
        # and these twins, under the same ids (so --keymap moves them together), say why.
        Binding("c", "refuse('close')", show=False, id="app.close"),
        Binding("E", "refuse('evict')", show=False, id="app.evict"),
        Binding("F", "refuse('flush')", show=False, id="app.flush"),
    ]

    def __init__(self, adapter: CacheAdapter, target: str | None = None, interval: float = 1.0,
                 poll: bool = True) -> None:
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
        self.sessions_table = SessionsTable(id="sessions")
        self.actions = ActionFlows(self)
        self.lookups = Lookups(self)
        # (the methods are looked up at each poll: the benchmarks time them by wrapping them)
        self.poll_loop = PollLoop(self, lambda: partial(self.poller.collect, self.poll_request()),
                                  lambda snap: self.apply_snapshot(snap), lambda error: self._poll_failed(error),
                                  lambda: self.interval, group="poll", auto=poll)
        self.polls = 0
        """Completed polls (tests wait on it)."""
        self._quit_asked = False
        self._sessions_error: str | None = None  # said once, until the sessions read works again
        self._polled_at = 0.0  # the latest snapshot's time
        self._tree_ops: deque[TreeOp] = deque()  # asked for, not yet applied (in order)
        self._tree_loading = False

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
                yield SessionsTitle(id="sessions-title")
                yield FilterBox(placeholder="filter sessions (enter applies, escape clears)", id="filter")
                yield self.sessions_table
        yield KeysFooter(compact=True, show_command_palette=False)  # (ctrl+p still opens it; ? lists it)

    def on_mount(self) -> None:
        self.query_one("#filter", Input).display = False
        self.query_one("#banner", Static).display = False
        self.query_one(CacheTree).focus()
        if self.poll_loop.auto:
            self.poll()

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast, as the app shows every note: plain text (see ``RadixtopApp.notify``)."""
        self.app.notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Close, evict and flush leave the footer where the target cannot do them (read-only, no
        sessions): a face hides what a target cannot do, and the key still says why."""
        needs = ACTIONS.get(action)
        return needs is None or self.actions.can(needs)

    # ----- polling -----

    def poll_request(self) -> PollRequest:
        return PollRequest(not self.paused, self.selected_node, self.detail_offset, self.interval,
                           self.sessions_table.query)

    def poll(self) -> None:
        """Start a poll now; with one in flight, the next starts as soon as it ends (one chain)."""
        self.poll_loop.poll()

    def _poll_failed(self, error: Exception) -> None:
        if not isinstance(error, AdapterError):  # never a traceback on screen: say it, keep polling
            error = AdapterError(f"{type(error).__name__}: {error}")
        self.poller.lost()
        self._show_down(error)

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
            self.show_rows(snap.tree)
        table = self.query_one(SessionsTable)
        # A page of an order or filter the table has left since (s pressed while it was read) is
        # not shown: it would undo the rows sorted on screen; the next poll reads the new one.
        if snap.sessions is not None and snap.sessions_query in (None, table.query):
            table.set_page(snap.sessions)
            self.query_one(SessionsTitle).figures_read(snap.sessions, snap.taken_at, snap.stats.version)
        if table.page is not None:
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
            self.query_one(SessionsTitle).unavailable()
        self.refresh_bindings()  # the footer shows only what the target can do

    def refused_actions(self, why: str) -> None:
        """The target refused an action for this dashboard's token (none, or a read-only one):
        every action would be, so they leave the footer and their keys say why, as read-only."""
        self.poller.capabilities = replace(self.capabilities, read_only=True, reason=why)
        self._set_capabilities(self.poller.capabilities)

    def _show_down(self, exc: AdapterError) -> None:
        self.down = exc.message
        banner = self.query_one("#banner", Static)
        kind = "timed out" if isinstance(exc, TargetTimeout) else "cannot reach" if isinstance(
            exc, TargetUnreachable) else "error from"
        # The cause once: a message that names the target already (the client's "cannot reach
        # http://…: …") is said as it is.
        cause = exc.message if self.target in exc.message else f"{kind} {self.target}: {exc.message}"
        shown = "showing the last good data" if self.stats is not None else "no data from it yet"
        text = Text(f"⚠ {inert(cause)} · reconnecting in {self.poll_loop.retry_after:g}s ({shown})")  # not markup
        if banner.content != text:
            banner.update(text)
        banner.display = True
        header = self.query_one(HeaderBar)
        if not header.down:
            header.down = True
            header.render_stats()

    # ----- tree -----

    def on_cache_tree_request(self, message: CacheTree.Request) -> None:
        self._tree_ops.append(message.op)
        if not self._tree_loading:
            self._tree_loading = True
            self._load_tree()

    @work(exclusive=True, group="tree-loader", exit_on_error=False)
    async def _load_tree(self) -> None:
        """The one tree loader (as Textual's DirectoryTree loads): the operations asked for, one at
        a time in the order asked, each in a short-lived thread worker; it ends when none is left."""
        try:
            while self._tree_ops:
                op = self._tree_ops.popleft()
                try:
                    await read_in_thread(self, partial(self.poller.tree_op, op), self._show_tree_update,
                                         group="tree", exclusive=False, title="radixtop").wait()
                except WorkerCancelled:  # the screen is going away
                    break
                except WorkerFailed:  # (not the target's error: that was said) the next one still runs
                    pass
        finally:
            self._tree_loading = False

    def _show_tree_update(self, update: TreeUpdate) -> None:
        self.show_rows(update.tree)
        if update.move_to is not None:
            self.query_one(CacheTree).move_to_key(update.move_to)
        if update.note:
            self.notify(update.note)

    def show_rows(self, tree: TreeRows) -> None:
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

    def load_detail(self, node_id: int, offset: int) -> Worker[None]:
        def show(detail: NodeDetail | None) -> None:
            if detail is not None:  # (None: the node is gone)
                self._show_detail(detail)

        return read_in_thread(self, partial(self.poller.detail, node_id, offset), show, group="detail")

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
        st = self.stats
        self.query_one(SessionsTitle).show(self.query_one(SessionsTable), self._polled_at,
                                           st.version if st is not None else None,
                                           st.open_sessions if st is not None else None)

    def on_sessions_table_query_changed(self, message: SessionsTable.QueryChanged) -> None:
        self._title_sessions()
        self.poll()  # the poller reads the sessions at once for a new query

    def on_sessions_table_chosen(self, message: SessionsTable.Chosen) -> None:
        self.lookups.session_chains(message.session.id)

    def action_clear_marks(self) -> None:
        self.query_one(CacheTree).set_marked(frozenset())
        table = self.query_one(SessionsTable)
        table.marked.clear()
        table.refresh()
        self._title_sessions()

    def action_filter_sessions(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.can_focus = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            table = self.query_one(SessionsTable)
            table.set_filter(event.value)
            self._title_sessions()
            if not event.value.strip():
                event.input.display = False
            # Applied, the box only says the filter: tab passes it by, so command keys are never
            # typed into it (f goes back to it).
            event.input.can_focus = False
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

    def action_quit(self) -> None:
        """q (and ctrl+c): leave; while an action (a close, an evict, a flush) is in flight, ask
        once (its result would not be seen), and leave at the second press."""
        busy = any(w.node is self and w.group == "action" and w.is_running for w in self.app.workers)
        if busy and not self._quit_asked:
            self._quit_asked = True
            self.notify("an action is still running: press again to quit without its result",
                        severity="warning", title="quit?")
            return
        if self is self.app.screen_stack[0]:
            self.app.exit()
        elif self.is_active:  # opened from the fleet view: back to it
            self.dismiss()
        else:  # (ctrl+c over a modal) the modals go too
            self.pop_until_active()
            self.app.call_later(self.dismiss)

    def action_help(self) -> None:
        """Every key as it is bound now (after ``--keymap``), written as people write keys (``?``,
        ``]``, ``ctrl+c``), with the id ``--keymap`` takes."""
        bindings = [*self.app.BINDINGS, *screen_bindings()]
        text = help_text(bindings, getattr(self.app, "keymap", {}), self.app.get_key_display)
        self.app.push_screen(HelpScreen(text))

    # ----- actions (their flows: actions.py) -----

    def action_close_sessions(self) -> None:
        self.actions.close_sessions()

    def action_evict(self) -> None:
        self.actions.evict()

    def action_flush(self) -> None:
        self.actions.flush()

    def action_refuse(self, action: str) -> None:
        """A key whose action the target cannot do (hidden from the footer): say why."""
        self.actions.refuse(action)

    # ----- reads a key asks for (lookups.py) -----

    def action_search(self) -> None:
        self.lookups.ask_search()

    def action_doctor(self) -> None:
        self.lookups.doctor()

    def action_why(self) -> None:
        self.lookups.ask_why()

    def action_then(self) -> None:
        from radixtop.inspector.timeline import TimelineScreen

        self.app.push_screen(TimelineScreen(self.poller.then, self.poller.then_children))


def screen_bindings() -> list[BindingType]:
    """The bindings of a cache's screen and of its views, in the order the help lists them."""
    return [*CacheScreen.BINDINGS, *CacheTree.BINDINGS, *DetailPanel.BINDINGS, *SessionsTable.BINDINGS]
