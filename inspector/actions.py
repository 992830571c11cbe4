"""The dashboard's actions: plan, preview, confirm, execute (close sessions, evict, flush).

A mixin of RadixtopApp. Each action is bound to what the user saw when its modal opened (the
plans, the ids, the count), never to what is under the cursor when the confirm lands; Cancel is
the default; a large or bulk action asks for its value to be typed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual import work

from radixtop.adapters.errors import AdapterError, Unsupported
from radixtop.adapters.model import ClosePlanView
from radixtop.adapters.text import human_bytes, inert, typed_confirmation
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.modals import AskScreen, ConfirmScreen
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree

if TYPE_CHECKING:
    from radixtop.inspector.app import RadixtopApp

"""An eviction of more than this share of capacity asks for the count to be typed."""


class ActionFlows:
    """Close, evict and flush, for RadixtopApp (``self`` is the app)."""

    def _refuse_actions(self: RadixtopApp, action: str = "") -> bool:
        caps = self.poller.capabilities
        if caps.read_only:
            self.notify(f"{self.target} is read-only: actions are disabled", severity="warning", title="read-only")
            return True
        if action and not getattr(caps, action):
            self.notify(f"{self.target} cannot {action}: {caps.reason}", severity="warning", title="not here")
            return True
        return False

    def _done(self: RadixtopApp, message: str, title: str) -> None:
        """After an action (worker thread): say what it did, and show its effect at once."""
        self.call_from_thread(self.notify, message, title=title, timeout=8)
        self.poller.sessions_due()
        self.call_from_thread(self.poll)

    # ----- close -----

    def action_close_sessions(self: RadixtopApp) -> None:
        if self._refuse_actions("close"):
            return
        tree = self.query_one(CacheTree)
        if tree.has_focus:  # from a tree row: the sessions that hold that node
            row = tree.current
            if row is None or row.node is None:
                self.notify("no node highlighted", severity="warning")
                return
            if row.node.holders is None:
                self.notify(f"this target cannot tell which sessions hold node #{row.node.id}", severity="warning")
                return
            if not row.node.holders:
                self.notify(f"no session holds node #{row.node.id}: nothing to close", severity="warning")
                return
            self.plan_closes(tuple(sorted(row.node.holders)), f"the sessions holding node #{row.node.id}")
            return
        table = self.query_one(SessionsTable)
        ids = sorted(table.marked) or ([table.current.id] if table.current else [])
        if not ids:
            self.notify("no session highlighted or marked (space marks one)", severity="warning")
            return
        self.plan_closes(tuple(ids))

    @work(thread=True, exclusive=True, group="action", exit_on_error=False)
    def plan_closes(self: RadixtopApp, ids: tuple[str, ...], source: str = "") -> None:
        try:
            plans = [self.adapter.plan_close(sid) for sid in ids]
        except Unsupported as exc:  # a target that closes but cannot preview: say so, then ask
            self.call_from_thread(self._confirm_blind_closes, ids, exc.message)
            return
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return
        self.call_from_thread(self._confirm_closes, plans, source)

    def _confirm_blind_closes(self: RadixtopApp, ids: tuple[str, ...], why: str) -> None:
        body = Text(f"{inert(self.target)} cannot show what a close frees ({inert(why)}).\n"
                    f"Sessions: {', '.join(map(inert, ids))}. What was freed is read back afterwards.")
        self.push_screen(
            ConfirmScreen(f"Close {len(ids)} session(s) without a preview", body, "Close",
                          require_text=str(len(ids))),
            lambda ok: self.run_closes(ids, []) if ok else self.notify("cancelled; nothing changed"),
        )

    def _confirm_closes(self: RadixtopApp, plans: list[ClosePlanView], source: str = "") -> None:
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
        self.push_screen(
            ConfirmScreen(f"Close {len(plans)} session(s){': ' + source if source else ''}: frees "
                          f"{human_bytes(total)} now", body,
                          "Close", require_text=typed_confirmation("close", sessions=len(plans))),
            lambda ok: self.run_closes(ids, plans) if ok else self.notify("cancelled; nothing changed"),
        )

    @work(thread=True, group="action", exit_on_error=False)
    def run_closes(self: RadixtopApp, ids: tuple[str, ...], plans: list[ClosePlanView]) -> None:
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
        # A lambda: Textual reads the callback's signature, and a builtin such as set.clear has none.
        self.call_from_thread(lambda: self.query_one(SessionsTable).marked.clear())
        self._done("\n".join(lines), "closed")

    # ----- evict and flush -----

    def action_evict(self: RadixtopApp) -> None:
        if self._refuse_actions("evict"):
            return
        evictable = self.stats.evictable_tokens if self.stats else 0
        self.push_screen(AskScreen("Evict tokens", f"How many tokens? ({evictable:,} evictable now; whole "
                                   "least-recently-used unlocked leaves go first)", "tokens"), self._evict_count)

    def _evict_count(self: RadixtopApp, text: str | None) -> None:
        if text is None:
            return
        if not text.strip().isdigit():
            self.notify(f"not a token count: {text!r}", severity="error")
            return
        n = int(text.strip())
        st = self.stats
        bpt = st.bytes_per_token if st else 0
        typed = typed_confirmation("evict", n, st.capacity_tokens if st else 0)
        body = Text(f"Evict at least {n:,} tokens ({human_bytes(n * bpt)}) of "
                    f"{st.evictable_tokens if st else 0:,} evictable.")
        self.push_screen(ConfirmScreen("Evict", body, "Evict", require_text=typed),
                         lambda ok: self.perform_action("evict", n) if ok else self.notify("cancelled; nothing changed"))

    def action_flush(self: RadixtopApp) -> None:
        if self._refuse_actions("flush"):
            return
        st = self.stats
        body = Text(f"Free every unlocked node: {st.evictable_tokens if st else 0:,} tokens "
                    f"({human_bytes(st.evictable_bytes) if st else '-'}). Running requests keep their paths.")
        self.push_screen(ConfirmScreen("Flush the cache", body, "Flush", require_text=typed_confirmation("flush")),
                         lambda ok: self.perform_action("flush", 0) if ok else self.notify("cancelled; nothing changed"))

    @work(thread=True, group="action", exit_on_error=False)
    def perform_action(self: RadixtopApp, action: str, n: int) -> None:
        try:
            if action == "evict":
                r = self.adapter.evict(n)
                freed = r.evicted_tokens
                message = f"evicted {r.evicted_tokens:,} tok · {human_bytes(r.evicted_bytes)} in {r.evicted_nodes} nodes"
            else:
                r = self.adapter.flush()
                freed = r.freed_tokens  # (a cache just flushed has nothing left to evict on its own)
                message = f"flushed {r.freed_tokens:,} tok · {human_bytes(r.freed_bytes)}" + (
                    f"; {r.message}" if r.message else "")
        except AdapterError as exc:
            self.call_from_thread(self.notify, exc.message, severity="error")
            return
        self.call_from_thread(self.query_one(HeaderBar).own_eviction, freed)
        self._done(message, action)
