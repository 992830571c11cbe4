"""The contract suite's known cache, built in the REAL SGLang 0.5.23 caches (``drive23``): a
``UnifiedRadixCache`` (FULL component, Python tree core, ``--enable-session-radix-cache``) or a
plain ``RadixCache`` (no sessions), over an ``MHATokenToKVPool`` shaped like radixtop's "tiny"
geometry (2 layers, 2 heads, head_dim 8, float32: 256 bytes per token), driven the way 0.5.23's
scheduler drives it, and owned by a scheduler thread that drains an ``OwnerQueue`` between steps
(``known16.SchedulerThread``).

0.5.23 differs from the bundled cache in ways the numbers show (derive expectations from the
SGLang tree, not from the bundled cache's figures): a finished request's KV covers
``input + output[:-1]``; insert splits the leaf at the prompt boundary (``[prompt][output]``);
admission matches at most ``len(input) - 1`` tokens (so a repeated prompt splits its last node);
a session tags only its frontier node (a later turn moves it); close only dereferences.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.owner.queue import OwnerQueue
from tests.on_sglang.ref import drive23
from tests.on_sglang.ref.known16 import SchedulerThread

TINY = drive23.KVGeometry(layer_num=2, head_num=2, head_dim=8, dtype="float32")  # 256 B/token
CAPACITY = 256

# The sessions SGLang's SessionController would hold open (the requests carried these ids).
OPENED = ("a", "b", "c", "d", "gone")


@dataclass
class Known:
    """A built cache and what drove it (``running`` is d's request, still holding its lock)."""

    cache: Any
    pools: drive23.Pools
    running: Any = None

    def finish_running(self, output_ids=(99,)) -> None:
        if self.running is not None:
            drive23.finish_request(self.cache, self.pools, self.running, output_ids)
            self.running = None


def build_known(kind: str = "unified", capacity: int = CAPACITY, **kwargs: Any) -> Known:
    """The same requests as ``tests.contract.build_engine`` (and ``known16.build_known``), in
    SGLang 0.5.23. ``kind``: "unified" (sessions on, Python core), "radix" (plain RadixCache),
    "unified-nosessions" (``tree_core_backend`` from kwargs, "python" by default). The close of
    "gone" is left to the caller (the adapter), so that its counters see it."""
    if kind == "radix":
        cache, pools = drive23.build_radix_cache23(capacity, geometry=TINY, max_context_len=64, **kwargs)
    elif kind == "unified":
        cache, pools = drive23.build_unified_cache23(capacity, geometry=TINY, max_context_len=64, **kwargs)
    elif kind == "unified-nosessions":
        cache, pools = drive23.build_unified_cache23(capacity, geometry=TINY, max_context_len=64,
                                                     enable_session_radix_cache=False, **kwargs)
    else:
        raise ValueError(kind)

    def run(prompt, output, sid):
        drive23.run_request(cache, pools, prompt, output, session_id=sid)

    run([1, 2, 3, 4, 5, 6], [7, 8], "a")
    run([1, 2, 3, 4, 5, 6, 7, 8, 10], [11], "a")
    run([1, 2, 3, 4, 20], [21, 22], "b")
    run([1, 2, 3, 4, 5, 6], [7, 8], "c")
    run([30, 31], [32], "gone")
    running = drive23.begin_request(cache, pools, [1, 2, 3, 4, 9, 9], session_id="d")
    run([40, 41, 42], [43], None)
    for prompt in ([50, 51], [50, 51, 52, 53], [50, 51, 52, 53, 54, 55]):
        run(prompt, [prompt[-1] + 1], None)  # a run of single children
    return Known(cache, pools, running)


@contextmanager
def known_adapter(kind: str = "unified", read_only: bool = False, close_gone: bool = True,
                  **kwargs: Any) -> Iterator[tuple[SGLangInProcessAdapter, Known, SchedulerThread]]:
    """``build_known`` wrapped in an SGLangInProcessAdapter whose reads and actions run on a scheduler
    thread (an OwnerQueue drained between steps). With sessions, "gone" is closed through the
    adapter (as known16 does)."""
    known = build_known(kind, **kwargs)
    owner = OwnerQueue("the test scheduler")
    scheduler = SchedulerThread(owner).start()
    sessions = kind == "unified"
    adapter = SGLangInProcessAdapter(known.cache, owner, name="sglang", model="tiny",
                            open_sessions=(lambda: OPENED) if sessions else None, timeout=10.0)
    try:
        if sessions and close_gone:
            adapter.close_session("gone")
        adapter.read_only = read_only
        yield adapter, known, scheduler
    finally:
        scheduler.stop()
