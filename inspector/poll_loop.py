"""Reads off the UI thread, shown on it: a screen's poll loop, and one-off reads.

The poll loop is dolphie's: collect in a worker thread, apply on the UI thread, re-arm a timer
when the poll ends (after the interval, or backing off after a failure), so polls never overlap
and a slow target never piles them up; a PolledScreen stops its loop while another screen covers
it. A one-off read (a search, a session's chains, the doctor) runs in a thread worker and either
shows its result or says the target's error in a toast.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.worker import Worker

from radixtop.adapters.errors import AdapterError

T = TypeVar("T")

BACKOFF_MIN_S = 2.0
"""After a failed poll the next waits twice the interval, and at least this long: a target that
failed is not asked again at once (dolphie's back-off), yet a blip is over within seconds."""
BACKOFF_MAX_S = 30.0
"""Each failure in a row doubles the wait, up to this: a target that stays down is asked twice a
minute, and one that comes back is seen within half a minute."""


def backoff(interval: float, failures: int = 1) -> float:
    """Seconds from the ``failures``-th failed poll in a row to the next: twice the interval (at
    least ``BACKOFF_MIN_S``), doubled for each failure before it, at most ``BACKOFF_MAX_S``."""
    return min(max(interval * 2, BACKOFF_MIN_S) * 2 ** (max(failures, 1) - 1), BACKOFF_MAX_S)


def covered(screen: Screen) -> bool:
    """Whether ``screen`` is out of sight: popped, or under a screen that is not a modal (a modal
    leaves the screen below it in view, and its figures moving)."""
    stack = screen.app.screen_stack
    return screen not in stack or any(not above.is_modal for above in stack[stack.index(screen) + 1:])


class PollLoop(Generic[T]):
    """One poll at a time for ``screen``. ``plan()``, on the UI thread, gives the read (what the
    screen needs is decided there); a thread worker runs it; its result goes to ``apply`` (its
    exception to ``fail``) on the UI thread, in the screen's message order. The next poll is armed
    when one ends: ``interval()`` seconds later, ``backoff`` of it after a failure; a poll asked for
    while one is out starts as soon as it ends. A hidden screen does not poll."""

    def __init__(self, screen: Screen, plan: Callable[[], Callable[[], T]], apply: Callable[[T], object],
                 fail: Callable[[Exception], object], interval: Callable[[], float], *, group: str,
                 auto: bool = True) -> None:
        self._screen = screen
        self._plan, self._apply, self._fail, self._interval = plan, apply, fail, interval
        self._group = group
        self.auto = auto
        """Arm the next poll when one ends (False: poll only when asked; tests feed snapshots)."""
        self.failures = 0
        """Polls failed in a row (0: the last one landed); the next comes after ``retry_after``."""
        self._in_flight = False
        self._again = False  # asked for while one was in flight
        self._hidden = False
        self._timer: Timer | None = None

    @property
    def failing(self) -> bool:
        """The last poll failed."""
        return self.failures > 0

    @property
    def retry_after(self) -> float:
        """Seconds from the last failed poll to the next."""
        return backoff(self._interval(), self.failures)

    def poll(self) -> None:
        """Start a poll now; with one in flight, the next starts as soon as it ends (one chain)."""
        if self._in_flight:
            self._again = True
            return
        self._stop_timer()
        self._in_flight = True
        self._screen.run_worker(partial(self._run, self._plan()), group=self._group, thread=True,
                                exit_on_error=False)

    def _run(self, read: Callable[[], T]) -> None:
        """The worker thread: one read, handed to the UI thread (dropped if the screen is gone)."""
        try:
            result = read()
        except Exception as exc:  # never a traceback on screen: the screen says it, polls go on
            self._screen.call_later(self._failed, exc)
        else:
            self._screen.call_later(self._landed, result)

    def _landed(self, result: T) -> None:
        self.failures = 0
        self._apply(result)
        self._ended()

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        self._fail(error)
        self._ended()

    def _ended(self) -> None:
        self._in_flight = False
        if self._again:
            self._again = False
            self.poll()
        elif self.auto and not self._hidden:
            self._timer = self._screen.set_timer(self.retry_after if self.failing else self._interval(), self.poll)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.stop()

    def hide(self) -> None:
        """No polls while the screen is out of sight; a poll in flight still lands."""
        self._hidden = True
        self._stop_timer()

    def show(self) -> None:
        """Back in sight: poll at once (its figures are as old as it was hidden)."""
        if self._hidden:
            self._hidden = False
            self.poll()


class PolledScreen(Screen[None]):
    """A screen with a poll loop (``poll_loop``, made by the subclass), which stops while another
    screen covers this one and polls again at once when it is back in sight."""

    poll_loop: PollLoop

    def on_screen_suspend(self) -> None:
        if covered(self):
            self.poll_loop.hide()

    def on_screen_resume(self) -> None:
        self.poll_loop.show()


def read_in_thread(widget: Widget, read: Callable[[], T], show: Callable[[T], object], *, group: str,
                   exclusive: bool = True, title: str = "") -> Worker[None]:
    """Run ``read`` in a thread worker of ``widget``, then ``show`` its result on the UI thread;
    a target's AdapterError is said in a toast titled ``title`` instead."""

    def run() -> None:
        try:
            result = read()
        except AdapterError as exc:
            widget.app.call_from_thread(widget.app.notify, exc.message, severity="error", title=title)
            return
        widget.app.call_from_thread(show, result)

    return widget.run_worker(run, group=group, exclusive=exclusive, thread=True, exit_on_error=False)
