"""The tree of a cache Python cannot read (SGLang's Rust tree core), kept from its own KV events.

Since SGLang 0.5.19 every model runs on ``UnifiedRadixCache``, and its tree core defaults to Rust:
no Python node to read. The core still records KV events (``BlockStored`` with token ids and the
storing request's ``session_id``, ``BlockRemoved``, ``AllBlocksCleared``) when it is built with
``enable_kv_cache_events``. The plugin turns that on for the Rust core only (a hook before
``RustUnifiedTreeCore.__init__``; no ``--kv-events-config`` needed, no ZMQ), takes the recorded
events on the scheduler thread (``take_events()``, what SGLang's own publisher does each loop;
where the operator configured a publisher, SGLang takes them and radixtop reads what it
publishes), and applies them on a thread of its own to an :class:`EventTreeAdapter`, the same
tree the ZMQ adapter keeps. The scheduler's cost is the core's recording and one
``take_events()`` a loop; the tree's upkeep and every read of it run off the scheduler thread.

:class:`CoreEventsAdapter` serves the contract: the tree, matches, changes and sessions (where the
events name them) from the events; totals, evict and flush from SGLang itself
(:class:`SGLangInProcessAdapter`). What the events cannot tell (locks, hit counts, and holders where no
request carried a session) is unknown, never 0.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from radixtop.adapters.base import CacheAdapter, Read, check_reads
from radixtop.adapters.errors import TargetTimeout, Unsupported
from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.wire import batch_of
from radixtop.adapters.model import (
    MAX_HISTORY_PAGE,
    Capabilities,
    ChainView,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    Diagnosis,
    EvictResultView,
    FlushResultView,
    HistoryPage,
    MatchView,
    NodeDetail,
    PathsView,
    SessionDetail,
    SessionsPage,
    SessionWhyView,
    Stats,
    SubtreeView,
    ThenView,
    WhyView,
)
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.history import EVICTED

log = logging.getLogger("radixtop.sglang")


class CoreTree(EventTreeAdapter):
    """The Rust core's tree as radixtop's process beside the scheduler keeps it from the probe's
    frames, with its history: on ``UnifiedRadixCache`` a block leaves the tree by eviction only (a
    session's close drops references; the nodes go when evicted), so a ``BlockRemoved`` is an
    eviction for room, unless the probe told the removals before it as an action radixtop asked
    for (``probe.CAUSED``: an evict, a flush); ``AllBlocksCleared`` is a flush."""

    removals_are = EVICTED

PAUSE_S = 0.05
"""The applying thread's pause between turns while nobody reads (see ``CoreEvents._run``)."""
RUST_CORE = "sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore"
"""The class whose ``__init__`` the plugin hooks to have the Rust core record KV events."""


def record_events(core: Any, params: Any, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The hook before ``RustUnifiedTreeCore.__init__(self, params)``: the same params with
    ``enable_kv_cache_events`` on (a table of LoRA names where SGLang gave none). Where the params
    are not what this expects (another SGLang), nothing changes (None) and one line says so: the
    hook must never stop a scheduler from starting. A scheduler radixtop does not attach to takes
    and drops the events each loop (``plugin._discard_events``)."""
    try:
        changes: dict[str, Any] = {"enable_kv_cache_events": True}
        if getattr(params, "kv_event_lora_names", None) is None:
            from sglang.srt.mem_cache.events import KvEventLoraNames

            changes["kv_event_lora_names"] = KvEventLoraNames()
        return (core, dataclasses.replace(params, **changes), *args), kwargs
    except Exception as exc:
        log.warning("radixtop: cannot have the Rust tree core record KV events (%s: %s); "
                    "no tree from it", type(exc).__name__, exc)
        return None


def records_events(cache: Any) -> bool:
    """Whether ``cache``'s tree core records KV events (its recorder is enabled)."""
    recorder = getattr(getattr(cache, "tree_core", None), "kv_events", None)
    return bool(getattr(recorder, "enabled", False)) and callable(getattr(cache, "take_events", None))


class CoreEvents:
    """Takes the KV events a cache records (on the scheduler thread) and applies them to ``tree``
    on a thread of radixtop's, as numbered batches read by the rules of the wire's decoder
    (``batch_of``: SGLang's own event objects, field by field; nothing is encoded).

    ``publisher``: SGLang's own ``SchedulerKvEventsPublisher`` where the operator configured
    one; SGLang takes the events then, and its publisher's ``publish`` is wrapped to hand each
    batch here too."""

    where = "taken in process"
    """Where the events are applied (for a capabilities' reason)."""

    def __init__(self, cache: Any, tree: EventTreeAdapter, publisher: Any = None) -> None:
        self.cache = cache
        self.tree = tree
        self._queue: queue.SimpleQueue[tuple[int, float, list[Any]] | None] = queue.SimpleQueue()
        self._queued = 0  # batches handed to the queue (their sequence numbers are 0 .. this - 1)
        self._sglang = publisher if publisher is not None and getattr(publisher, "enable_kv_cache_events",
                                                                      False) else None
        if self._sglang is not None:
            inner = self._sglang.kv_event_publisher
            original = inner.publish

            def publish(batch: Any, *args: Any, **kwargs: Any) -> Any:
                self._put(float(getattr(batch, "ts", 0.0) or time.time()), list(batch.events))
                return original(batch, *args, **kwargs)

            inner.publish = publish
        self._wanted = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixtop-core-events", daemon=True)
        self._thread.start()

    @property
    def sglang_takes(self) -> bool:
        """SGLang's own publisher takes the events (radixtop reads what it publishes)."""
        return self._sglang is not None

    def _put(self, ts: float, events: list[Any]) -> None:
        if events:
            self._queue.put((self._queued, ts, events))
            self._queued += 1

    def drain(self) -> int:
        """On the scheduler thread: take what the core recorded; returns how many batches have
        been handed on so far (the tree has them all once its last sequence is this - 1)."""
        if self._sglang is not None:
            self._sglang.publish_kv_events()  # SGLang's own step: takes, publishes, and hands us the batch
        else:
            self._put(time.time(), self.cache.take_events())
        return self._queued

    def _run(self) -> None:
        """Everything queued, then a pause of ``PAUSE_S`` unless a read waits: the scheduler and
        this thread share the GIL, and fewer, longer turns cost it less than one per batch."""
        while True:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                if item is None:
                    return
                self._apply(*item)
            self._wanted.wait(PAUSE_S)
            self._wanted.clear()

    def _apply(self, seq: int, ts: float, events: list[Any]) -> None:
        """One batch; whatever fails (an event this cannot read, a bug in the tree) marks the tree
        incomplete and the thread goes on: it must never die with the queue still filling."""
        try:
            self.tree.apply_batch(seq, batch_of(ts, events))
        except Exception as exc:
            log.exception("radixtop: applying KV-event batch %d failed", seq)
            self.tree.skipped(seq, f"batch {seq}: {type(exc).__name__}: {exc}")

    def hurry(self) -> None:
        """A read waits for the tree: skip the pause."""
        self._wanted.set()

    def close(self) -> None:
        self._queue.put(None)
        self._wanted.set()
        self._thread.join(5)


class CoreEventsAdapter(CacheAdapter):
    """The contract over a cache whose tree is known from its own KV events (see the module)."""

    def __init__(self, sglang: SGLangInProcessAdapter, core: CoreEvents, sync_timeout: float = 5.0,
                 synced: Callable[[float], bool] | None = None) -> None:
        """``synced(timeout)``: brings the tree up to the scheduler's last step (False: not within
        ``timeout``); by default the events taken in process (``CoreEvents``). ``sglang``: what
        SGLang itself says (its totals, actions), in process or (beside it) over the hand-over."""
        self.sglang = sglang
        self.core = core
        self.events = core.tree
        self.name = sglang.name
        self.read_only = sglang.read_only
        self.sync_timeout = sync_timeout
        self._synced = synced or self._synced_in_process
        self._in_read_many = threading.local()

    # ----- one moment: the tree has every event the core recorded before the read -----

    def _sync(self) -> None:
        if getattr(self._in_read_many, "on", False):
            return
        if not self._synced(self.sync_timeout):
            raise TargetTimeout(f"the tree's KV events were not applied within {self.sync_timeout:g}s")

    def _synced_in_process(self, timeout: float) -> bool:
        queued = self.sglang.call(self.core.drain)
        self.core.hurry()
        return self.events.wait_for_seq(queued - 1, timeout)

    def _read(self, fn: Callable[[], Any]) -> Any:
        self._sync()
        return fn()

    def read_many(self, reads: Sequence[Read]) -> list[Any]:
        checked = check_reads(reads)
        self._sync()
        self._in_read_many.on = True
        try:
            return [self._read_one(op, args) for op, args in checked]
        finally:
            self._in_read_many.on = False

    # ----- what SGLang itself says -----

    def capabilities(self) -> Capabilities:
        own = self.sglang.capabilities()
        sessions = self.events.sessions_seen()
        unknown = "locks and hit counts" if sessions else "locks, hit counts and holders"
        notes = [f"tree kept from the {self.sglang.tree.kind}'s own KV events, {self.core.where}: "
                 f"{unknown} are unknown"]
        if sessions:
            notes.append("sessions are those whose requests stored each block (session_id); close is SGLang's")
        notes += self.events.health_notes()  # a batch that failed, blocks detached
        if own.read_only:
            notes.insert(0, "read-only: actions are refused")
        return Capabilities(tree=True, sessions=sessions, close=False, evict=own.evict, flush=own.flush,
                            changes=True, read_only=own.read_only, reason="; ".join(notes))

    def stats(self) -> Stats:
        own = self.sglang.stats()
        mine = self.events.stats()
        return dataclasses.replace(own, node_count=mine.node_count, version=mine.version, tier_tokens=mine.tier_tokens,
                                   open_sessions=own.open_sessions if mine.open_sessions is None
                                   else mine.open_sessions)

    # ----- the tree, from the events -----

    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        return self._read(lambda: self.events.children(node_id, offset, limit, order))

    def chain(self, node_id: int, limit: int = 10_000) -> ChainView:
        return self._read(lambda: self.events.chain(node_id, limit))

    def subtree(self, node_id: int = 0, depth: int = 3, limit: int = 10, order: str = "bytes",
                min_bytes: int = 0) -> SubtreeView:
        return self._read(lambda: self.events.subtree(node_id, depth, limit, order, min_bytes))

    def paths(self, node_ids: Sequence[int]) -> PathsView:
        return self._read(lambda: self.events.paths(node_ids))

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail:
        return self._read(lambda: self.events.node(node_id, token_offset, token_limit))

    def match(self, tokens: list[int]) -> MatchView:
        return self._read(lambda: self.events.match(tokens))

    def changes(self, since: int) -> Changes:
        return self._read(lambda: self.events.changes(since))

    def why(self, tokens: list[int]) -> WhyView:
        return self._read(lambda: self.events.why(tokens))

    def why_session(self, session_id: str) -> SessionWhyView:
        return self._read(lambda: self.events.why_session(session_id))

    def history(self, after: int = 0, served_after: int = 0, limit: int = MAX_HISTORY_PAGE) -> HistoryPage:
        return self._read(lambda: self.events.history(after, served_after, limit))

    def then(self, at: float | None = None) -> ThenView:
        return self._read(lambda: self.events.then(at))

    def then_children(self, at: float | None, node_id: int = 0, offset: int = 0, limit: int = 100) -> ChildrenPage:
        return self._read(lambda: self.events.then_children(at, node_id, offset, limit))

    def export(self) -> Iterator[dict[str, Any]]:
        self._sync()
        return self.events.export()

    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        return self._read(lambda: self.events.sessions(order, offset, limit, contains, reverse))

    def session(self, session_id: str) -> SessionDetail:
        return self._read(lambda: self.events.session(session_id))

    def diagnose(self, idle_after_s: float = 600.0) -> Diagnosis:
        """SGLang's own figures (buckets, waiting requests); the core's locks are not readable."""
        return self.sglang.diagnose(idle_after_s)

    # ----- actions: SGLang's own -----

    def _closer(self, session_id: str) -> SGLangInProcessAdapter:
        """SGLang's adapter, which plans and closes where the tree has sessions; on the Rust core
        Unsupported, saying to use SGLang's own route and why."""
        if self.sglang.tree.policy is not None:
            return self.sglang
        raise Unsupported(
            f"{self.name}: radixtop cannot close session {session_id!r} here: the Rust tree core shows "
            "radixtop its KV events (which blocks each session stored), not which nodes a session holds, so "
            "radixtop can neither plan a close nor make one; close it with SGLang's own route: POST "
            '/close_session {"session_id": ...} (what it freed shows in the stats and the tree afterwards)')

    def plan_close(self, session_id: str) -> ClosePlanView:
        return self._closer(session_id).plan_close(session_id)

    def close_session(self, session_id: str) -> CloseResultView:
        return self._closer(session_id).close_session(session_id)

    def close_session_planned(self, session_id: str) -> tuple[ClosePlanView | None, CloseResultView]:
        return self._closer(session_id).close_session_planned(session_id)

    def _nodes_gone(self, action: Callable[[], Any]) -> tuple[Any, int | None]:
        """Run ``action``; the nodes the tree lost meanwhile, counted from the events it applied
        (the core itself counts tokens only)."""
        self._sync()
        before = self.events.stats().node_count
        result = action()
        self._sync()
        after = self.events.stats().node_count
        return result, (before - after if before is not None and after is not None and before >= after else None)

    def evict(self, num_tokens: int) -> EvictResultView:
        result, nodes = self._nodes_gone(lambda: self.sglang.evict(num_tokens))
        return dataclasses.replace(result, evicted_nodes=nodes if result.evicted_nodes is None else result.evicted_nodes)

    def flush(self) -> FlushResultView:
        result, nodes = self._nodes_gone(self.sglang.flush)
        return dataclasses.replace(result, freed_nodes=nodes if result.freed_nodes is None else result.freed_nodes)

    def release(self) -> None:
        self.core.close()
