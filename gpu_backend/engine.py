"""Engine loop: one owner thread steps the workload and runs queued commands between steps."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import IO, Any, TypeVar

from gpu_backend.scheduler import OutOfSlotsError, Scheduler
from gpu_backend.slices import Slices
from gpu_backend.trace import op_to_json
from gpu_backend.workload import ChatWorkload, WorkloadConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EngineError(RuntimeError):
    """The engine cannot run a command (stopped, dead, or too slow to answer)."""


class EngineTimeout(EngineError):
    pass


class EngineStopped(EngineError):
    pass


class Engine:
    """Owns a Scheduler on one thread. Nothing else touches the tree: reads that need a
    consistent view and every mutation go through :meth:`call`, which queues a function and runs
    it on the owner thread between steps, as SGLang runs control messages between batches.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        workload: WorkloadConfig | None = None,
        step_interval: float = 0.0,
        record_to: IO[str] | None = None,
    ):
        self.scheduler = scheduler
        self.workload = ChatWorkload(workload) if workload is not None else None
        self.step_interval = step_interval
        self.record_to = record_to
        self._commands: queue.SimpleQueue[tuple[Callable[[Scheduler], Any], Future]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._paused = threading.Event()
        self._finished = threading.Event()  # set when the loop has ended, before it fails what is queued
        self.steps = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self.error: BaseException | None = None
        self._arrival_credit = 0.0
        self._last_step = time.monotonic()
        self.slices = Slices()
        """Long passes (an attribution of a large cache) run here a slice per loop iteration."""

    # ----- lifecycle -----

    def start(self) -> Engine:
        if self._thread is not None:
            raise EngineError("engine already started")
        self._thread = threading.Thread(target=self._run, name="radixtop-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """From now on every call raises EngineStopped at once, and queued commands that have not
        started never run (their callers get EngineStopped). A command already running finishes:
        ``timeout`` bounds the wait for it, not the refusal of new ones."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_pending(EngineStopped("engine stopped"))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pause_workload(self, paused: bool = True) -> None:
        """Stop (or resume) starting and finishing requests; commands still run."""
        if paused:
            self._paused.set()
        else:
            self._paused.clear()
        self._wake.set()

    # ----- commands -----

    def call(self, fn: Callable[[Scheduler], T], timeout: float = 10.0) -> T:
        """Run ``fn(scheduler)`` on the owner thread between steps and return its result.

        Raises EngineTimeout if it has not run within ``timeout`` seconds (the command is then
        cancelled if it has not started), and EngineStopped if the engine is not running.
        """
        if self._stop.is_set() or not self.alive:  # stopped: refused even while a command still runs
            raise EngineStopped(self._dead_reason())
        future: Future = Future()
        self._commands.put((fn, future))
        self._wake.set()
        if self._finished.is_set():  # the loop ended after the check above: nobody else will answer
            self._fail_pending(EngineStopped(self._dead_reason()))
        try:
            return future.result(timeout)
        except FutureTimeout:
            if future.cancel():
                raise EngineTimeout(f"engine did not run the command within {timeout:g} s") from None
            return future.result()  # it started just now: wait for it to finish

    def _dead_reason(self) -> str:
        if self.error is not None:
            return f"engine thread died: {type(self.error).__name__}: {self.error}"
        return "engine is not running"

    # ----- the loop -----

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_commands()
                self.slices.run()
                if self.workload is not None and not self._paused.is_set():
                    self._step()
                    self.steps += 1
                    if self.step_interval > 0:
                        self._wait(self.step_interval)
                else:
                    self._wait(0.05)
        except BaseException as exc:  # the owner thread must say why it died, not vanish
            self.error = exc
            logger.exception("engine thread died")
        finally:
            self._finished.set()
            self._fail_pending(EngineStopped(self._dead_reason()))

    def _wait(self, seconds: float) -> None:
        """Idle until woken or ``seconds`` pass; with passes pending, run them meanwhile (a slice
        at a time, taking commands between slices) instead of sleeping."""
        deadline = time.monotonic() + seconds
        while self.slices.pending and not self._stop.is_set() and time.monotonic() < deadline:
            self._drain_commands()
            self.slices.run(idle=True)
        self._wake.wait(max(0.0, deadline - time.monotonic()))
        self._wake.clear()

    def _drain_commands(self) -> None:
        while not self._stop.is_set():  # once stopped, what is still queued is failed, never run
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue  # its caller timed out before it started: it never runs
            try:
                future.set_result(fn(self.scheduler))
            except Exception as exc:
                future.set_exception(exc)
            except BaseException as exc:  # it ends the loop; its caller must hear why, not wait forever
                future.set_exception(EngineStopped(f"engine thread died: {type(exc).__name__}: {exc}"))
                raise

    def _fail_pending(self, exc: Exception) -> None:
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)

    def _arrival_budget(self) -> int | None:
        rate = self.workload.config.arrival_rate
        now = time.monotonic()
        elapsed, self._last_step = now - self._last_step, now
        if rate <= 0:
            return None
        self._arrival_credit = min(self._arrival_credit + elapsed * rate, float(self.workload.config.max_running))
        budget = int(self._arrival_credit)
        self._arrival_credit -= budget
        return budget

    def _step(self) -> None:
        s = self.scheduler
        for action in self.workload.step(self._arrival_budget()):
            if action.kind == "begin":
                try:
                    s.begin(action.rid, action.input_ids, action.session_id)
                except OutOfSlotsError as exc:
                    self.workload.abort(action.rid)
                    self.requests_aborted += 1
                    logger.warning("request %s not started: %s", action.rid, exc)
                    continue
                self.record("begin", id=action.rid, input=action.input_ids, session=action.session_id)
            elif action.kind == "finish":
                if action.rid not in s.running:
                    continue
                try:
                    s.finish(action.rid, action.output_ids)
                except OutOfSlotsError as exc:
                    # Retract it: its slots go back, and its session retries the turn later.
                    s.abort(action.rid)
                    self.requests_aborted += 1
                    self.record("abort", id=action.rid)
                    logger.warning("request %s retracted: %s", action.rid, exc)
                    continue
                self.requests_finished += 1
                self.record("finish", id=action.rid, output=action.output_ids)
            elif action.kind == "close":
                s.close_session(action.session_id)
                self.record("close", session=action.session_id)

    def record(self, op: str, **fields: Any) -> None:
        """Append an op to the recorded trace (owner thread only), if recording."""
        if self.record_to is not None:
            self.record_to.write(op_to_json(op, **fields) + "\n")

    # ----- recorded admin actions (so a recorded run replays exactly) -----

    def close_session(self, session_id: str, timeout: float = 10.0):
        def run(s: Scheduler):
            result = s.close_session(session_id)
            self.record("close", session=session_id)
            return result

        return self.call(run, timeout)

    def evict(self, num_tokens: int, timeout: float = 10.0):
        def run(s: Scheduler):
            result = s.evict(num_tokens)
            self.record("evict", tokens=num_tokens)
            return result

        return self.call(run, timeout)
