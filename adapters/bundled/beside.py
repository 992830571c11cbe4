"""radixtop's own engine with its reads beside it (issue 27, item 3): what ``radixtop serve --beside``
runs on the engine's thread. The engine's tree is recorded (``adapters.bundled.recorder``) and
copied in radixtop's process beside it by the same mirror and the same adapter that follow SGLang's
Python core there (``adapters.sglang.beside``): one design for both. What that process asks of the
engine itself (its totals, its close, evict and flush, what the doctor reads of its running
requests) is answered here, on the engine's thread between its steps, as ``probe.CoreOps``
answers it on SGLang's scheduler thread."""

from __future__ import annotations

import dataclasses
from typing import Any

from radixtop.adapters.bundled.adapter import close_on, evict_on, flush_on, stats_of
from radixtop.adapters.bundled.doctor import refused_waiting
from radixtop.adapters.model import EvictResultView, FlushResultView, Geometry, Stats
from radixtop.gpu_backend.engine import Engine


class BundledOps:
    """The engine's side of radixtop's calls (``probe.OPS``), on its owner thread."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.scheduler = engine.scheduler
        self.name = name

    def stats(self) -> Stats:
        """The engine's totals (the node and session counts beside are the mirror's own)."""
        return stats_of(self.scheduler, self.name)

    sync = stats
    """A ``sync``'s reply: the totals as of that step."""

    def close(self, session_id: str) -> dict[str, int]:
        """Close as the engine's adapter does (``close_on``)."""
        return {"freed_tokens": int(close_on(self.engine, self.scheduler, session_id).freed_tokens)}

    def evict(self, num_tokens: int) -> EvictResultView:
        return evict_on(self.engine, self.scheduler, int(num_tokens))

    def flush(self) -> FlushResultView:
        return flush_on(self.engine, self.scheduler)

    def state(self) -> dict[str, Any]:
        """What the doctor reads of the engine: the pool, the nodes its running requests lock
        (their ids, and sessions), and as its waiting queue the requests refused for want of slots
        lately (``doctor.refused_waiting``, as the doctor in process reads them): their count and
        the oldest one's id and need."""
        s = self.scheduler
        allocator = s.pool.allocator
        stats = self.stats()
        waiting = refused_waiting(s)
        return {
            "capacity": int(allocator.size), "available": int(allocator.available_size()),
            "evictable": s.cache.evictable_size(),
            "holders": [[getattr(r.last_node, "id", None), r.session_id] for r in s.running.values()],
            "waiting": len(waiting), "head": list(waiting[0]) if waiting else None,
            "buckets": [dataclasses.asdict(b) for b in stats.buckets or ()],
        }


def hello_info(engine: Engine, name: str, demo_words: bool) -> dict[str, Any]:
    """What radixtop's process beside the engine is told first (``probe.hello``): the target, its
    pool and its tree's shape; ``tokenizer``: the demo's own words, where it talks in them; ``ops``:
    the engine tells its ops (``OP`` records: its requests, for the history beside); ``owner``:
    what answers radixtop's calls, as its errors name it; ``close_policy``: what its close does
    (the copy beside plans a close and tells the figures as the engine does)."""
    s = engine.scheduler
    geometry = Geometry.of(s.geometry)
    return {"name": name, "dp_rank": 0, "bytes_per_token": int(geometry.bytes_per_token),
            "capacity_tokens": int(s.pool.allocator.size), "tokenizer": {"demo": True} if demo_words else None,
            "tree": "radix", "page_size": int(s.cache.page_size), "sessions": True,
            "geometry": dataclasses.asdict(geometry), "ops": True, "owner": "radixtop's engine",
            "close_policy": s.cache.close_policy}
