"""Repeated log lines, said once per window: a flood of bad requests (each one a uvicorn warning)
or a demo on a pool too small for its turns must not become a flood of log lines.

``limit_repeats()`` puts one ``RepeatLimit`` on the loggers that such floods come through. A
filter on a logger sees only what is logged at that logger (not what its children propagate), so
the loggers are named one by one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

# Where floods come from: uvicorn's per-connection warnings (a malformed request, an accept that
# fails for want of files), the demo engine's requests that do not fit, the admin API's own.
FLOODED_LOGGERS = ("uvicorn.error", "radixtop.gpu_backend.engine", "radixtop.adapters.http.server",
                   "radixtop.slices")


class RepeatLimit(logging.Filter):
    """Lets ``burst`` records of one message (its logger and format string, whatever the
    arguments) through per ``window`` seconds and drops the rest; the first one let through after
    that says how many were dropped. Memory is bounded: at most ``MAX_KEYS`` messages tracked."""

    MAX_KEYS = 1024

    def __init__(self, burst: int = 5, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._seen: dict[tuple[str, str], list] = {}  # key -> [window start, let through, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self.window:
            dropped = entry[2] if entry is not None else 0
            if entry is None and len(self._seen) >= self.MAX_KEYS:
                self._seen.pop(next(iter(self._seen)))  # the oldest message tracked
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = (f"{record.msg} ({dropped} similar messages suppressed in the last "
                              f"{now - entry[0]:.0f} s)")
            return True
        if entry[1] < self.burst:
            entry[1] += 1
            return True
        entry[2] += 1
        return False


def limit_repeats(loggers: Iterable[str] = FLOODED_LOGGERS, burst: int = 5, window: float = 60.0) -> RepeatLimit:
    """One RepeatLimit on each of ``loggers`` (their settings, handlers and levels untouched)."""
    limit = RepeatLimit(burst, window)
    for name in loggers:
        logging.getLogger(name).addFilter(limit)
    return limit
