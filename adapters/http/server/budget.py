"""A bound on the CPU an admin API's process takes for reads (issue 27: radixtop beside SGLang's
scheduler must cost the server it watches close to nothing, a flood of reads included).

``CpuBudget`` is a token bucket of CPU seconds: it fills at ``share`` of one core per second of
wall time, up to ``burst_s`` seconds' worth, and the process's own CPU time (``time.process_time``:
every thread of it, following the tree included) drains it; the CPU of one gap between reads is
set against that gap's earnings before the bucket is capped, so a process that takes less than its
share between reads owes nothing. A read that comes while it is spent waits, on the event loop and
with no CPU, until the spent CPU is earned again; one that would wait longer than ``most_wait_s``
is answered 429 at once, with the wait left as its Retry-After. The debt is bounded
(``most_wait_s`` plus ``debt_s`` of earnings): a burst before (the process's start, a tokenizer
loading, a flood that stopped) delays reads for seconds at most, never minutes. Health, actions and
reads sent with the action token (the operator's: the dashboard and the commands send it) never
wait: an operator's close, and the reads it is planned with, go ahead of any flood (their CPU is
still counted). Reads with the read token wait like any other (it is given to others, and every
read off loopback needs it)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

BESIDE_CPU_SHARE = 0.25
"""The default share of one core radixtop's process beside a scheduler takes for reads
(``RADIXTOP_BESIDE_CPU``): a dashboard's polls at 1M nodes take about 0.15."""


class CpuBudget:
    def __init__(self, share: float, burst_s: float = 1.0, most_wait_s: float = 2.0, debt_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, cpu: Callable[[], float] = time.process_time) -> None:
        if not share > 0:
            raise ValueError(f"a CPU share must be above 0 (got {share!r})")
        self.share, self.most_wait_s = float(share), float(most_wait_s)
        self.capacity = self.share * burst_s
        self.floor = -self.share * (most_wait_s + debt_s)
        self.left = self.capacity
        self._clock, self._cpu = clock, cpu
        self._wall, self._used = clock(), cpu()
        self.waited = self.refused = 0

    def wait(self) -> float:
        """Seconds a read that comes now waits (0: none); above ``most_wait_s``: refuse it."""
        wall, used = self._clock(), self._cpu()
        earned = (wall - self._wall) * self.share - (used - self._used)
        self.left = max(self.floor, min(self.capacity, self.left + earned))
        self._wall, self._used = wall, used
        return 0.0 if self.left >= 0 else -self.left / self.share

    def retry_after(self, wait: float) -> int:
        """A refused read's Retry-After: when its wait would be within ``most_wait_s`` again."""
        return max(1, math.ceil(wait - self.most_wait_s))


def parse_share(text: str | None, default: float) -> float | None:
    """``RADIXTOP_BESIDE_CPU``'s value: a share of one core (``0.25``), or ``0``/``off`` for no
    bound; ValueError for anything else."""
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in ("0", "off", "none"):
        return None
    try:
        share = float(value)
    except ValueError:
        raise ValueError(f"RADIXTOP_BESIDE_CPU must be a share of one core (e.g. 0.25) or off, not {text!r}") from None
    if not 0.01 <= share <= 64:
        raise ValueError(f"RADIXTOP_BESIDE_CPU must be at least 0.01 and at most 64 cores (or off), not {text!r}")
    return share
