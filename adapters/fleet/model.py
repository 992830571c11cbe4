"""The fleet's plain data: one frozen row per worker and DP rank, and what Dynamo's dump says is
cached twice. Figures a worker cannot tell are None ("unknown"), never 0."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SOURCES = ("radixtop", "sglang", "vllm", "smg", "dynamo", "none")
"""Where a row's cache figures came from: the worker's radixtop admin API, SGLang's own routes
(/v1/loads, /metrics, /server_info), vLLM's /metrics, SMG's /get_loads, Dynamo's dump, or nowhere."""


@dataclass(frozen=True)
class WorkerRow:
    """One worker and DP rank as the fleet view shows it."""

    worker: str
    """The worker as its fleet source names it: an engine URL (SMG, a fleet file), a radixtop URL,
    or Dynamo's ``instance_id``."""
    dp_rank: int | None
    radixtop_url: str | None
    """Where this worker's radixtop admin API answers (None: it has none that we know of)."""
    source: str
    """Where the figures came from (one of ``SOURCES``)."""
    reachable: bool
    why: str = ""
    """Why it is not reachable, or what is missing (empty when all is well)."""
    model: str = ""
    healthy: bool | None = None
    """The gateway's own health check (SMG); None where no gateway says."""
    capacity_tokens: int | None = None
    available_tokens: int | None = None
    evictable_tokens: int | None = None
    unevictable_tokens: int | None = None
    bytes_per_token: int | None = None
    open_sessions: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    """Counters since start: prompt tokens and those served from the cache (the hit rate)."""
    running_requests: int | None = None
    indexed_tokens: int | None = None
    """Tokens Dynamo's indexer says this worker caches (its dump's blocks x block size)."""
    by_rule: bool = False
    """``radixtop_url`` is the plugin port rule's guess (believed by the name its server gives,
    which any server can give): it gets only a token the tokens file gives that very URL."""

    @property
    def pressure(self) -> float | None:
        """Share of the pool that cannot be freed now (unevictable / capacity): SGLang's own
        token usage. None when either is unknown."""
        if self.unevictable_tokens is None or not self.capacity_tokens:
            return None
        return self.unevictable_tokens / self.capacity_tokens

    @property
    def used_share(self) -> float | None:
        """Share of the pool not available (unevictable + evictable)."""
        if self.available_tokens is None or not self.capacity_tokens:
            return None
        return 1 - self.available_tokens / self.capacity_tokens

    @property
    def hit_rate(self) -> float | None:
        """Cached / prompt tokens since start; None when unknown or nothing was asked yet."""
        if self.prompt_tokens is None or self.cached_tokens is None or self.prompt_tokens <= 0:
            return None
        return self.cached_tokens / self.prompt_tokens

    def bytes(self, tokens: int | None) -> int | None:
        return None if tokens is None or not self.bytes_per_token else tokens * self.bytes_per_token

    @property
    def key(self) -> str:
        """Stable id of the row (a table keeps its cursor on it across refreshes)."""
        return self.worker if self.dp_rank is None else f"{self.worker}@{self.dp_rank}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(key=self.key, pressure=self.pressure, used_share=self.used_share, hit_rate=self.hit_rate)
        for name in ("capacity", "available", "evictable", "unevictable"):
            d[f"{name}_bytes"] = self.bytes(getattr(self, f"{name}_tokens"))
        # the keys before 0.2, until 0.3: free was available, protected the unevictable tokens
        d["free_tokens"], d["free_bytes"] = self.available_tokens, d["available_bytes"]
        d["protected_tokens"], d["protected_bytes"] = self.unevictable_tokens, d["unevictable_bytes"]
        return d


@dataclass(frozen=True)
class DuplicatePrefix:
    """A prefix cached on more than one worker (or DP rank), from Dynamo's dump."""

    model: str
    block_hash: int
    """The prefix's last block (Dynamo's sequence hash: it names the whole prefix)."""
    blocks: int
    tokens: int
    holders: tuple[str, ...]
    """``instance_id`` or ``instance_id@dp_rank`` of each worker that caches it."""
    duplicated_tokens: int
    """Tokens beyond the first copy: (copies - 1) x tokens."""
    duplicated_bytes: int | None
    """None where the bytes per token are unknown."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["holders"] = list(self.holders)
        return d


@dataclass(frozen=True)
class Duplicates:
    """Every prefix of Dynamo's dump cached more than once. Each prefix counts its whole path, so
    prefixes that share a start overlap; the totals count each block once."""

    prefixes: tuple[DuplicatePrefix, ...]
    duplicated_tokens: int
    duplicated_bytes: int | None
    block_size: int
    bytes_per_token: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"prefixes": [p.to_dict() for p in self.prefixes], "duplicated_tokens": self.duplicated_tokens,
                "duplicated_bytes": self.duplicated_bytes, "block_size": self.block_size,
                "bytes_per_token": self.bytes_per_token}


@dataclass(frozen=True)
class FleetView:
    """One poll of the fleet: rows sorted by pressure (the most pressed first, unreachable
    last), what the source itself said, and the duplicates where Dynamo's dump gives them."""

    source: str
    """``smg URL``, ``dynamo URL`` or ``fleet FILE``."""
    rows: tuple[WorkerRow, ...]
    taken_at: float
    """Unix time of the poll."""
    elapsed_s: float
    error: str = ""
    """The fleet source itself failed (no rows then): why."""
    duplicates: Duplicates | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def reachable(self) -> int:
        return sum(1 for r in self.rows if r.reachable)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "taken_at": self.taken_at, "elapsed_s": round(self.elapsed_s, 3),
                "error": self.error, "workers": len(self.rows), "reachable": self.reachable,
                "rows": [r.to_dict() for r in self.rows],
                "duplicates": self.duplicates.to_dict() if self.duplicates else None, "notes": list(self.notes)}


def by_pressure(rows: list[WorkerRow] | tuple[WorkerRow, ...]) -> tuple[WorkerRow, ...]:
    """Reachable rows first, the most pressed (unevictable share, then used share) first; rows with
    unknown figures after them; unreachable rows last; ties by worker and rank."""
    def key(r: WorkerRow) -> tuple:
        p, u = r.pressure, r.used_share
        known = p is not None or u is not None
        return (not r.reachable, not known, -(p or 0.0), -(u or 0.0), r.worker, r.dp_rank or 0)
    return tuple(sorted(rows, key=key))
