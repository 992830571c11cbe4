"""Scheduler: drives the cache the way SGLang's scheduler does (match, lock, evict, alloc, finish)."""

from __future__ import annotations

import functools
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixtop.gpu_backend.history import (
    ABORT,
    BEGIN,
    CLOSE,
    EVICT,
    EVICT_ACTION,
    EVICTED,
    FINISH,
    FLUSH,
    FLUSHED,
    REGISTER,
    caused,
)
from radixtop.gpu_backend.kv_geometry import KVGeometry
from radixtop.gpu_backend.kv_pool import KVPool
from radixtop.gpu_backend.ledger import SessionOrders
from radixtop.gpu_backend.radix_cache import EvictResult, RadixCache, Req
from radixtop.gpu_backend.sessions import CloseResult


class OutOfSlotsError(RuntimeError):
    """The pool cannot hold a request even after evicting everything evictable."""


class UnknownRequestError(KeyError):
    """An operation names a request that was never begun, or already finished."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class CacheStats:
    """Token counts of the tree and the pool (SGLang's names)."""

    total_size: int
    evictable_size: int
    protected_size: int
    available_size: int
    # Slots held by running requests beyond their matched prefix (not in the tree yet).
    request_size: int
    capacity: int

    def as_dict(self) -> dict[str, int]:
        return {
            "total_size": self.total_size,
            "evictable_size": self.evictable_size,
            "protected_size": self.protected_size,
            "available_size": self.available_size,
        }



def _one_instant(op: Callable[..., Any]) -> Callable[..., Any]:
    """An engine op whose changes, marks and request ops the cache's history stamps at one
    instant (``CacheHistory.instant``), however long it runs."""
    @functools.wraps(op)
    def held(self: Scheduler, *a: Any, **k: Any) -> Any:
        history = self.cache.history
        if history is None:
            return op(self, *a, **k)
        with history.instant:
            return op(self, *a, **k)

    return held


class Scheduler:
    """Owns a pool and a cache; begins and finishes requests on them. Not thread-safe: one owner."""

    def __init__(
        self,
        geometry: KVGeometry,
        capacity: int,
        device: str | None = None,
        eviction_policy: str = "lru",
        close_policy: str = "free",
        clock=None,
        write_kv: bool = True,
        ledger: bool = True,
        history: bool = True,
    ):
        if capacity < geometry.page_size or capacity % geometry.page_size:
            raise ValueError(f"capacity {capacity} must be a positive multiple of page size {geometry.page_size}")
        self.geometry = geometry
        self.pool = KVPool(geometry, capacity, device)
        self.write_kv = write_kv and not self.pool.kv.is_simulated
        kwargs = {"clock": clock} if clock is not None else {}
        self.cache = RadixCache(
            self.pool.allocator,
            page_size=geometry.page_size,
            eviction_policy=eviction_policy,
            close_policy=close_policy,
            bytes_per_token=geometry.bytes_per_token,
            ledger=ledger,
            history=history,
            **kwargs,
        )
        self.told: Callable[..., None] | None = None
        """Who is told each op of the engine (``CacheHistory.did``'s arguments): the cache's history
        (a session's hits over time, what a recording replays), or radixtop's process beside the
        engine through the change records (``BundledRecorder.op``); None: nobody."""
        if self.cache.history is not None:
            self.cache.history.tells_requests()  # (``begin``: a session's hits over time)
            self.told = self.cache.history.did
        self.running: dict[str, Req] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.evicted_tokens = 0
        self.closes = 0
        self.freed_by_close_tokens = 0
        # Last time (time.monotonic) each session began, finished, registered or closed a request;
        # pruned of sessions that hold nothing, run nothing and are not tombstoned.
        self.session_activity: dict[str, float] = {}
        # len(open_session_ids()), kept as sessions appear, close, reopen and lose their
        # tombstone, so that stats() never walks every session a long-lived server has seen.
        self.open_session_count = 0
        # Requests refused for want of slots: (time.monotonic, rid, tokens it needed beyond its
        # cached prefix), newest last. There is no waiting queue here (a refused turn is retried
        # as a new request): the leak doctor reads recent refusals as the requests that wait.
        self.refused: deque[tuple[float, str, int]] = deque(maxlen=64)
        self.orders: SessionOrders | None = None
        """The sessions in order, as of every read (None without the cache's ledger)."""
        if self.cache.ledger is not None:
            cache = self.cache
            self.orders = SessionOrders(
                cache.ledger, geometry.bytes_per_token,
                known=lambda sid: sid in self.session_activity, is_closed=cache.is_session_closed,
                seen_at=lambda sid: self.session_activity.get(sid),
                leaves_of=lambda sid: cache._session_leaves.get(sid, ()),
                everyone=lambda: itertools.chain(self.session_activity, cache._closed_session_ids,
                                                 cache.ledger.tags))

    # ----- requests -----

    @_one_instant
    def begin(self, rid: str, input_ids: list[int], session_id: str | None = None, priority: int = 0) -> int:
        """Match the input, lock the matched path, allocate the rest; returns the cache hit length."""
        if rid in self.running:
            raise ValueError(f"request {rid!r} is already running")
        match = self.cache.match_prefix(input_ids)
        req = Req(rid, list(input_ids), session_id, priority=priority)
        req.last_node = match.last_node
        req.cache_protected_len = match.prefix_len
        self.cache.inc_lock_ref(match.last_node)
        try:
            own = self._alloc(len(input_ids) - match.prefix_len)
        except OutOfSlotsError:
            self.cache.dec_lock_ref(match.last_node)
            self.refused.append((time.monotonic(), rid, len(input_ids) - match.prefix_len))
            raise
        req.slots = np.concatenate([match.device_indices, own]) if len(own) else match.device_indices
        self._write(req.slots[match.prefix_len : len(input_ids)], input_ids[match.prefix_len :])
        self.running[rid] = req
        self._touch_session(session_id)
        self.prompt_tokens += len(input_ids)
        self.cached_tokens += match.prefix_len
        if self.told is not None:
            self.told(BEGIN, session_id, rid, req.input_ids, len(input_ids), match.prefix_len)  # (its own list)
        return match.prefix_len

    @_one_instant
    def finish(self, rid: str, output_ids: list[int]) -> None:
        """Allocate slots for the output, then insert, free duplicates, tag the session, unlock."""
        req = self.running.get(rid)
        if req is None:
            raise UnknownRequestError(f"request {rid!r} is not running")
        req.output_ids = list(output_ids)
        total = len(req.input_ids) + len(output_ids)
        missing = total - len(req.slots)
        if missing > 0:
            more = self._alloc(missing)
            start = len(req.slots)
            req.slots = np.concatenate([req.slots, more])
            self._write(req.slots[start:total], (req.input_ids + req.output_ids)[start:total])
        del self.running[rid]
        self.cache.cache_finished_req(req)
        self._touch_session(req.session_id)
        if self.told is not None:
            self.told(FINISH, req.session_id, rid, req.output_ids)

    @_one_instant
    def abort(self, rid: str) -> None:
        """Drop a running request without caching it: free its own slots and unlock its path,
        SGLang's retract path (``cache_finished_req(req, is_insert=False)``)."""
        req = self.running.pop(rid, None)
        if req is None:
            raise UnknownRequestError(f"request {rid!r} is not running")
        req.output_ids = []  # outputs get slots only at finish: the input is all it holds
        self.cache.cache_finished_req(req, is_insert=False)
        if self.told is not None:
            self.told(ABORT, req.session_id, rid)

    @_one_instant
    def request(self, rid: str, input_ids: list[int], output_ids: list[int], session_id: str | None = None) -> int:
        hit = self.begin(rid, input_ids, session_id)
        self.finish(rid, output_ids)
        return hit

    def fits(self, num_tokens: int) -> bool:
        """Whether a request of ``num_tokens`` could get its slots in the empty pool (in whole
        pages): one that cannot will never begin, however much is evicted."""
        page = self.geometry.page_size
        return -(-num_tokens // page) * page <= self.pool.allocator.size

    # ----- admin -----

    @_one_instant
    def close_session(self, session_id: str) -> CloseResult:
        closed = self.cache._closed_session_ids
        was_closed = session_id in closed
        # The oldest tombstones that this close may push out (those sessions count as open again).
        drop = 0 if was_closed else max(0, len(closed) + 1 - self.cache.closed_session_limit)
        oldest = list(itertools.islice(closed, drop))
        try:
            result = self.cache.release_radix_session(session_id)
        finally:
            activity = self.session_activity
            if not was_closed and session_id in closed and session_id in activity:
                self.open_session_count -= 1
            self.open_session_count += sum(1 for sid in oldest if sid not in closed and sid in activity)
        self.closes += 1
        self.freed_by_close_tokens += result.freed_tokens
        self._touch_session(session_id)
        if self.told is not None:
            self.told(CLOSE, session_id)
        if self.orders is not None:
            for sid in oldest:  # open again, or no longer listed
                self.orders.dirty(sid)
        return result

    @_one_instant
    def register_session(self, session_id: str) -> None:
        was_closed = self.cache.is_session_closed(session_id)
        self.cache.register_session(session_id)
        if was_closed and session_id in self.session_activity:
            self.open_session_count += 1  # reopened
        self._touch_session(session_id)
        if self.told is not None:
            self.told(REGISTER, session_id)

    @_one_instant
    def flush(self) -> EvictResult:
        """Free everything that is not locked (the engine never stops, so unlike SGLang's
        flush_cache this does not wait for an idle server: running requests keep their paths)."""
        with self._cause(FLUSHED):
            result = self.evict(self.cache.evictable_size())
        if self.told is not None:
            self.told(FLUSH)
        return result

    @_one_instant
    def evict_asked(self, num_tokens: int, who: str) -> EvictResult:
        """An evict someone asked for (``who``: an operator through the admin API, a trace's op),
        not the pool's need: so the cache's history says."""
        with self._cause(EVICT_ACTION, who=who):
            result = self.evict(num_tokens)
        if self.told is not None:
            self.told(EVICT, asked_tokens=num_tokens)
        return result

    def _cause(self, kind: str, **detail: Any) -> Any:
        return caused(self.cache.history, kind, **detail)

    def open_session_ids(self) -> list[str]:
        """Sessions that hold KV, have a request running, or were registered and not closed."""
        cache = self.cache
        return [sid for sid in self.session_activity if not cache.is_session_closed(sid)]

    def _touch_session(self, session_id: str | None) -> None:
        if session_id is None:
            return
        activity = self.session_activity
        if activity.pop(session_id, None) is None and not self.cache.is_session_closed(session_id):
            self.open_session_count += 1  # re-insert: most recent last
        activity[session_id] = time.monotonic()
        if self.orders is not None:
            self.orders.dirty(session_id)
        if len(activity) > 2 * (len(self.cache._session_leaves) + len(self.cache._closed_session_ids)) + 1024:
            self._prune_sessions()

    def _prune_sessions(self) -> None:
        """Forget sessions that hold nothing, run nothing and are past their tombstone."""
        cache = self.cache
        running = {r.session_id for r in self.running.values()}
        before = self.session_activity
        self.session_activity = {
            sid: t for sid, t in before.items()
            if sid in cache._session_leaves or sid in running or cache.is_session_closed(sid)
        }
        if self.orders is not None:
            for sid in before.keys() - self.session_activity.keys():
                self.orders.dirty(sid)
        self.open_session_count = sum(1 for sid in self.session_activity if not cache.is_session_closed(sid))

    @_one_instant
    def evict(self, num_tokens: int) -> EvictResult:
        result = self.cache.evict(num_tokens)
        self.evicted_tokens += result.num_tokens_evicted
        return result

    def stats(self) -> CacheStats:
        cache = self.cache
        available = self.pool.allocator.available_size()
        capacity = self.pool.allocator.size
        return CacheStats(
            total_size=cache.total_size(),
            evictable_size=cache.evictable_size(),
            protected_size=cache.protected_size(),
            available_size=available,
            request_size=capacity - available - cache.total_size(),
            capacity=capacity,
        )

    def uncached_size(self) -> int:
        """Slots the running requests own beyond their cached prefix, counted from the requests
        themselves (SGLang's ``kv_private_tokens``), not derived from the other figures: so the
        pool's buckets (available + evictable + protected + this == capacity) can fail to add up, and
        a slot nobody owns shows."""
        return sum(len(req.slots) - req.cache_protected_len for req in self.running.values())

    # ----- internal -----

    def _alloc(self, num_tokens: int) -> np.ndarray:
        """Slots for ``num_tokens`` (rounded up to whole pages), evicting first when the pool is
        short: SGLang's scheduler evicts the whole need when fewer slots are free than it needs."""
        page = self.geometry.page_size
        need = -(-num_tokens // page) * page
        if need == 0:
            return np.empty(0, dtype=np.int64)
        allocator = self.pool.allocator
        if allocator.available_size() < need:
            cache = self.cache
            with self._cause(EVICTED, pool=(cache.protected_size(), allocator.size)):
                self.evict(need)
        slots = allocator.alloc(need)
        if slots is None:
            raise OutOfSlotsError(
                f"out of KV slots: need {need}, {allocator.available_size()} free after evicting; "
                f"{self.cache.protected_size()} tokens are locked by running requests"
            )
        return slots

    def _write(self, slots: np.ndarray, token_ids: list[int]) -> None:
        if self.write_kv and len(token_ids):
            self.pool.write_tokens(slots[: len(token_ids)], token_ids)
