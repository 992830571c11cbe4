"""The leak doctor's view of the bundled engine: what ``adapters.doctor`` reads of its scheduler."""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from radixtop.adapters.doctor import AdmissionQueue, DoctorInputs, Pool

if TYPE_CHECKING:
    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.gpu_backend.scheduler import Scheduler

REFUSED_WINDOW_S = 60.0
"""A request refused for want of slots this recently counts as waiting (the engine has no queue:
its workload retries a refused turn as a new request)."""


def refused_waiting(s: Scheduler) -> list[tuple[str, int]]:
    """The requests refused for want of slots in the last ``REFUSED_WINDOW_S`` and not started since
    (each id and the slots it needed beyond its cached prefix), oldest first: the engine's waiting
    queue as the doctor reads it (a refused turn is retried as a new request)."""
    now = time.monotonic()
    return [(rid, need) for at, rid, need in s.refused if now - at <= REFUSED_WINDOW_S and rid not in s.running]


def doctor_inputs(adapter: BundledAdapter, s: Scheduler) -> DoctorInputs:
    """Everything the doctor checks, read from ``s`` on the engine's owner thread."""
    cache = s.cache

    def pool() -> Pool:
        st = s.stats()
        return Pool(st.capacity, st.available_size, st.evictable_size, st.protected_size + st.request_size)

    def buckets() -> Any:
        return adapter.stats_on_owner(s).buckets

    def idle_sessions(idle_after_s: float) -> Generator[None, None, list[tuple[str, float]]]:
        now, idle = time.monotonic(), []
        busy = {r.session_id for r in s.running.values()}
        leaves, closed = cache._session_leaves, cache._closed_session_ids
        # Least recently used first: the loop stops at the first session used since the threshold,
        # so it visits the idle ones only (no copy of every session the engine has seen), in one chunk.
        for sid, last in s.session_activity.items():
            if now - last < idle_after_s:
                break
            if leaves.get(sid) and sid not in closed and sid not in busy:
                idle.append((sid, now - last))
        return idle
        yield  # pragma: no cover (a pass that needs no chunk)

    def admission() -> AdmissionQueue | None:
        waiting = refused_waiting(s)
        if not waiting:
            return None
        return AdmissionQueue(len(waiting), waiting[0][0], waiting[0][1])

    return DoctorInputs(
        target=adapter.name,
        bytes_per_token=s.geometry.bytes_per_token,
        bug_owner="radixtop's bundled engine",
        pool=pool,
        root=cache.root_node,
        attached=lambda n: cache.nodes.get(n.id) is n,
        buckets=buckets,
        lock_holders=lambda: [r.last_node for r in s.running.values() if r.last_node is not None],
        closed=lambda: cache._closed_session_ids,
        idle_sessions=idle_sessions,
        plan=lambda sid: adapter._plan(s, sid),
        admission=admission,
    )
