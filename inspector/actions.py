"""The dashboard's actions: plan, preview, confirm, execute (close sessions, evict, flush).

Owned by a CacheScreen, which hands its keys here. Each action is bound to what the user saw when
its modal opened (the plans, the ids, the count), never to what is under the cursor when the
confirm lands; Cancel is the default; a large or bulk action asks for its value to be typed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual.notifications import SeverityLevel
from textual.worker import Worker

from radixtop.adapters.errors import AdapterError, ReadOnly, Unauthorized, Unsupported
from radixtop.adapters.model import ClosePlanView
from radixtop.adapters.text import human_bytes, in_nodes, inert, typed_confirmation
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.modals import AskScreen, ConfirmScreen
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree

if TYPE_CHECKING:
    from radixtop.inspector.cache_screen import CacheScreen

ACTIONS = {"close_sessions": "close", "evict": "evict", "flush": "flush"}
"""The screen's destructive actions, and the capability each needs (``Capabilities``)."""


def outcome_of(done: int, asked: int) -> str:
    """``done`` of ``asked`` parts of an action carried out: done, partly done, or refused."""
    return "done" if done == asked else "partly done" if done else "refused"


class ActionFlows:
    """Close, evict and flush, for one CacheScreen: its target, its figures, its toasts."""

    def __init__(self, screen: CacheScreen) -> None:
        self.screen = screen

    def can(self, action: str) -> bool:
        """Whether the target can do ``action`` (a capability: close, evict, flush)."""
        caps = self.screen.capabilities
        return not caps.read_only and getattr(caps, action)

    def refuse(self, action: str = "") -> bool:
        """Say why the target cannot do ``action`` (if it cannot): True when refused."""
        screen, caps = self.screen, self.screen.capabilities
        if caps.read_only:
            why = caps.reason if caps.reason and "read-only" not in caps.reason else ""
            screen.notify(f"{screen.target} refuses actions: {why}" if why else
                          f"{screen.target} is read-only: actions are disabled", severity="warning", title="read-only")
            return True
        if action and not getattr(caps, action):
            # the reason's clause about this action, where it has one (a target lists what it lacks, and why)
            why = next((part for part in caps.reason.split("; ") if action in part), caps.reason)
            screen.notify(f"{screen.target} cannot {action}: {why}", severity="warning", title="not here")
            return True
        return False

    def _worker(self, work: Callable[[], None], exclusive: bool = False) -> Worker[None]:
        """``work`` in a thread worker of the screen, in the group a quit waits for."""
        return self.screen.run_worker(work, group="action", exclusive=exclusive, thread=True, exit_on_error=False)

    def _from_thread(self, callback: Callable, *args, **kwargs) -> None:
        self.screen.app.call_from_thread(callback, *args, **kwargs)

    def _done(self, message: str, outcome: str) -> None:
        """After an action (worker thread): say what happened (``outcome``: done, partly done or refused, the
        toast's title), and show its effect at once."""
        severity: SeverityLevel = {"done": "information", "partly done": "warning"}.get(outcome, "error")
        self._from_thread(self.screen.notify, message, title=outcome, severity=severity, timeout=8)
        self.screen.poller.sessions_due()
        self._from_thread(self.screen.poll)

    def _refused(self, action: str, exc: AdapterError) -> None:
        """The target refused ``action`` (worker thread): said as refused; a refusal of every
        action (no or a read-only token) hides the actions from then on, as read-only does."""
        self._from_thread(self.screen.notify, f"{action} refused: {exc.message}; nothing changed",
                          title="refused", severity="error", timeout=8)
        if isinstance(exc, (ReadOnly, Unauthorized)):
            self._from_thread(self.screen.refused_actions, exc.message)

    def _cancelled(self) -> None:
        self.screen.notify("cancelled; nothing changed")

    # ----- close -----

    def close_sessions(self) -> None:
        """c: close the sessions holding the tree's node, or the sessions marked or highlighted."""
        screen = self.screen
        if self.refuse("close"):
            return
        tree = screen.query_one(CacheTree)
        if tree.has_focus:  # from a tree row: the sessions that hold that node
            row = tree.current
            if row is None or row.node is None:
                screen.notify("no node highlighted", severity="warning")
                return
            if row.node.holders is None:
                screen.notify(f"this target cannot tell which sessions hold node #{row.node.id}", severity="warning")
                return
            if not row.node.holders:
                screen.notify(f"no session holds node #{row.node.id}: nothing to close", severity="warning")
                return
            self.plan_closes(tuple(sorted(row.node.holders)), f"the sessions holding node #{row.node.id}")
            return
        table = screen.query_one(SessionsTable)
        ids = sorted(table.marked) or ([table.current.id] if table.current else [])
        if not ids:
            screen.notify("no session highlighted or marked (space marks one)", severity="warning")
            return
        self.plan_closes(tuple(ids))

    def plan_closes(self, ids: tuple[str, ...], source: str = "") -> Worker[None]:
        def plan() -> None:
            try:
                plans = [self.screen.adapter.plan_close(sid) for sid in ids]
            except Unsupported as exc:  # a target that closes but cannot preview: say so, then ask
                self._from_thread(self.confirm_blind_closes, ids, exc.message)
                return
            except AdapterError as exc:
                self._from_thread(self.screen.notify, exc.message, severity="error")
                return
            self._from_thread(self.confirm_closes, plans, source)

        return self._worker(plan, exclusive=True)

    def confirm_blind_closes(self, ids: tuple[str, ...], why: str) -> None:
        body = Text(f"{inert(self.screen.target)} cannot show what a close frees ({inert(why)}).\n"
                    f"Sessions: {', '.join(map(inert, ids))}. What was freed is read back afterwards.")
        self.screen.app.push_screen(
            ConfirmScreen(f"Close {len(ids)} session(s) without a preview", body, "Close",
                          require_text=str(len(ids))),
            lambda ok: self.run_closes(ids, []) if ok else self._cancelled(),
        )

    def confirm_closes(self, plans: list[ClosePlanView], source: str = "") -> None:
        body = Table(show_edge=False)
        for col in ("session", "state", "frees now", "nodes", "stays (why)"):
            body.add_column(col)
        for p in plans:
            kept: dict[str, int] = {}
            for k in p.kept:
                kept[k.reason] = kept.get(k.reason, 0) + k.tokens
            body.add_row(Text(inert(p.session_id)), p.state, f"{p.freed_tokens:,} tok · {human_bytes(p.freed_bytes)}",
                         str(len(p.freed_node_ids)), ", ".join(f"{v:,} tok {r}" for r, v in kept.items()) or "-")
        total = sum(p.freed_bytes for p in plans)
        ids = tuple(p.session_id for p in plans)  # what the user saw: the action is bound to these
        self.screen.app.push_screen(
            ConfirmScreen(f"Close {len(plans)} session(s){': ' + source if source else ''}: frees "
                          f"{human_bytes(total)} now", body,
                          "Close", require_text=typed_confirmation("close", sessions=len(plans))),
            lambda ok: self.run_closes(ids, plans) if ok else self._cancelled(),
        )

    def run_closes(self, ids: tuple[str, ...], plans: list[ClosePlanView]) -> Worker[None]:
        def close() -> None:
            planned = {p.session_id: p for p in plans}
            lines = []
            closed = freed_tokens = freed_bytes = 0
            refusals: list[AdapterError] = []
            for sid in ids:
                try:
                    r = self.screen.adapter.close_session(sid)
                except AdapterError as exc:
                    refusals.append(exc)
                    lines.append(f"{sid}: refused: {exc.message}")
                    continue
                closed += 1
                freed_tokens += r.freed_tokens
                freed_bytes += r.freed_bytes
                plan = planned.get(sid)
                diff = "" if plan is None or r.freed_tokens == plan.freed_tokens else \
                    f" (plan said {plan.freed_tokens:,}: the cache changed in between)"
                lines.append(f"{sid}: closed, freed {r.freed_tokens:,} tok · {human_bytes(r.freed_bytes)}{diff}")
            # A lambda: Textual reads the callback's signature, and a builtin such as set.clear has none.
            self._from_thread(lambda: self.screen.query_one(SessionsTable).marked.clear())
            outcome = outcome_of(closed, len(ids))
            summary = (f"closed {closed} of {len(ids)} session(s), freed {freed_tokens:,} tok · "
                       f"{human_bytes(freed_bytes)}" if closed else f"closed none of {len(ids)} session(s): nothing freed")
            self._done("\n".join([summary, *lines]), outcome)
            if not closed and refusals and all(isinstance(e, (ReadOnly, Unauthorized)) for e in refusals):
                self._from_thread(self.screen.refused_actions, refusals[0].message)

        return self._worker(close)

    # ----- evict and flush -----

    def evict(self) -> None:
        """E: ask how many tokens, then confirm."""
        if self.refuse("evict"):
            return
        st = self.screen.stats
        evictable = st.evictable_tokens if st else 0
        self.screen.app.push_screen(AskScreen("Evict tokens", f"How many tokens? ({evictable:,} evictable now; whole "
                                              "least-recently-used unlocked leaves go first)", "tokens"),
                                    self._evict_count)

    def _evict_count(self, text: str | None) -> None:
        if text is None:
            return
        if not text.strip().isdigit():
            self.screen.notify(f"not a token count: {text!r}", severity="error")
            return
        n = int(text.strip())
        st = self.screen.stats
        bpt = st.bytes_per_token if st else 0
        typed = typed_confirmation("evict", n, st.capacity_tokens if st else 0)
        body = Text(f"Evict at least {n:,} tokens ({human_bytes(n * bpt)}) of "
                    f"{st.evictable_tokens if st else 0:,} evictable.")
        self.screen.app.push_screen(ConfirmScreen("Evict", body, "Evict", require_text=typed),
                                    lambda ok: self.perform("evict", n) if ok else self._cancelled())

    def flush(self) -> None:
        """F: confirm, with the flush typed."""
        if self.refuse("flush"):
            return
        st = self.screen.stats
        body = Text(f"Free every unlocked node: {st.evictable_tokens if st else 0:,} tokens "
                    f"({human_bytes(st.evictable_bytes) if st else '-'}). Running requests keep their paths.")
        self.screen.app.push_screen(ConfirmScreen("Flush the cache", body, "Flush",
                                                  require_text=typed_confirmation("flush")),
                                    lambda ok: self.perform("flush", 0) if ok else self._cancelled())

    def perform(self, action: str, n: int) -> Worker[None]:
        """Evict ``n`` tokens, or flush (``action``), as confirmed."""
        def act() -> None:
            adapter = self.screen.adapter
            try:
                if action == "evict":
                    r = adapter.evict(n)
                    freed = r.evicted_tokens
                    # "at least n": fewer is what the unlocked leaves allowed
                    outcome = "done" if freed >= n else "partly done"
                    message = (f"evicted {r.evicted_tokens:,} of {n:,} tok asked · {human_bytes(r.evicted_bytes)} "
                               f"{in_nodes(r.evicted_nodes)}")
                else:
                    f = adapter.flush()
                    freed = f.freed_tokens  # (a cache just flushed has nothing left to evict on its own)
                    outcome = "done"
                    message = f"flushed {f.freed_tokens:,} tok · {human_bytes(f.freed_bytes)}" + (
                        f"; {f.message}" if f.message else "")
            except AdapterError as exc:
                self._refused(action, exc)
                return
            self._from_thread(self.screen.query_one(HeaderBar).own_eviction, freed)
            self._done(message, outcome)

        return self._worker(act)
