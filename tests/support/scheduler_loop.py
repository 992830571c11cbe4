"""A stand-in for SGLang's scheduler thread in the probe's tests (issue 27): the work a test
gives it, and the plugin's hook once a loop (``BesideProcess.step``), on a thread of its own."""

from __future__ import annotations

import queue
import threading
import time


class SchedulerLoop:
    """The scheduler's thread, as SGLang runs it: requests, and the plugin's hook once a loop
    (``BesideProcess.step``: events out, radixtop's calls answered), on a thread of its own so
    that the test's thread can read radixtop's admin API meanwhile (a read waits for a step)."""

    def __init__(self, beside, cache, pools) -> None:
        self.beside, self.cache, self.pools = beside, cache, pools
        self.work: queue.SimpleQueue = queue.SimpleQueue()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    fn = self.work.get(timeout=0.002)
                except queue.Empty:
                    fn = None
                if fn is not None:
                    fn()
                self.beside.step()
        except BaseException as exc:  # seen by the test, not lost in the thread
            self.error = exc
            time.sleep(0)

    def run(self, fn, timeout: float = 60):
        """``fn`` on the loop's thread, waited for; what it returned."""
        done = threading.Event()
        result: list = []

        def job() -> None:
            try:
                result.append(fn())
            finally:
                done.set()

        self.work.put(job)
        assert done.wait(timeout) and self.error is None, self.error
        return result[0] if result else None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert self.error is None, self.error
