"""The fleet's rows as text cells, the same in the commands' table and the dashboard's view.
An unknown figure reads "?" (never 0); sizes in bytes where the bytes per token are known."""

from __future__ import annotations

from radixtop.adapters.fleet.model import FleetView, WorkerRow
from radixtop.adapters.text import human_bytes

COLUMNS = ("worker", "dp", "from", "capacity", "available", "evictable", "unevictable", "pressure", "sessions",
           "hit", "reqs", "state")
"""Column titles; ``pressure`` is unevictable / capacity (what no eviction can free now)."""
UNKNOWN = "?"


def size(row: WorkerRow, tokens: int | None) -> str:
    if tokens is None:
        return UNKNOWN
    return human_bytes(tokens * row.bytes_per_token) if row.bytes_per_token else f"{tokens:,} tok"


def share(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0%}"


def state(row: WorkerRow) -> str:
    """``ok``, ``ok*`` (reachable, with a note: see ``reasons``) or ``down``."""
    if not row.reachable:
        return "down"
    return "ok*" if row.why else "ok"


OPENS = ("radixtop", "sglang")
"""Rows whose own dashboard opens: from the worker's radixtop, or SGLang's own routes (totals only)."""
NO_VLLM_TREE = ("vLLM's own routes serve no tree: its tree needs a radixtop over its KV events (radixtop serve "
                "--vllm-events tcp://HOST:PORT --vllm-url URL), given as radixtop=URL on its fleet line")


def why_closed(row: WorkerRow) -> str | None:
    """Why ``row`` has no dashboard to open (None: it has one)."""
    if row.source in OPENS:
        return None
    if row.source == "vllm":
        return "; ".join(w for w in (NO_VLLM_TREE, row.why) if w)
    return row.why or "no radixtop and no engine figures"


def reasons(view: FleetView) -> list[str]:
    """``worker[@dp]: why`` for every row with something to say (down first)."""
    return [f"{r.key}: {r.why}" for r in sorted(view.rows, key=lambda r: r.reachable) if r.why]


def cells(row: WorkerRow) -> tuple[str, ...]:
    def known(v: int | None) -> str:
        return UNKNOWN if v is None else f"{v:,}"

    capacity = size(row, row.capacity_tokens)
    if row.capacity_tokens is None and row.indexed_tokens is not None:
        capacity = f"{UNKNOWN} ({row.indexed_tokens:,} indexed)"
    return (row.worker, "-" if row.dp_rank is None else str(row.dp_rank), row.source, capacity,
            size(row, row.available_tokens), size(row, row.evictable_tokens), size(row, row.unevictable_tokens),
            share(row.pressure), known(row.open_sessions), share(row.hit_rate), known(row.running_requests),
            state(row))


def summary(view: FleetView) -> str:
    if view.error:
        return f"{view.source}: {view.error}"
    text = (f"{view.source} · {len(view.rows)} worker rows · {view.reachable} reachable · "
            f"polled in {view.elapsed_s:.2f} s")
    d = view.duplicates
    if d is not None:
        dup = human_bytes(d.duplicated_bytes) if d.duplicated_bytes is not None else f"{d.duplicated_tokens:,} tokens"
        text += f" · cached twice or more: {dup} in {len(d.prefixes)} prefixes"
    return text


def duplicate_cells(view: FleetView) -> list[tuple[str, ...]]:
    """(prefix, tokens, copies on, duplicated) for each duplicated prefix."""
    d = view.duplicates
    if d is None:
        return []
    out = []
    for p in d.prefixes:
        dup = human_bytes(p.duplicated_bytes) if p.duplicated_bytes is not None else f"{p.duplicated_tokens:,} tok"
        out.append((f"{p.model} #{p.block_hash:016x}", f"{p.tokens:,}", ", ".join(p.holders), dup))
    return out
