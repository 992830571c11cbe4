"""What `radixtop replay` runs and prints: a trace's summary, a public trace (--format), several settings (--compare)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from radixtop.adapters.text import human_bytes, inert
from radixtop.cli.render import plain_console


def load_ops(trace: Path, fmt: str, scale: int):
    """(info, make_ops): what the trace is, and a function giving a fresh iterator of its ops
    (each call replays the conversion, so several settings see identical ops)."""
    from radixtop.gpu_backend.traces.formats import load_trace, scaled_block, timed_ops
    from radixtop.gpu_backend.traces.ops import read_lines, read_trace

    if fmt == "radixtop":
        if scale != 1:
            raise ValueError("--scale goes with --format mooncake or kv-cache-tester (a radixtop trace has its tokens)")
        if str(trace) == "-":
            ops = list(read_trace(read_lines(sys.stdin.buffer)))
        else:
            with trace.open("rb") as stream:
                ops = list(read_trace(read_lines(stream)))
        return {"format": fmt, "ops": len(ops)}, lambda: iter(ops)
    if str(trace) == "-":
        raise ValueError(f"--format {fmt} reads a file or directory, not stdin")
    if fmt == "recording":
        if scale != 1:
            raise ValueError("--scale goes with --format mooncake or kv-cache-tester (a recording has its tokens)")
        from radixtop.cli.recording import read_recording, recorded_traffic

        traffic = recorded_traffic(read_recording(trace))
        served = {f.name: getattr(traffic, f.name) for f in dataclasses.fields(traffic) if f.name != "ops"}
        served["hit_rate"] = traffic.hit_rate
        return {"format": fmt, "ops": len(traffic.ops), "as_served": served}, lambda: iter(traffic.ops)
    parsed = load_trace(trace, fmt)
    block = scaled_block(parsed.block_size, scale)
    info = {"format": fmt, "requests": len(parsed.requests), "sessions": parsed.sessions,
            "duration_s": parsed.duration, "block_size": parsed.block_size, "scale": scale,
            "block_tokens": block}
    return info, lambda: (timed.op for timed in timed_ops(parsed, scale))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _label(settings: dict[str, Any], vary_close: bool) -> str:
    cap = settings["capacity"]
    size = f"{cap // 1024**2}m" if cap % 1024**2 == 0 else f"{cap // 1024}k" if cap % 1024 == 0 else f"{cap:,}"
    return f"{settings['eviction_policy']} · {size}" + (f" · {settings['close_policy']}" if vary_close else "")


def model_note(geometry) -> str:
    """Which model's KV bytes the figures assume: 'llama-3-8b (128.0 KiB/token)'."""
    return f"{geometry.name} ({human_bytes(geometry.bytes_per_token)}/token)"


def _describe(info: dict[str, Any], geometry) -> str:
    if info["format"] == "radixtop":
        return f"radixtop trace, {info['ops']:,} ops; bytes as {model_note(geometry)}"
    if info["format"] == "recording":
        served = info["as_served"]
        lines = [f"a recording of a server's own traffic: {served['requests']:,} requests, served with a hit rate "
                 f"of {_pct(served['hit_rate'])} ({served['cached_tokens']:,} / {served['prompt_tokens']:,} "
                 f"tokens); bytes as {model_note(geometry)}"]
        if served["tokens_at_start"] is None:
            lines.append("the recording holds requests from before its first moment (--kept): the tree then is not "
                         "known, and a replay starts from an empty tree")
        elif served["tokens_at_start"]:
            lines.append(f"the tree held {served['tokens_at_start']:,} tokens when the recording began: a replay "
                         "starts from an empty tree, so its first requests hit less than they were served")
        if served["began_before"] or served["without_tokens"]:
            lines.append(f"left out: {served['began_before']:,} requests that began before the recording, "
                         f"{served['without_tokens']:,} whose tokens the server no longer held when read")
        if served["gaps"]:
            lines.append(f"the recording has {served['gaps']:,} gaps: what happened in them is not replayed "
                         f"({served['cut_by_gaps']:,} requests running at a gap aborted there)")
        return "\n".join(lines)
    return (f"{info['format']} trace: {info['requests']:,} requests in {info['sessions']:,} sessions over "
            f"{info['duration_s']:,.0f} s; {info['block_size']}-token blocks at scale {info['scale']} "
            f"= {info['block_tokens']} tokens; bytes as {model_note(geometry)}")


def print_runs(info: dict[str, Any], runs: list, top_sessions: int, geometry,
               console: Console | None = None) -> None:
    """The totals of each run side by side, then the sessions with the most prompt tokens."""
    # session ids come from the trace file: plain text, never markup or a terminal code
    console = console or plain_console()
    vary_close = len({r.settings["close_policy"] for r in runs}) > 1
    labels = [_label(r.settings, vary_close) for r in runs]
    console.print(_describe(info, geometry))
    table = Table(title="replay" if len(runs) == 1 else "replay, side by side")
    table.add_column("")
    for label in labels:
        table.add_column(label, justify="right")
    rows = [
        ("requests (refused)", lambda r: f"{r.requests:,} ({r.refused:,})"),
        ("cache hit rate", lambda r: _pct(r.hit_rate)),
        ("cached / prompt tokens", lambda r: f"{r.cached_tokens:,} / {r.prompt_tokens:,}"),
        ("lost to eviction", lambda r: f"{r.lost_tokens:,} tokens"),
        ("evicted", lambda r: f"{r.evicted_tokens:,} tokens"),
        ("closes freed", lambda r: f"{r.close_freed_tokens:,} tokens"),
        ("peak memory", lambda r: f"{r.peak_used_tokens:,} tok ({human_bytes(r.peak_used_tokens * r.bytes_per_token)})"),
        ("time applying ops", lambda r: f"{r.ops_s:.2f} s ({r.ops / r.ops_s:,.0f} ops/s)" if r.ops_s else "-"),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(r) for r in runs))
    console.print(table)
    if top_sessions <= 0 or not runs[0].sessions:
        return
    first = runs[0].sessions
    chosen = sorted(first, key=lambda sid: (-first[sid].prompt_tokens, sid))[:top_sessions]
    per = Table(title=f"sessions: the {len(chosen)} of {len(first):,} with the most prompt tokens "
                "(hit rate / lost to eviction / freed by its close)")
    per.add_column("session")
    per.add_column("requests", justify="right")
    for label in labels:
        per.add_column(label, justify="right")
    for sid in chosen:
        cells = []
        for run in runs:
            s = run.sessions.get(sid)
            cells.append("-" if s is None else
                         f"{_pct(s.hit_rate)} / {s.lost_tokens:,} / {human_bytes(s.close_freed_tokens * run.bytes_per_token)}")
        per.add_row(inert(sid), f"{first[sid].requests:,}", *cells)
    console.print(per)


def run_replay(trace: Path, fmt: str, scale: int, capacities: list[int], eviction_policies: list[str],
               close_policies: list[str], geometry, as_json: bool, top_sessions: int) -> None:
    """A replay with figures (one setting) or a comparison (several); prints or raises ValueError,
    OSError, TraceError for the command to turn into an exit code."""
    from radixtop.gpu_backend.traces.compare import compare, replay_figures

    info, make_ops = load_ops(trace, fmt, scale)
    if len(capacities) * len(eviction_policies) * len(close_policies) == 1:
        figures, results = replay_figures(make_ops(), geometry, capacities[0], eviction_policies[0],
                                          close_policies[0], keep_results=as_json)
        runs = [figures]
        docs = [{**figures.as_dict(), "results": results}]
    else:
        runs = compare(make_ops, geometry, capacities, eviction_policies, close_policies)
        docs = [r.as_dict() for r in runs]
    if as_json:
        typer.echo(json.dumps({"trace": info, "runs": docs}, separators=(",", ":")))
        return
    print_runs(info, runs, top_sessions, geometry)


def print_replay_summary(doc: dict[str, Any], geometry, console: Console | None = None) -> None:
    """The summary of one radixtop trace's replay (the document ``traces.ops.replay`` returns),
    its bytes as ``geometry``'s."""
    bytes_per_token = geometry.bytes_per_token
    console = console or plain_console()
    results = doc["results"]
    counts = Counter(r["op"] for r in results)
    hits = [r["hit"] for r in results if "hit" in r]
    stats = doc["stats"]
    table = Table(title="replay", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("bytes as", model_note(geometry))
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
