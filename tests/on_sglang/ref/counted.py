"""SGLang's maps of sessions, counting the ids read out of them during radixtop's holds of the
scheduler thread (SGLang's own work is not counted: its ``SessionController.maybe_reap`` walks
every session once a second), and a scheduler thread: what the roster tests bound."""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator


class Reads:
    """How many ids each hold read out of SGLang's session maps (only while ``counting``)."""

    def __init__(self) -> None:
        self.counting = False
        self.now = 0
        self.most = 0

    def counted(self, hold: Callable[..., object]) -> Callable[..., object]:
        """``hold``, counting the ids it reads."""
        def run(*args: object, **kwargs: object) -> object:
            self.now, self.counting = 0, True
            try:
                return hold(*args, **kwargs)
            finally:
                self.counting = False
                self.most = max(self.most, self.now)

        return run


READS = Reads()


class CountedSessions(dict):
    """SGLang's ``SessionController.sessions``, counting the ids read out of it in a hold."""

    def __iter__(self) -> Iterator[str]:
        for sid in dict.__iter__(self):
            READS.now += READS.counting
            yield sid

    def keys(self):  # type: ignore[override]
        return iter(self)

    def items(self):  # type: ignore[override]
        return ((sid, self[sid]) for sid in self)

    def values(self):  # type: ignore[override]
        return (self[sid] for sid in self)


class CountedTombstones(OrderedDict, CountedSessions):
    """The cache's ``_closed_session_ids``, counted the same way (an OrderedDict still)."""

    def __iter__(self) -> Iterator[str]:
        for sid in OrderedDict.__iter__(self):
            READS.now += READS.counting
            yield sid


class Scheduler:
    """A scheduler thread: its own work (``do``), then ``step`` (where radixtop's hold is)."""

    def __init__(self, step: Callable[[], object]) -> None:
        self.step = step
        self.jobs: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sglang-scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.001):
            while not self.jobs.empty():
                fn, done = self.jobs.get()
                fn()
                done.set()
            self.step()

    def do(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the scheduler thread, as its own work between holds."""
        done = threading.Event()
        self.jobs.put((fn, done))
        assert done.wait(30)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
