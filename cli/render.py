"""Rich renderings shared by commands: sizes as people read them, summaries, tables."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from radixtop.adapters.text import human_bytes


def print_replay_summary(doc: dict[str, Any], bytes_per_token: int, console: Console | None = None) -> None:
    console = console or Console()
    results = doc["results"]
    counts = Counter(r["op"] for r in results)
    hits = [r["hit"] for r in results if "hit" in r]
    stats = doc["stats"]
    table = Table(title="replay", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("ops", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
    table.add_row("cache hit tokens", f"{sum(hits)}")
    table.add_row("closes freed", f"{sum(r.get('freed_nodes', 0) for r in results)} nodes, "
                  f"{sum(r.get('freed_tokens', 0) for r in results)} tokens")
    table.add_row("evicted", f"{sum(r.get('evicted_tokens', 0) for r in results)} tokens")
    table.add_row("tree", f"{len(doc['tree'])} nodes, {stats['total_size']} tokens "
                  f"({human_bytes(stats['total_size'] * bytes_per_token)})")
    table.add_row("evictable / protected", f"{stats['evictable_size']} / {stats['protected_size']} tokens")
    table.add_row("available", f"{stats['available_size']} tokens")
    table.add_row("time applying ops", f"{doc['timing']['ops_s'] * 1000:.1f} ms")
    console.print(table)
