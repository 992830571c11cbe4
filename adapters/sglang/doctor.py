"""The leak doctor's view of a live SGLang scheduler: who holds locks on the tree, who waits.

SGLang locks a request's matched path when it admits it (``inc_lock_ref(req.last_node)``: a node,
or in UnifiedRadixCache its NodeId), moves the lock as a chunked or decoding request grows
(``cache_unfinished_req``), and releases it when the request finishes or is retracted
(``cache_finished_req``). So between two batches (where the
plugin's hook runs) every lock on the tree belongs to a request of the running batch, of the last
batch (a prefill batch not merged yet), of a batch whose result the overlap scheduler has not
processed (``result_queue``), to the chunked request, to a streaming session's slot (its
``last_node``, held between turns), or to a HiCache transfer in flight
(``ongoing_write_through`` / ``ongoing_load_back``). A lock beyond those is leaked. Field names
are those of SGLang 0.5.16 and 0.5.23 (``managers/scheduler.py``, ``schedule_batch.py``,
``session/streaming_session.py``, ``mem_cache/hiradix_cache.py``). Not counted: the queues of
PD-disaggregation decode servers, which hold locks of their own (a doctor there may report them).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from radixtop.adapters.doctor import AdmissionQueue, DoctorInputs, Pool

if TYPE_CHECKING:
    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter

SESSION_CHUNK = 256


def running_requests(scheduler: Any) -> list[Any] | None:
    """Everything that holds a lock on ``scheduler.tree_cache`` now, each with its ``last_node``
    (requests, streaming-session slots, HiCache transfers); None where the scheduler has no
    running batch to read (radixtop cannot see its requests)."""
    if not hasattr(scheduler, "running_batch"):
        return None
    batches = [scheduler.running_batch, getattr(scheduler, "last_batch", None), getattr(scheduler, "cur_batch", None)]
    for item in getattr(scheduler, "result_queue", None) or ():
        batches.append(item[0] if isinstance(item, tuple) else item)
    held: dict[int, Any] = {}
    for batch in batches:
        for req in getattr(batch, "reqs", None) or ():
            held[id(req)] = req
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        held[id(chunked)] = chunked
    cache = getattr(scheduler, "tree_cache", None)
    for slot in (getattr(cache, "slots", None) or {}).values():  # a StreamingSession's, between turns
        if getattr(slot, "last_node", None) is not None:
            held[id(slot)] = slot
    for name in ("ongoing_write_through", "ongoing_load_back"):  # HiCache's transfers in flight
        for entry in (getattr(cache, name, None) or {}).values():
            node = entry[0] if isinstance(entry, tuple) else entry
            held[id(entry)] = SimpleNamespace(last_node=node, session_id=None)
    return list(held.values())


def waiting_requests(scheduler: Any) -> Sequence[Any] | None:
    """The scheduler's waiting queue (None: it has none to read)."""
    queue = getattr(scheduler, "waiting_queue", None)
    return None if queue is None else list(queue)


def head_need(req: Any) -> int:
    """Slots a waiting request needs beyond its cached prefix (its input, and output so far for a
    retracted one, less ``prefix_indices``). SGLang's admission also reserves room for the new
    tokens of the requests already running, so it refuses earlier than this says: a finding here
    is certain, not early."""
    tokens = len(getattr(req, "origin_input_ids", ()) or ()) + len(getattr(req, "output_ids", ()) or ())
    prefix = getattr(req, "prefix_indices", None)
    return max(0, tokens - (len(prefix) if prefix is not None else 0))


def doctor_inputs(adapter: SGLangInProcessAdapter) -> DoctorInputs:
    """What the doctor checks, read on the scheduler thread through the adapter's hooks."""
    import importlib.metadata

    tree = adapter.tree
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "?"

    def pool() -> Pool:
        capacity, free = int(adapter.allocator.size), int(adapter.allocator.available_size())
        evictable = tree.evictable_size()
        return Pool(capacity, free, evictable, max(0, capacity - free - evictable))

    def running() -> list[Any] | None:
        held = adapter.running_requests() if adapter.running_requests is not None else None
        return None if held is None else list(held)

    def node_of(last: Any) -> Any:
        if isinstance(last, int):  # UnifiedRadixCache (0.5.17+): ``req.last_node`` is a NodeId
            return tree.node_by_id(last) if tree.has_registry else None
        return last

    def holders() -> list[Any] | None:
        held = running()
        if held is None:
            return None
        nodes = (node_of(getattr(r, "last_node", None)) for r in held)
        return [n for n in nodes if n is not None]

    def idle_sessions(idle_after_s: float) -> Generator[None, None, list[tuple[str, float]]]:
        now, idle, closed = time.monotonic(), [], tree.closed()
        busy = {getattr(r, "session_id", None) for r in running() or ()}
        for k, (sid, nodes) in enumerate(list(tree.session_leaves().items())):
            if nodes and sid not in closed and sid not in busy:
                last = max(n.last_access_time for n in nodes)
                if now - last >= idle_after_s:
                    idle.append((sid, now - last))
            if k % SESSION_CHUNK == SESSION_CHUNK - 1:
                yield
        return idle

    def admission() -> AdmissionQueue | None:
        waiting = adapter.waiting_requests()  # type: ignore[misc]
        if not waiting:
            return None
        head = waiting[0]
        return AdmissionQueue(len(waiting), str(getattr(head, "rid", "?")), head_need(head))

    skipped = {}
    sessions_ok = tree.policy is not None and tree.has_nodes
    if tree.policy is not None and not tree.clock_is_time:
        skipped["idle_session"] = f"{tree.kind} stamps accesses with a counter, not a clock: idle times are unknown"
    return DoctorInputs(
        target=adapter.name,
        bytes_per_token=adapter.bpt,
        bug_owner=f"SGLang {version}",
        pool=pool,
        root=tree.root if tree.has_nodes else None,
        lock_ref=tree.lock_ref,
        holders=tree.holders,
        node_id=adapter._id,
        attached=adapter._attached,
        buckets=getattr(adapter, "_buckets", None),
        lock_holders=holders if adapter.running_requests is not None else None,
        closed=tree.closed if sessions_ok else None,
        idle_sessions=idle_sessions if sessions_ok and tree.clock_is_time else None,
        plan=adapter._plan if sessions_ok else None,
        admission=admission if adapter.waiting_requests is not None else None,
        skipped=skipped,
    )
