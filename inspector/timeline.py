"""The timeline (issue 29's time travel): the tree at a past moment, stepped back and forth, told
from the tree now (``CacheAdapter.then``: what left since, when, why and whose; what was stored
since). It opens under the header, so the sparklines above stay in sight; the strip at its top
runs from as far back as the history reaches to now, with the moment shown."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from radixtop.adapters.errors import AdapterError
from radixtop.adapters.text import age

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
    ]

    def __init__(self, then: Callable[[float], Any], clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.then_of, self.clock = then, clock
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
            yield Static(id="timeline-keys", markup=False)

    def on_mount(self) -> None:
        # the tree now first (always within reach): its answer says how far back the history
        # reaches, and the first step back goes no further
        self.first_at, self.at = self.at, self.clock()
        self.ask()

    def keys_line(self) -> str:
        return (f"[ ] step {age(STEPS[self.step_index])} · {{ }} ×10 · + - step size · n now · "
                "esc closes · radixtop then")

    def ask(self) -> None:
        self.asked += 1
        asked, at = self.asked, self.at
        self.render_strip()

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
