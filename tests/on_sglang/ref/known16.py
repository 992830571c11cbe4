"""The contract suite's known cache, built in the REAL SGLang 0.5.16 RadixCache (with its session
mixin, allocator, ReqToTokenPool and an MHATokenToKVPool shaped like radixtop's "tiny" geometry),
driven the way its scheduler drives it (``SGLangReplayer``: match, lock, allocate,
``cache_finished_req`` with session ids, ``release_radix_session``), and a scheduler thread that
owns it: it drains an ``OwnerQueue`` between its steps, as the plugin's hook does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.owner.queue import OwnerQueue
from tests.on_sglang.ref.replay_sglang import SGLangReplayer, import_sglang

TINY_KV = (2, 2, 8, "float32")  # layers, heads, head_dim, dtype: radixtop's "tiny" geometry


class SchedulerThread:
    """A stand-in for SGLang's scheduler loop: steps (here: nothing to compute) and, between
    them, drains the queue. ``pause()`` stops draining, as a stuck scheduler would."""

    def __init__(self, owner: OwnerQueue, step_s: float = 0.001):
        self.owner = owner
        self.step_s = step_s
        self.running = threading.Event()
        self.running.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sglang-scheduler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.step_s):
            if self.running.is_set():
                self.owner.between_steps(max_items=64)

    def start(self) -> SchedulerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def build_known(capacity: int = 256) -> SGLangReplayer:
    """The same cache as ``tests.contract.build_engine``, in SGLang (the close of "gone" is left
    to the adapter, so that its counters see it, as with the bundled engine)."""
    r = SGLangReplayer(import_sglang(), capacity, eviction_policy="lru", max_running=8,
                       max_context_len=64, kv_shape=TINY_KV)
    r.begin("r1", [1, 2, 3, 4, 5, 6], "a"); r.finish("r1", [7, 8])  # noqa: E702
    r.begin("r2", [1, 2, 3, 4, 5, 6, 7, 8, 10], "a"); r.finish("r2", [11])  # noqa: E702
    r.begin("r3", [1, 2, 3, 4, 20], "b"); r.finish("r3", [21, 22])  # noqa: E702
    r.begin("r4", [1, 2, 3, 4, 5, 6], "c"); r.finish("r4", [7, 8])  # noqa: E702
    r.begin("r5", [30, 31], "gone"); r.finish("r5", [32])  # noqa: E702
    r.begin("running", [1, 2, 3, 4, 9, 9], "d")
    r.begin("r6", [40, 41, 42], None); r.finish("r6", [43])  # noqa: E702
    for k, prompt in enumerate(([50, 51], [50, 51, 52, 53], [50, 51, 52, 53, 54, 55])):
        r.begin(f"run{k}", prompt, None)
        r.finish(f"run{k}", [prompt[-1] + 1])
    return r


# The sessions SGLang's SessionController would hold open (the requests carried these ids).
OPENED = ("a", "b", "c", "d", "gone")


@contextmanager
def known_adapter(read_only: bool = False) -> Iterator[tuple[SGLangInProcessAdapter, SGLangReplayer, SchedulerThread]]:
    replayer = build_known()
    owner = OwnerQueue("the test scheduler")
    scheduler = SchedulerThread(owner).start()
    adapter = SGLangInProcessAdapter(replayer.cache, owner, name="sglang", model="tiny",
                            open_sessions=lambda: OPENED, timeout=10.0)
    adapter.close_session("gone")
    adapter.read_only = read_only
    try:
        yield adapter, replayer, scheduler
    finally:
        scheduler.stop()
