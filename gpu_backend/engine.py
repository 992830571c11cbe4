"""Engine loop: one owner thread steps the workload and runs queued commands between steps."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

from radixtop.gpu_backend.owner.queue import OwnerError, OwnerQueue, OwnerStopped
from radixtop.gpu_backend.scheduler import OutOfSlotsError, Scheduler
from radixtop.gpu_backend.traces.ops import op_to_json
from radixtop.gpu_backend.traces.playback import TracePlayback
from radixtop.gpu_backend.workload import ChatWorkload, WorkloadConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Engine:
    """Owns a Scheduler on one thread. Nothing else touches the tree: reads that need a
    consistent view and every mutation go through :meth:`call`, which queues a function on the
    owner thread's ``OwnerQueue`` and runs it between steps, as SGLang runs control messages
    between batches.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        workload: WorkloadConfig | TracePlayback | None = None,
        step_interval: float = 0.0,
        record_to: IO[str] | None = None,
    ):
        self.scheduler = scheduler
        # The demo's chat workload from its config, or a trace played in real time as it is.
        self.workload = ChatWorkload(workload) if isinstance(workload, WorkloadConfig) else workload
        self.step_interval = step_interval
        self.record_to = record_to
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.owner = OwnerQueue("the engine thread", wake=self._wake.set)
        self._thread: threading.Thread | None = None
        self._paused = threading.Event()
        self.steps = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self.error: BaseException | None = None
        self._arrival_credit = 0.0
        self._last_step = time.monotonic()
        self.on_step: Callable[[], None] | None = None
        """Called once a loop on the owner thread, and at each wake while it idles (the probe of
        radixtop's process beside the engine: ``adapters.bundled.beside``)."""
        self.slices = self.owner.slices
        """Long passes (an attribution of a large cache, the evict heap's compaction) run here a
        slice per loop iteration."""
        scheduler.cache.background = self.slices.add

    # ----- lifecycle -----

    def start(self) -> Engine:
        if self._thread is not None:
            raise OwnerError("engine already started")
        self._thread = threading.Thread(target=self._run, name="radixtop-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """From now on every call raises OwnerStopped at once, and queued commands that have not
        started never run (their callers get OwnerStopped). A command already running finishes:
        ``timeout`` bounds the wait for it, not the refusal of new ones."""
        self._stop.set()
        self.owner.close("engine stopped")
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Wake the owner thread where it idles (from any thread)."""
        self._wake.set()

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

    def call(self, fn: Callable[[Scheduler], T], timeout: float = 10.0, urgent: bool = False) -> T:
        """Run ``fn(scheduler)`` on the owner thread between steps and return its result
        (``urgent``: ahead of queued reads, see ``OwnerQueue``).

        Raises OwnerTimeout if it has not run within ``timeout`` seconds (the command is then
        cancelled if it has not started), and OwnerStopped if the engine is not running.
        """
        if not self.alive and not self.owner.closed:  # never started
            raise OwnerStopped(self._dead_reason())
        return self.owner.call(lambda: fn(self.scheduler), timeout, urgent)

    def _dead_reason(self) -> str:
        if self.error is not None:
            return f"engine thread died: {type(self.error).__name__}: {self.error}"
        return "engine is not running"

    # ----- the loop -----

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.owner.between_steps()
                if self.on_step is not None:
                    self.on_step()
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
            self.owner.close(self._dead_reason())

    def _wait(self, seconds: float) -> None:
        """Idle for ``seconds``: the time between two steps goes to queued reads and passes (a
        slice at a time, taking commands between slices); with none, sleep until one comes."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.on_step is not None:
                self.on_step()
            if self.slices.pending or self.owner.pending():
                self.owner.between_steps(idle=True, budget=left)
            else:
                self._wake.wait(left)
                self._wake.clear()

    def _arrival_budget(self) -> int | None:
        if not isinstance(self.workload, ChatWorkload):
            return None  # a trace playback starts what its clock says
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
                    # A session whose conversation has outgrown the whole pool ends; others retry.
                    self.workload.abort(action.rid, give_up=not s.fits(len(action.input_ids)))
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
            result = s.evict_asked(num_tokens, "the engine's evict")
            self.record("evict", tokens=num_tokens)
            return result

        return self.call(run, timeout)
