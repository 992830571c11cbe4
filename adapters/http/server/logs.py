"""Repeated log lines, said once per window: a flood of bad requests (each one a uvicorn warning)
or a demo on a pool too small for its turns must not become a flood of log lines.

``limit_repeats()`` puts one ``RepeatLimit`` on the loggers that such floods come through. A
filter on a logger sees only what is logged at that logger (not what its children propagate), so
the loggers are named one by one. The admin API's protocol puts one on the event loop's failed
accepts (``protocol.http_protocol``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable

SERVER_LOG = "radixtop.adapters.http.server"
"""The admin API's one logger, shared by the server's modules: a filter on a logger sees only its own."""
# Where floods come from: uvicorn's per-connection warnings (a malformed request, an accept that
# fails for want of files), the demo engine's requests that do not fit, the admin API's own.
FLOODED_LOGGERS = ("uvicorn.error", "radixtop.gpu_backend.engine", SERVER_LOG, "radixtop.slices")


class RepeatLimit(logging.Filter):
    """Lets ``burst`` records of one message through per ``window`` seconds and drops the rest;
    the first one let through after that says how many were dropped. A message is its logger and
    format string, whatever the arguments, or what ``key`` makes of the record (None: not limited).
    Memory is bounded: at most ``MAX_KEYS`` messages tracked. Thread-safe (the event loop, the
    engine and uvicorn's threads log through the same one)."""

    MAX_KEYS = 1024

    def __init__(self, burst: int = 5, window: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 key: Callable[[logging.LogRecord], Hashable | None] | None = None) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self.key = key or (lambda record: (record.name, str(record.msg)))
        self._lock = threading.Lock()
        self._seen: dict[Hashable, list] = {}  # key -> [window start, let through, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = self.key(record)
        if key is None:
            return True
        now = self.clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.window:
                if entry[1] >= self.burst:
                    entry[2] += 1
                    return False
                entry[1] += 1
                return True
            if entry is None and len(self._seen) >= self.MAX_KEYS:
                self._seen.pop(next(iter(self._seen)))  # the oldest message tracked
            self._seen[key] = [now, 1, 0]
        if entry is not None and entry[2]:
            record.msg, record.args = (f"{record.getMessage()} ({entry[2]} similar messages suppressed in the "
                                       f"last {now - entry[0]:.0f} s)"), None
        return True


def limit_repeats(loggers: Iterable[str] = FLOODED_LOGGERS, burst: int = 5, window: float = 60.0) -> RepeatLimit:
    """One RepeatLimit on each of ``loggers`` (their settings, handlers and levels untouched)."""
    limit = RepeatLimit(burst, window)
    for name in loggers:
        logging.getLogger(name).addFilter(limit)
    return limit
