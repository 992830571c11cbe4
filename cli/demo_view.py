"""A live text view of the embedded demo engine (rich), until the dashboard exists."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from radixtop.adapters.text import human_bytes


def _snapshot(scheduler: Any) -> dict[str, Any]:
    """Runs on the engine thread: a small consistent picture of the cache."""
    cache = scheduler.cache
    stats = scheduler.stats()
    bpt = scheduler.geometry.bytes_per_token
    sessions = []
    for sid in cache.session_ids():
        plan = cache.plan_close(sid)
        nodes = cache.session_nodes(sid)
        sessions.append((sid, len(nodes), plan.freed_tokens * bpt))
    sessions.sort(key=lambda s: -s[2])
    top = sorted(cache.root_node.children.values(), key=lambda n: -len(n.key))[:8]
    return {
        "stats": stats,
        "bpt": bpt,
        "nodes": cache.node_count(),
        "open": len(sessions),
        "closed": len(cache.closed_session_ids()),
        "sessions": sessions[:10],
        "top": [(n.id, len(n.key), list(n.key[:6]), n.lock_ref, len(n.children)) for n in top],
        "hit": (scheduler.cached_tokens, scheduler.prompt_tokens),
    }


def _bar(parts: list[tuple[int, str]], total: int, width: int = 60) -> Text:
    text = Text()
    used = 0
    for value, style in parts:
        cells = round(width * value / total) if total else 0
        cells = min(cells, width - used)
        text.append("█" * cells, style=style)
        used += cells
    text.append("░" * (width - used), style="grey37")
    return text


def render(snap: dict[str, Any], model: str) -> Group:
    s, bpt = snap["stats"], snap["bpt"]
    cached, prompt = snap["hit"]
    head = Text.assemble(
        (f"radixtop demo · {model}\n", "bold"),
        f"{snap['nodes']} nodes · {snap['open']} sessions holding KV · {snap['closed']} closed · ",
        f"cache hit rate {cached / prompt:.1%}" if prompt else "cache hit rate -",
    )
    bar = _bar([(s.protected_size + s.request_size, "red"), (s.evictable_size, "yellow")], s.capacity)
    legend = Text.assemble(
        ("protected ", "red"), f"{s.protected_size + s.request_size} tok ",
        ("evictable ", "yellow"), f"{s.evictable_size} tok ",
        ("free ", "grey62"), f"{s.available_size} tok  of {s.capacity} tok ({human_bytes(s.capacity * bpt)})",
    )
    sessions = Table(title="sessions by bytes a close frees now", expand=True)
    for col in ("session", "tagged nodes", "close frees"):
        sessions.add_column(col, justify="right" if col != "session" else "left")
    for sid, n, freed in snap["sessions"]:
        sessions.add_row(sid, str(n), human_bytes(freed))
    tree = Table(title="largest top-level nodes", expand=True)
    for col in ("id", "tokens", "first tokens", "lock_ref", "children"):
        tree.add_column(col)
    for node_id, tokens, first, lock_ref, children in snap["top"]:
        tree.add_row(str(node_id), str(tokens), " ".join(map(str, first)) + " …", str(lock_ref), str(children))
    return Group(Panel(Group(head, bar, legend)), sessions, tree)


def pick_device(device: str, pool_bytes: int) -> str:
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if pool_bytes <= 1 << 30 else "meta"


def run_demo(geometry, capacity: int, workload, device: str, refresh: float, duration: float,
             record_to=None, prepare=None) -> None:
    """The live view until Ctrl-C or ``duration``; ``prepare(scheduler)``, when given, loads a
    trace and returns the workload (a real-time playback, or None when it was applied at once)."""
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.scheduler import Scheduler
    from radixtop.gpu_backend.traces.playback import TracePlayback

    device = pick_device(device, capacity * geometry.bytes_per_token)
    scheduler = Scheduler(geometry, capacity, device=device)
    if prepare is not None:
        workload = prepare(scheduler)
    engine = Engine(scheduler, workload, step_interval=0.01, record_to=record_to).start()
    base = f"{geometry.name} on {device}" + (" (geometry only)" if device == "meta" else "")

    def title() -> str:
        if not isinstance(workload, TracePlayback):
            return base
        played = f"trace at {workload.trace_time():,.0f} s (x{workload.speed:g})"
        return f"{base} · {played}" + (" · trace done" if workload.done else "")

    deadline = time.monotonic() + duration if duration > 0 else None
    try:
        with Live(render(engine.call(_snapshot), title()), refresh_per_second=4) as live:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(refresh)
                live.update(render(engine.call(_snapshot), title()))
    except KeyboardInterrupt:
        pass
    finally:
        engine.stop()
