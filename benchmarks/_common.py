"""Helpers shared by the benchmarks: progress lines, medians, engine-thread hold timing."""

from __future__ import annotations

import statistics
import sys
import time
from time import perf_counter as pc


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt_nodes(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e3 else str(n)


class EngineHolds:
    """Times each command on the engine's owner thread: how long a read holds the cache."""

    def __init__(self, engine):
        self.holds: list[float] = []
        call = engine.call

        def timed_call(fn, timeout: float = 10.0):
            def run(s):
                t0 = pc()
                try:
                    return fn(s)
                finally:
                    self.holds.append(pc() - t0)

            return call(run, timeout)

        engine.call = timed_call  # instance attribute: shadows Engine.call for this engine only

    def mark(self) -> int:
        return len(self.holds)

    def since(self, mark: int) -> float:
        return sum(self.holds[mark:])
