"""Run reads and actions on a cache's owner thread, between its steps.

A radix cache has one owner (the engine loop, SGLang's scheduler thread). Other threads hand it
callables through this queue and wait with a timeout; the owner calls ``drain()`` between steps
(for SGLang, from a hook on ``Scheduler.process_input_requests``, where SGLang applies its own
control messages). A request that waits past its timeout is cancelled if it has not started, so a
stuck owner never runs stale work later, and the caller gets ``TargetTimeout``.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from adapters.model import TargetTimeout
from gpu_backend.slices import Slices

T = TypeVar("T")


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC inside: for a walk on the owner thread that makes a great many small,
    acyclic objects (freed by reference counts when it ends), where a collection midway only
    stalls the owner longer."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class OwnerQueue:
    """Callables for the owner thread; ``call`` waits, ``drain`` runs what is queued."""

    def __init__(self, name: str = "the scheduler") -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self._owner: int | None = None
        self.last_drain: float | None = None
        self.drained = 0
        self.slices = Slices()
        """Long passes (an attribution of a large tree), a slice of each ``drain``."""

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """``fn()`` on the owner thread; its result or its exception. Called from the owner
        thread itself (a hook that reads), it runs at once."""
        if threading.get_ident() == self._owner:
            return fn()
        future: Future = Future()
        self._queue.put((fn, future))
        try:
            return future.result(timeout)
        except FutureTimeout:
            if future.cancel():
                raise TargetTimeout(self._late(timeout)) from None
            return future.result()  # it started just now: wait for it rather than lose it
        except CancelledError:
            raise TargetTimeout(self._late(timeout)) from None

    def _late(self, timeout: float) -> str:
        if self.last_drain is None:
            seen = "it has not run a step since radixtop attached"
        else:
            seen = f"its last step was {time.monotonic() - self.last_drain:.1f}s ago"
        return f"{self.name} did not take the request within {timeout:g}s ({seen})"

    def drain(self, max_items: int = 64) -> int:
        """Run up to ``max_items`` queued callables now, then a slice of the passes pending
        (owner thread only); how many callables ran."""
        self._owner = threading.get_ident()
        self.last_drain = time.monotonic()
        ran = 0
        while ran < max_items:
            try:
                fn, future = self._queue.get_nowait()
            except queue.Empty:
                break
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, never raised in the owner's loop
                future.set_exception(exc)
            ran += 1
        self.drained += ran
        self.slices.run()
        return ran

    def pending(self) -> int:
        return self._queue.qsize()
