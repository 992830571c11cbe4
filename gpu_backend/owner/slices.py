"""Long passes on a cache's owner thread, run in short slices between its steps.

A pass over a large tree (attributing memory to 100k sessions: seconds at a million nodes) would
stall every running request if run in one go. Written as a generator that yields after each
chunk of its work, it runs here instead: in each hold between the owner's steps, ``run()``
resumes the passes for about ``slice_s`` seconds, a chunk at a time, and on a busy owner for no
more than a ``duty`` share of its time (a pass of W seconds then spans at least W / duty). The
total work is the same; no step waits longer than a slice, and the steps around a pass slow
down by at most that share. An idle owner runs them flat out (``run(idle=True)``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("radixtop.slices")

SLICE_S = 0.003
"""A slice: what long passes may take of the owner at once (a chunk that starts within it ends
it: the chunks of radixtop's passes are kept to about 1 ms). ``OwnerQueue.between_steps`` gives
the reads and the slice one hold of ``HOLD_S`` together, so the slice gets what the reads left."""
DUTY = 0.25
"""The share of a busy owner's time that reads and passes may take, over time."""
CHUNK_MEMORY = 0.98
"""How a slice remembers its passes' longest chunk: the estimate of the next chunk is the
longest of late, decayed by this much a chunk (a 7 ms chunk is forgotten to 2.5 ms in ~50)."""
RELEASE_CHUNK = 1024
"""Entries a chunk of ``released`` frees."""


def run_to_end(work: Generator[None, None, T]) -> T:
    """A pass run to its end at once (on the owner thread, or where there is no owner): its result."""
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


class LongestOfLate:
    """What the next chunk (or read) may take: the longest of late, decayed by ``CHUNK_MEMORY``
    each time. A budget loop starts another only where ``now + seconds`` is within its deadline."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def record(self, seconds: float) -> None:
        self.seconds = max(seconds, self.seconds * CHUNK_MEMORY)


class Slices:
    """Passes waiting for owner time. ``add`` and ``run`` are called on the owner thread only."""

    def __init__(self, slice_s: float = SLICE_S, duty: float = DUTY):
        self.slice_s = slice_s
        self.duty = duty
        self._passes: deque[Generator[None, None, object]] = deque()
        self._next_at = 0.0  # perf_counter before which a busy owner runs no slice
        self._chunk = LongestOfLate()
        self.work_s = 0.0
        """Seconds spent in passes so far (all of them, for metrics and benchmarks)."""

    def add(self, work: Generator[None, None, object]) -> None:
        self._passes.append(work)

    @property
    def pending(self) -> int:
        return len(self._passes)

    def may_run(self, now: float) -> bool:
        """Whether a busy owner has had its share since the last slice (or read)."""
        return now >= self._next_at

    def charge(self, started: float, ended: float) -> None:
        """Count owner time spent on reads outside the passes (``started``..``ended``,
        perf_counter) against the same ``duty`` share: the next slice, or read, waits for it."""
        spent = ended - started
        if spent > 0 and self.duty < 1.0:
            self._next_at = max(self._next_at, ended + spent * (1.0 - self.duty) / self.duty)

    def run(self, idle: bool = False, deadline: float | None = None) -> float:
        """Resume the passes, in turn, until ``slice_s`` seconds are spent, or ``deadline``
        (perf_counter) comes if sooner, or none is left; the seconds spent. At least one chunk
        runs (a pass is never starved by what ran before it in the hold); another starts only
        where a chunk as long as the longest of late would end before the deadline, so a slice
        ends within it rather than one chunk past it. Unless
        ``idle``, nothing runs until the owner has had its share since the last slice. A pass
        that raises is logged and dropped, never raised to the owner."""
        if not self._passes:
            return 0.0
        started = time.perf_counter()
        if not idle and started < self._next_at:
            return 0.0
        deadline = started + self.slice_s if deadline is None else min(deadline, started + self.slice_s)
        passes = self._passes
        chunk_started = started
        while passes:
            try:
                next(passes[0])
            except StopIteration:
                passes.popleft()
            except Exception:
                log.exception("radixtop: a pass on the owner thread failed; it is dropped")
                passes.popleft()
            else:
                passes.rotate(-1)  # round robin: a read that waits on a pass lets that pass run
            now = time.perf_counter()
            # the next chunk starts only where one as long as the longest of late ends in time
            self._chunk.record(now - chunk_started)
            if now + self._chunk.seconds > deadline:
                break
            chunk_started = now
        ended = time.perf_counter()
        spent = ended - started
        self.work_s += spent
        if self.duty < 1.0:
            self._next_at = ended + spent * (1.0 - self.duty) / self.duty
        return spent


def released(*containers: Any, chunk: int = RELEASE_CHUNK) -> Generator[None, None, None]:
    """Empty large dicts, sets, lists and sharded maps (``radixtop.gpu_backend.owner.shards``: their
    ``shards``) ``chunk`` entries a chunk: a pass's working maps (a million entries) freed at once
    at its end took 10-25 ms of the owner in one hold."""
    for items in containers:
        shards = getattr(items, "shards", None)
        if shards is not None:
            yield from released(*shards, chunk=chunk)
        elif isinstance(items, (dict, set)):
            pop = items.popitem if isinstance(items, dict) else items.pop
            while items:
                for _ in range(min(chunk, len(items))):
                    pop()
                yield
        else:
            while items:
                del items[-chunk:]
                yield
