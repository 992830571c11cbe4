"""The reads a key asks for, shown on the cache screen: a prefix search, a session's chains, the doctor.

Owned by a CacheScreen. Each read goes through the screen's Poller in a thread worker
(``read_in_thread``); what it found is shown on the UI thread, a target's error said in a toast.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textual.worker import Worker

from radixtop.adapters.model import ROOT_ID, MatchView, SessionDetail
from radixtop.adapters.text import inert
from radixtop.inspector.modals import AskScreen, DoctorScreen, WhyScreen
from radixtop.inspector.poll_loop import read_in_thread
from radixtop.inspector.poller import TreeRows
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree

if TYPE_CHECKING:
    from radixtop.inspector.cache_screen import CacheScreen


def parse_token_ids(text: str) -> list[int] | None:
    """Token ids pasted comma or space separated; None if anything else is there."""
    parts = text.replace(",", " ").split()
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def search_query(text: str) -> list[int] | str:
    """What ``/`` was given: token ids (digits, comma or space separated), or a text for the
    target's tokenizer; a text in double quotes is a text even if it is all digits."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    tokens = parse_token_ids(text)
    return text if tokens is None else tokens


class Lookups:
    """Search, a session's chains and the leak doctor, for one CacheScreen."""

    def __init__(self, screen: CacheScreen) -> None:
        self.screen = screen

    # ----- search -----

    def ask_search(self) -> None:
        """/: ask for token ids, then jump to their longest cached prefix."""
        self.screen.app.push_screen(AskScreen(
            "Search the cache", "Type the start of a prompt (the target's tokenizer makes it token ids), or paste "
            "token ids (comma or space separated; a number as text goes in double quotes); the tree jumps to the "
            "longest cached prefix.", "<|system|> You are  ·  1, 2, 3"), self._search_submitted)

    def _search_submitted(self, text: str | None) -> None:
        if not text:
            return
        self.search(search_query(text))

    def search(self, query: list[int] | str) -> Worker[None]:
        """Jump to the longest cached prefix of ``query``: token ids, or a text the target encodes."""
        screen = self.screen

        def show(found: tuple[MatchView, int, TreeRows]) -> None:
            match, target, tree = found
            view = screen.query_one(CacheTree)
            screen.show_rows(tree)
            if target != ROOT_ID:
                view.move_to_key(("node", target))
            view.focus()
            where = "" if match.partial_node_id is None else \
                f" ({match.partial_tokens} tokens into #{match.partial_node_id})"
            screen.notify(f"{match.matched_tokens} of {match.query_tokens} tokens cached{where}", title="search")

        return read_in_thread(screen, partial(screen.poller.search, query), show, group="search", title="search")

    # ----- why a prompt missed -----

    def ask_why(self) -> None:
        """w: on the sessions table, the story of the session under the cursor (``radixtop why
        --session``); elsewhere, ask for a prompt (token ids, or text), then say why it missed
        (``radixtop why``)."""
        focused = self.screen.focused
        if isinstance(focused, SessionsTable) and focused.current is not None:
            self.why_session(focused.current.id)
            return
        self.screen.app.push_screen(AskScreen(
            "Why did this prompt miss?", "Type a prompt (the target's tokenizer makes it token ids), or paste token "
            "ids (comma or space separated; a number as text goes in double quotes): how much of it is cached, "
            "where it leaves the cached path, and what of the rest was cached before, when and why it left.",
            "<|system|> You are  ·  1, 2, 3"), self._why_submitted)

    def _why_submitted(self, text: str | None) -> None:
        if text:
            self.why(search_query(text))

    def why(self, query: list[int] | str) -> Worker[None]:
        screen = self.screen

        def read() -> str:
            import time

            from radixtop.adapters.text import why_lines

            return "\n".join(why_lines(screen.poller.why(query), time.time()))

        return read_in_thread(screen, read, lambda report: screen.app.push_screen(WhyScreen(report)),
                              group="why", title="why")

    def why_session(self, session_id: str) -> Worker[None]:
        screen = self.screen

        def read() -> str:
            import time

            from radixtop.adapters.text import session_why_lines

            return "\n".join(session_why_lines(screen.poller.why_session(session_id), time.time()))

        return read_in_thread(screen, read, lambda report: screen.app.push_screen(
            WhyScreen(report, "What did this session lose, and why?", "escape, q or w closes · ↑ ↓ PgUp PgDn scroll · "
                      "radixtop why --session prints the same")), group="why", title="why")

    # ----- a session's chains -----

    def session_chains(self, session_id: str) -> Worker[None]:
        """Expand the tree down to every node the session holds and mark those chains."""
        screen = self.screen

        def show(found: tuple[SessionDetail, frozenset[int], TreeRows]) -> None:
            detail, marked, tree = found
            view = screen.query_one(CacheTree)
            screen.show_rows(tree)
            view.set_marked(marked)
            if detail.node_ids:
                view.move_to_key(("node", detail.node_ids[0]))
            screen.notify(f"session {session_id}: {len(detail.node_ids)} nodes marked in the tree",
                          title="radixtop")

        return read_in_thread(screen, partial(screen.poller.session_chains, session_id), show, group="chains")

    # ----- the leak doctor -----

    def doctor(self) -> Worker[None]:
        """D: the leak doctor's findings, in a modal."""
        screen = self.screen
        screen.notify("the leak doctor is reading the cache…", title="doctor", timeout=2)

        def read() -> tuple[str, bool]:
            from radixtop.adapters.text import diagnosis_text

            diagnosis = screen.poller.diagnose()
            return inert(diagnosis_text(diagnosis), lines=True), diagnosis.healthy  # it quotes the target's ids

        return read_in_thread(screen, read, lambda report: screen.app.push_screen(DoctorScreen(*report)),
                              group="doctor", title="doctor")
