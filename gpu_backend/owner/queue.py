"""Run reads and actions on a cache's owner thread, between its steps: the one queue for it.

A radix cache has one owner thread (radixtop's engine loop, SGLang's scheduler thread); a step is
one iteration of its loop. Other threads hand it callables through an ``OwnerQueue`` and wait
with a timeout; the owner calls ``between_steps()`` once per step (the engine once per loop
iteration; SGLang from the plugin's hook on ``Scheduler.process_input_requests``, where SGLang
applies its own control messages). That hold runs the queued calls, then a slice of the long
passes (``slices``), each a chunk at a time. A call that waits past its timeout is
cancelled if it has not started, so a stuck owner never runs stale work later. Once the queue is
closed (the owner stopped or died) every call fails at once and nothing queued runs.

Urgent calls (actions, and the cheap reads health checks make) run first, every hold, however
many reads wait. Reads are bounded on a busy owner: per hold, until ``READ_BUDGET_S`` is spent
(at least one), and overall, with the long passes, to the slices' ``duty`` share of its time;
an idle owner (between the engine's steps, where it would sleep) runs them all. So a flood of
reads slows the reads, not the engine, and never the operator's actions.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import TypeVar

from radixtop.gpu_backend.owner.slices import LongestOfLate, Slices, run_to_end

T = TypeVar("T")

HOLD_S = 0.004
"""What radixtop takes of a busy owner in one hold (between two of its steps), queued reads and
the passes' slice together (the read or chunk that is running when it is spent ends first: each
is kept to ~1 ms). The goal is a hold of at most 5 ms."""
READ_BUDGET_S = 0.002
"""Of ``HOLD_S``, what queued reads may take (at least one read runs); the passes get the rest,
and at least one chunk of theirs."""


class OwnerError(RuntimeError):
    """The owner thread cannot run a call (stopped, dead, or too slow to take it)."""


class OwnerTimeout(OwnerError):
    """The owner did not take the call within its timeout; the call was cancelled (never runs)."""


class OwnerStopped(OwnerError):
    """The owner has stopped or died: nothing more runs there."""


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
    """Callables for the owner thread: ``call`` (or ``call_pass``) waits for one, and the owner's
    ``between_steps`` runs them."""

    def __init__(self, name: str = "the owner thread", wake: Callable[[], None] | None = None) -> None:
        self.name = name
        self._wake = wake
        """Called after a call is queued: an owner that idles in a wait is woken by it."""
        self._queue: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self._urgent: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self._owner: int | None = None
        self._closed: str | None = None
        self.last_drain: float | None = None
        self.drained = 0
        self._read = LongestOfLate()
        self.slices = Slices()
        """Long passes (an attribution of a large tree), a slice between steps."""

    # ----- callers -----

    def call(self, fn: Callable[[], T], timeout: float, urgent: bool = False) -> T:
        """``fn()`` on the owner thread: its result, or its exception. From the owner thread
        itself (a hook that reads) it runs at once. ``urgent`` (an action, a health check's
        read) runs ahead of every queued read and outside their budget. Raises OwnerTimeout if
        the owner has not taken it within ``timeout`` seconds, OwnerStopped if the queue is
        closed."""
        if self._closed is not None:  # first: a dead owner's thread id may be another thread's now
            raise OwnerStopped(self._closed)
        if threading.get_ident() == self._owner:
            return fn()
        future: Future = Future()
        (self._urgent if urgent else self._queue).put((fn, future))
        if self._closed is not None:  # closed after the check above: nobody else will answer
            self._fail_pending()
        if self._wake is not None:
            self._wake()
        try:
            return future.result(timeout)
        except FutureTimeout:
            if future.cancel():
                raise OwnerTimeout(self._late(timeout)) from None
            return future.result()  # it started just now: wait for it rather than lose it

    def call_pass(self, make: Callable[[], Generator[None, None, T]], timeout: float) -> T:
        """A long read as a pass (a generator that yields between chunks of its work and returns
        its result): the owner runs it a slice at a time between its steps (``slices``, at most
        ``slices.slice_s`` at once), so it never holds the owner longer than that; the caller
        waits for the end. Past ``timeout`` it is dropped at its next chunk (OwnerTimeout). From
        the owner thread itself it runs to its end at once."""
        if self._closed is not None:
            raise OwnerStopped(self._closed)
        if threading.get_ident() == self._owner:
            return run_to_end(make())
        done: Future = Future()
        self.call(lambda: self.slices.add(_resolving(make(), done)), timeout)
        try:
            return done.result(timeout)
        except FutureTimeout:
            if done.cancel():
                raise OwnerTimeout(self._late(timeout).replace("did not take", "did not finish")) from None
            return done.result()

    def _late(self, timeout: float) -> str:
        if self.last_drain is None:
            seen = "it has not run a step since radixtop attached"
        else:
            seen = f"its last step was {time.monotonic() - self.last_drain:.1f}s ago"
        return f"{self.name} did not take the request within {timeout:g}s ({seen})"

    # ----- the owner -----

    def drain(self, max_items: int | None = None, read_budget: float | None = None) -> int:
        """Run what is queued now, on the owner thread (up to ``max_items`` calls), without the
        passes (``between_steps`` runs both): the urgent
        calls, then reads until ``read_budget`` seconds are spent (None: all; 0: none; else at
        least one); how many ran. An exception goes to its caller, never into the owner's loop;
        a BaseException (the thread is dying) also fails its caller with OwnerStopped, then
        propagates."""
        self._owner = threading.get_ident()
        self.last_drain = time.monotonic()
        ran = self._run_queued(self._urgent, max_items, None)
        if read_budget is None or read_budget > 0:
            ran += self._run_queued(self._queue, None if max_items is None else max_items - ran, read_budget)
        self.drained += ran
        return ran

    def _run_queued(self, calls: queue.SimpleQueue, max_items: int | None, budget: float | None) -> int:
        """Run queued calls until ``budget`` seconds are spent (None: all): after the first, one
        starts only where a call as long as the longest of late would end within it."""
        ran = 0
        deadline = None if budget is None else time.perf_counter() + budget
        while self._closed is None and (max_items is None or ran < max_items):
            if deadline is not None and ran and time.perf_counter() + self._read.seconds > deadline:
                break
            if calls.empty():
                break
            try:
                fn, future = calls.get_nowait()
            except queue.Empty:
                break
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started: it never runs
            started = time.perf_counter()
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)
            except BaseException as exc:
                future.set_exception(OwnerStopped(f"{self.name} died: {type(exc).__name__}: {exc}"))
                raise
            self._read.record(time.perf_counter() - started)
            ran += 1
        return ran

    def between_steps(self, idle: bool = False, max_items: int | None = None, budget: float | None = None) -> int:
        """The hold: what the owner runs between two of its steps, the urgent calls, the reads,
        then a slice of the long passes; how many calls ran. A busy owner gives it all ``HOLD_S``
        (``READ_BUDGET_S`` of it to reads), and none while the reads and passes have had their
        ``duty`` share of its time (``Slices`` keeps that account for both); an ``idle`` one runs
        the reads for up to ``budget`` seconds (None: all of them) and the passes flat out. With
        nothing to do it costs a few microseconds (most steps); the cyclic GC waits meanwhile."""
        self._owner = threading.get_ident()
        self.last_drain = time.monotonic()
        slices = self.slices
        if self._urgent.empty() and self._queue.empty() and not slices.pending:
            return 0
        # The GC is switched off before anything here allocates: a context manager's own objects
        # could set off a collection inside the hold (seen: 3-5 ms on a 100k-node tree).
        enabled = gc.isenabled()
        gc.disable()
        try:
            if idle:
                ran = self.drain(max_items, budget)
                if self._closed is None:
                    slices.run(idle=True)
                return ran
            started = time.perf_counter()
            ran = self.drain(max_items, READ_BUDGET_S if slices.may_run(started) else 0.0)
            if ran:
                slices.charge(started, time.perf_counter())
            if self._closed is None:
                slices.run(deadline=started + HOLD_S)
            return ran
        finally:
            if enabled:
                gc.enable()

    step = between_steps
    """``between_steps``: the name before 0.2 (kept for one release)."""
    call_steps = call_pass
    """``call_pass``: the name before 0.2 (kept for one release)."""

    def close(self, reason: str) -> None:
        """From now on every call fails with OwnerStopped(reason) at once, and what is queued and
        not started never runs (its callers get the same). A call already running finishes."""
        self._closed = reason
        self._fail_pending()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def _fail_pending(self) -> None:
        for calls in (self._urgent, self._queue):
            while True:
                try:
                    _, future = calls.get_nowait()
                except queue.Empty:
                    break
                if future.set_running_or_notify_cancel():
                    future.set_exception(OwnerStopped(self._closed or f"{self.name} stopped"))

    def pending(self) -> int:
        return self._queue.qsize() + self._urgent.qsize()


def _resolving(steps: Generator[None, None, T], done: Future) -> Generator[None, None, None]:
    """A pass for ``Slices`` that hands its result (or its exception) to ``done``, and stops at
    its next chunk once its caller gave up (``done`` cancelled)."""
    while not done.cancelled():
        try:
            next(steps)
        except StopIteration as finished:
            result, error = finished.value, None
        except Exception as exc:  # handed to the caller, never raised in the owner's loop
            result, error = None, exc
        else:
            yield
            continue
        try:
            done.set_exception(error) if error is not None else done.set_result(result)
        except InvalidStateError:  # cancelled by its caller meanwhile
            pass
        return
