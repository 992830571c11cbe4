"""`radixtop demo`'s live text view (rich, no Textual) of the embedded engine, read through the contract.

Every refresh is one ``read_many`` on a ``BundledAdapter``: the engine's owner thread gives it a
slice between two of its steps (the sessions' figures, attribution, in slices of their own), so
the view never holds the engine longer than the owner-thread rules allow.
"""

from __future__ import annotations

import time
from typing import IO, Any

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.errors import AdapterError
from radixtop.adapters.model import ROOT_ID, ChildrenPage, SessionsPage, Stats
from radixtop.adapters.text import count, figures_note, human_bytes, inert, known, pool_parts

TOP_SESSIONS = 10
"""Sessions shown: those whose close frees the most now."""
TOP_NODES = 8
"""Top-level nodes shown: the longest."""
FIRST_SHOWN = 6
"""Token ids shown of each top-level node."""


def read_view(adapter: CacheAdapter) -> tuple[Stats, SessionsPage, ChildrenPage]:
    """One refresh's figures in one ``read_many``; an error of any of its reads raises."""
    results = adapter.read_many([
        ("stats", ()),
        ("sessions", ("exclusive_bytes", 0, TOP_SESSIONS)),
        ("children", (ROOT_ID, 0, TOP_NODES, "tokens")),
    ])
    for result in results:
        if isinstance(result, AdapterError):
            raise result
    stats, sessions, top = results
    return stats, sessions, top


STYLES = {"available": "grey62", "evictable": "yellow", "protected": "red", "session_held": "magenta",
          "uncached": "red3"}
"""A state's colour in the bar and its legend (unnamed ones: red)."""


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


def render(view: tuple[Stats, SessionsPage, ChildrenPage], title: str) -> Group:
    """The pool as a bar, the sessions whose close frees the most, the longest top-level nodes."""
    st, page, top = view
    bpt = st.bytes_per_token
    head = Text.assemble(
        (f"radixtop demo · {title}\n", "bold"),
        f"{count(st.node_count, 'nodes')} · {count(st.open_sessions, 'sessions open')} · "
        f"{count(st.closed_sessions, 'closed')} · ",
        f"cache hit rate {st.cached_tokens / st.prompt_tokens:.1%}" if st.prompt_tokens else "cache hit rate -",
    )
    parts = pool_parts(st)  # SGLang's words, as the dashboard's header says them
    bar = _bar([(tokens or 0, STYLES.get(name, "red")) for name, tokens in parts[1:]], st.capacity_tokens)
    legend = Text()
    for name, tokens in parts:
        legend.append(f"{name} ", style=STYLES.get(name, "red"))
        legend.append(f"{known(tokens)} tok ")
    legend.append(f" of {st.capacity_tokens} tok ({human_bytes(st.capacity_tokens * bpt)})")
    note = figures_note(page.figures_age_s, page.refreshing, page.figures_current)
    sessions = Table(title=f"sessions by bytes a close frees now ({note})", expand=True)
    for col in ("session", "tagged nodes", "close frees"):
        sessions.add_column(col, justify="right" if col != "session" else "left")
    for s in page.sessions:
        sessions.add_row(inert(s.id), str(s.tagged_nodes), human_bytes(s.exclusive_bytes))
    tree = Table(title="largest top-level nodes", expand=True)
    for col in ("id", "tokens", "first tokens", "lock_ref", "children"):
        tree.add_column(col)
    for n in top.children:
        tree.add_row(str(n.id), str(n.tokens), " ".join(map(str, n.first_tokens[:FIRST_SHOWN])) + " …",
                     str(n.lock_ref), str(n.num_children))
    return Group(Panel(Group(head, bar, legend)), sessions, tree)


def run_demo(geometry: Any, capacity: int, workload: Any, device: str, refresh: float, duration: float,
             record_to: IO[str] | None = None, prepare: Any = None) -> None:
    """The live view until Ctrl-C or ``duration``; ``prepare(scheduler)``, when given, loads a
    trace before the engine starts and returns the workload (a real-time playback, or None when
    it was applied at once)."""
    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.kv_pool import pick_device
    from radixtop.gpu_backend.scheduler import Scheduler
    from radixtop.gpu_backend.traces.playback import TracePlayback

    device = pick_device(device, capacity * geometry.bytes_per_token)
    scheduler = Scheduler(geometry, capacity, device=device)
    if prepare is not None:
        workload = prepare(scheduler)
    engine = Engine(scheduler, workload, step_interval=0.01, record_to=record_to).start()
    adapter = BundledAdapter(engine, name="radixtop demo")
    base = f"{geometry.name} on {device}" + (" (geometry only)" if device == "meta" else "")

    def title() -> str:
        if not isinstance(workload, TracePlayback):
            return base
        played = f"trace at {workload.trace_time():,.0f} s (x{workload.speed:g})"
        return f"{base} · {played}" + (" · trace done" if workload.done else "")

    deadline = time.monotonic() + duration if duration > 0 else None
    try:
        with Live(render(read_view(adapter), title()), refresh_per_second=4) as live:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(refresh)
                live.update(render(read_view(adapter), title()))
    except KeyboardInterrupt:
        pass
    finally:
        adapter.release()
        engine.stop()
