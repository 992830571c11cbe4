"""Replays that keep figures per session (hit rate, KV lost to eviction, KV a close freed), and one
trace run under several cache settings (eviction policy, capacity, close policy) side by side."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from radixtop.gpu_backend.kv_geometry import KVGeometry
from radixtop.gpu_backend.scheduler import OutOfSlotsError, Scheduler, UnknownRequestError
from radixtop.gpu_backend.traces.ops import Op, TraceError

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_capacity(text: str) -> int:
    """A pool size in tokens: ``65536``, ``64k`` (x1024), ``2m`` (x1024**2)."""
    raw = text.strip().lower()
    unit = raw[-1] if raw and raw[-1] in _UNITS else ""
    number = raw[: len(raw) - len(unit)]
    if not number.isdigit() or int(number) < 1:
        raise ValueError(f"capacity {text!r} is not a positive number of tokens (e.g. 65536, 64k, 2m)")
    return int(number) * _UNITS[unit]


def split_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ValueError(f"{what} {text!r} has an empty item; give a comma-separated list")
    return items


@dataclass
class SessionReplayFigures:
    """One session's requests as the cache served them."""

    requests: int = 0
    refused: int = 0
    """Requests that could not get their slots even after evicting everything evictable."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reuse_tokens: int = 0
    """Prompt tokens its own previous request had (a converted trace's ``reuse``)."""
    lost_tokens: int = 0
    """Of those, tokens the cache no longer held: recomputed because of eviction (or a close)."""
    close_freed_tokens: int = 0
    """KV its close freed: what it alone held at its end (0 under the deref close policy)."""

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass
class ReplayFigures:
    """One replay's totals and its sessions' figures."""

    settings: dict[str, Any]
    ops: int = 0
    requests: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    lost_tokens: int = 0
    output_tokens: int = 0
    evicted_tokens: int = 0
    close_freed_tokens: int = 0
    peak_used_tokens: int = 0
    """Most pool slots in use at once (tree plus running requests' own)."""
    bytes_per_token: int = 0
    ops_s: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    sessions: dict[str, SessionReplayFigures] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def as_dict(self) -> dict[str, Any]:
        doc = {k: v for k, v in asdict(self).items() if k != "sessions"}
        doc["hit_rate"] = self.hit_rate
        doc["peak_used_bytes"] = self.peak_used_tokens * self.bytes_per_token
        doc["sessions"] = {
            sid: {**asdict(s), "hit_rate": s.hit_rate, "close_freed_bytes": s.close_freed_tokens * self.bytes_per_token}
            for sid, s in self.sessions.items()
        }
        return doc


class FiguresReplayer:
    """Applies ops to a Scheduler keeping ReplayFigures; a request that cannot get its slots is
    refused (counted, its finish skipped) instead of stopping the replay."""

    def __init__(self, scheduler: Scheduler, settings: dict[str, Any], keep_results: bool = False):
        self.scheduler = scheduler
        self.figures = ReplayFigures(settings, bytes_per_token=scheduler.geometry.bytes_per_token)
        self.results: list[dict[str, Any]] | None = [] if keep_results else None
        self._session_of: dict[str, str | None] = {}
        self._refused: set[str] = set()
        self._uncached: set[str] = set()
        """Sessions whose previous request was refused: it left nothing to reuse, nothing to lose."""
        self._auto_id = 0

    def _session(self, sid: str | None) -> SessionReplayFigures | None:
        if sid is None:
            return None
        figures = self.figures.sessions.get(sid)
        if figures is None:
            figures = self.figures.sessions[sid] = SessionReplayFigures()
        return figures

    def _begin(self, rid: str, f: dict[str, Any]) -> dict[str, Any]:
        s, fig, session = self.scheduler, self.figures, self._session(f.get("session"))
        fig.requests += 1
        if session:
            session.requests += 1
        try:
            hit = s.begin(rid, f["input"], f.get("session"))
        except OutOfSlotsError:
            fig.refused += 1
            if session:
                session.refused += 1
            self._refused.add(rid)
            if f.get("session") is not None:
                self._uncached.add(f["session"])
            return {"hit": 0, "refused": True}
        reuse = 0 if f.get("session") in self._uncached else f.get("reuse", 0)
        self._uncached.discard(f.get("session"))
        lost = max(0, reuse - hit)
        fig.prompt_tokens += len(f["input"])
        fig.cached_tokens += hit
        fig.lost_tokens += lost
        if session:
            session.prompt_tokens += len(f["input"])
            session.cached_tokens += hit
            session.reuse_tokens += reuse
            session.lost_tokens += lost
        self._session_of[rid] = f.get("session")
        return {"hit": hit}

    def _finish(self, rid: str, output: list[int]) -> dict[str, Any]:
        if rid in self._refused:  # refused at its begin
            self._refused.discard(rid)
            return {"refused": True}
        s = self.scheduler
        sid = self._session_of.pop(rid, None)
        try:
            s.finish(rid, output)
        except OutOfSlotsError:  # retracted, as the engine does: its slots go back
            s.abort(rid)
            self.figures.refused += 1
            session = self._session(sid)
            if session:
                session.refused += 1
                self._uncached.add(sid)
            return {"refused": True}
        self.figures.output_tokens += len(output)
        return {}

    def apply(self, op: Op) -> dict[str, Any]:
        s, f, fig = self.scheduler, op.fields, self.figures
        start = time.perf_counter()
        evicted = s.evicted_tokens
        try:
            if op.op == "begin":
                result = self._begin(f["id"], f)
            elif op.op == "finish":
                result = self._finish(f["id"], f["output"])
            elif op.op == "request":
                self._auto_id += 1
                rid = f"\x00request-{self._auto_id}"
                result = self._begin(rid, f)
                if not result.get("refused"):
                    result.update(self._finish(rid, f["output"]))
            elif op.op == "abort":
                if f["id"] in self._refused:
                    self._refused.discard(f["id"])
                else:
                    self._session_of.pop(f["id"], None)
                    s.abort(f["id"])
                result = {}
            elif op.op == "close":
                closed = s.close_session(f["session"])
                fig.close_freed_tokens += closed.freed_tokens
                session = self._session(f["session"])
                session.close_freed_tokens += closed.freed_tokens
                result = {"freed_nodes": closed.freed_nodes, "freed_tokens": closed.freed_tokens}
            elif op.op == "register":
                s.register_session(f["session"])
                result = {}
            elif op.op == "evict":
                result = {"evicted_tokens": s.evict_asked(f["tokens"], "the trace").num_tokens_evicted}
            else:
                result = {"evicted_tokens": s.flush().num_tokens_evicted}
        except (UnknownRequestError, ValueError) as exc:
            raise TraceError(op.line_no, str(exc)) from None
        fig.ops_s += time.perf_counter() - start
        fig.ops += 1
        fig.evicted_tokens += s.evicted_tokens - evicted
        allocator = s.pool.allocator
        fig.peak_used_tokens = max(fig.peak_used_tokens, allocator.size - allocator.available_size())
        result = {"op": op.op, **result}
        if self.results is not None:
            self.results.append(result)
        return result

    def finish_figures(self) -> ReplayFigures:
        self.figures.stats = self.scheduler.stats().as_dict()
        return self.figures


def replay_figures(ops: Iterable[Op], geometry: KVGeometry, capacity: int, eviction_policy: str = "lru",
                   close_policy: str = "free", keep_results: bool = False,
                   clock: Callable[[], float] | None = None) -> tuple[ReplayFigures, list[dict[str, Any]] | None]:
    """Replay ``ops`` on a fresh cache (device meta: geometry only); its figures and, with
    ``keep_results``, one result per op. ``clock`` defaults to a counter of cache reads, so
    replays are reproducible (eviction order depends only on the ops)."""
    if clock is None:
        counter = itertools.count(1)
        clock = lambda: float(next(counter))  # noqa: E731
    scheduler = Scheduler(geometry, capacity, device="meta", eviction_policy=eviction_policy,
                          close_policy=close_policy, clock=clock)
    settings = {"eviction_policy": eviction_policy, "capacity": capacity, "close_policy": close_policy,
                "page_size": geometry.page_size, "model": geometry.name}
    replayer = FiguresReplayer(scheduler, settings, keep_results)
    for op in ops:
        replayer.apply(op)
    return replayer.finish_figures(), replayer.results


def compare(make_ops: Callable[[], Iterable[Op]], geometry: KVGeometry, capacities: list[int],
            eviction_policies: list[str], close_policies: list[str]) -> list[ReplayFigures]:
    """The same ops (``make_ops`` gives a fresh iterator each time) under every combination."""
    runs = []
    for capacity, eviction_policy, close_policy in itertools.product(capacities, eviction_policies, close_policies):
        figures, _ = replay_figures(make_ops(), geometry, capacity, eviction_policy, close_policy)
        runs.append(figures)
    return runs
