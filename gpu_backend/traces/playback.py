"""A converted trace played in real time as the engine's workload: each op when its time comes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from radixtop.gpu_backend.traces.formats import TimedOp
from radixtop.gpu_backend.workload import Action

MAX_OPS_PER_STEP = 32
"""Ops started in one engine step at most: a playback that falls behind (a high --speed, a burst)
catches up over several steps, so queued commands still run between them."""


class TracePlayback:
    """Yields the engine's begin/finish/close actions for the ops whose time has come, the trace's
    seconds divided by ``speed``, counted from the first step. A ``request`` op is a begin and
    its finish in the same step. Once the ops run out, the cache keeps what the trace left."""

    def __init__(self, ops: Iterable[TimedOp], speed: float = 1.0, clock: Callable[[], float] = time.monotonic):
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self._ops = iter(ops)
        self._next: TimedOp | None = next(self._ops, None)
        self.speed = speed
        self.clock = clock
        self.started: float | None = None
        self.ops_done = 0
        self._auto_id = 0

    @property
    def done(self) -> bool:
        return self._next is None

    def trace_time(self) -> float:
        """Seconds of the trace played so far."""
        return 0.0 if self.started is None else (self.clock() - self.started) * self.speed

    def step(self, max_new: int | None = None) -> list[Action]:
        if self.started is None:
            self.started = self.clock()
        now = self.trace_time()
        actions: list[Action] = []
        ops = 0
        while self._next is not None and self._next.t <= now and ops < MAX_OPS_PER_STEP:
            actions.extend(self._actions(self._next))
            self._next = next(self._ops, None)
            ops += 1
        self.ops_done += ops
        return actions

    def _actions(self, timed: TimedOp) -> list[Action]:
        op, f = timed.op.op, timed.op.fields
        if op == "begin":
            return [Action("begin", f["id"], f["session"], input_ids=f["input"])]
        if op == "finish":
            return [Action("finish", f["id"], output_ids=f["output"])]
        if op == "close":
            return [Action("close", session_id=f["session"])]
        if op == "request":
            self._auto_id += 1
            rid = f"{f['session']}@{self._auto_id}"
            return [Action("begin", rid, f["session"], input_ids=f["input"]),
                    Action("finish", rid, f["session"], output_ids=f["output"])]
        raise ValueError(f"a trace playback has no {op!r} op")

    def abort(self, rid: str, give_up: bool = False) -> None:
        """A begin the pool refused: nothing to undo (the engine skips its finish: not running)."""
