"""RadixtopApp: the dashboard's one App, and the entry points the CLI runs.

The App opens with one screen (a cache's CacheScreen, or the fleet's FleetScreen, whose Enter
pushes that worker's CacheScreen) and keeps what is the App's: toasts as plain text, ctrl+c, the
keymap, the command palette. ``run_dashboard`` runs it for one target, ``run_fleet`` for a fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widget import AwaitMount

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.fleet.model import FleetView, WorkerRow
from radixtop.adapters.text import inert
from radixtop.inspector.cache_screen import CacheScreen, screen_bindings
from radixtop.inspector.fleet_view import FleetScreen


class RadixtopApp(App[None]):
    """The dashboard: ``RadixtopApp(adapter, ...)`` opens that cache's screen; ``home`` opens
    another screen instead (the fleet's)."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "radixtop"
    BINDINGS = [
        Binding("ctrl+c", "interrupt", "Quit", show=False, priority=True, id="app.interrupt"),
    ]

    def __init__(self, adapter: CacheAdapter | None = None, target: str | None = None, interval: float = 1.0,
                 keymap: dict[str, str] | None = None, poll: bool = True, *, home: Screen | None = None):
        super().__init__()
        if (adapter is None) == (home is None):
            raise TypeError("RadixtopApp takes an adapter or a home screen")
        self.home: Screen = home if home is not None else CacheScreen(adapter, target, interval, poll)
        """The screen the dashboard opens with (its cache's, or the fleet's)."""
        if self.home.title:
            self.title = self.home.title  # the App is named after it: "radixtop fleet"
        self.keymap = keymap or {}
        """``--keymap``: binding id -> keys."""

    def get_default_screen(self) -> Screen:
        return self.home

    async def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        await AwaitMount(self.home, [self.home])  # ready once the first screen is up, as one App was

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

    def cache_screen(self) -> CacheScreen | None:
        """The cache's screen in view (under any modal), or None in the fleet view."""
        return next((s for s in reversed(self.screen_stack) if isinstance(s, CacheScreen)), None)

    def action_interrupt(self) -> None:
        """ctrl+c, whatever has the focus: the cache screen's quit (asks once while an action is in
        flight); in the fleet view, says which key quits (Textual's own ctrl+c)."""
        screen = self.cache_screen()
        if screen is None:
            self.action_help_quit()
        else:
            screen.action_quit()

    def action_help_quit(self) -> None:
        """Textual's ctrl+c where it does not quit (the fleet view): names the key that does. Its
        words are the app's own markup, so they say so (every other note is plain text)."""
        for key, active in self.active_bindings.items():
            if active.binding.action in ("quit", "app.quit"):
                self.notify(f"Press [b]{key}[/b] to quit the app", title="Do you want to quit?", markup=True)
                return

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        cache = self.cache_screen()
        if cache is None:
            return
        yield SystemCommand("Pause / resume", "Freeze the tree and sessions (header keeps moving)", cache.action_pause)
        yield SystemCommand("Search a prefix", "Jump to the longest cached prefix of a text or token ids", cache.action_search)
        yield SystemCommand("Close sessions", "Close the marked or highlighted sessions", cache.action_close_sessions)
        yield SystemCommand("Evict tokens", "Evict least-recently-used unlocked leaves", cache.action_evict)
        yield SystemCommand("Flush", "Free everything not locked", cache.action_flush)
        yield SystemCommand("Leak doctor", "Memory nobody can use now, and what frees it", cache.action_doctor)
        yield SystemCommand("Keys", "Show every key", cache.action_help)


def binding_ids() -> list[str]:
    """The ids ``--keymap`` takes: every binding of a cache's dashboard that has one."""
    bindings = Binding.make_bindings([*RadixtopApp.BINDINGS, *screen_bindings()])
    return list(dict.fromkeys(b.id for b in bindings if b.id))


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


def run_fleet(poll: Callable[[], FleetView], interval: float,
              open_worker: Callable[[WorkerRow], tuple[CacheAdapter, str]]) -> None:
    """Run the fleet view until it quits: ``poll`` (a blocking call, run in a thread) gives the
    rows; Enter on one opens its dashboard, ``open_worker(row) -> (adapter, label)`` (its
    AdapterError is said in a toast), and that dashboard's q comes back to the fleet."""
    fleet = FleetScreen(poll, interval, open_worker)
    try:
        RadixtopApp(home=fleet).run()
    finally:
        fleet.release()
