"""`radixtop replay`: a trace applied to a fresh bundled cache, and what happened (``trace_replay`` prints it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from radixtop.cli.errors import EXIT_USAGE, exits, fail, trace_errors
from radixtop.cli.options import DEMO_MODEL, MODELS, Json, Scale

app = typer.Typer()

MAX_COMPARED = 24
"""Settings compared side by side at most: each is a column of the table and a replay of the trace."""


@app.command()
def replay(
    trace: Annotated[Path, typer.Argument(help="The trace: JSON-lines ops ('-' for stdin), or a public "
                                          "trace in --format.")],
    capacity: Annotated[str | None, typer.Option("--capacity", help="KV pool size in tokens (64k = 65,536; "
                                                 "a recording's own where not given, else 65,536); with "
                                                 "--compare, a comma-separated list.")] = None,
    page_size: Annotated[int | None, typer.Option("--page-size", min=1, help="Tokens per KV page (a "
                                                  "recording's own where not given, else 1).")] = None,
    eviction_policy: Annotated[str, typer.Option("--eviction-policy", "--policy", help="lru, lfu, fifo, mru, "
                                                 "filo or priority; with --compare, a list (lru,lfu).")] = "lru",
    close_policy: Annotated[str, typer.Option("--close-policy", help="free or deref (see `radixtop serve "
                                              "--help`); with --compare, a list.")] = "free",
    model: Annotated[str | None, typer.Option("--model", help=f"KV geometry preset ({MODELS}; a recording's "
                                              f"own where not given, else {DEMO_MODEL}).")] = None,
    as_json: Json = False,
    fmt: Annotated[str, typer.Option("--format", help="The trace's format: radixtop (JSON-lines ops), mooncake "
                                     "(Mooncake FAST'25 JSONL), kv-cache-tester (a trace_*.json, or a directory "
                                     "of them) or recording (a `radixtop record` file: the server's own "
                                     "traffic, for a what-if on another pool or policy).")] = "radixtop",
    scale: Scale = 1,
    compare: Annotated[bool, typer.Option("--compare", help="Replay under every combination of the listed "
                                          "capacities and policies; print hit rate, evictions and memory "
                                          "side by side, and per session.")] = False,
    sessions: Annotated[int, typer.Option("--sessions", min=0, help="Sessions shown per table (the ones "
                                          "with the most prompt tokens; --json has all).")] = 10,
) -> None:
    """Apply a trace to a fresh bundled cache and print what happened: radixtop's own ops, a
    public trace (Mooncake, kv-cache-tester) turned into them, or a recording of a server's own
    traffic; --compare runs it under several settings side by side."""
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.traces.compare import parse_capacity, split_list
    from radixtop.gpu_backend.traces.formats import FORMATS
    from radixtop.gpu_backend.traces.ops import read_lines
    from radixtop.gpu_backend.traces.ops import replay as run_replay

    if fmt not in (*FORMATS, "recording"):
        raise fail(f"unknown --format {fmt!r}; use {', '.join(FORMATS)} or recording", EXIT_USAGE)
    if fmt == "recording":
        with trace_errors(trace):
            capacity, page_size, geometry = recording_settings(trace, capacity, page_size, model)
    with exits(ValueError):
        capacities = [parse_capacity(c) for c in split_list(capacity or "65536", "--capacity")]
        evictions = split_list(eviction_policy, "--eviction-policy")
        closes = split_list(close_policy, "--close-policy")
        page_size = page_size or 1
        if fmt != "recording":
            geometry = get_geometry(model or DEMO_MODEL, page_size)
    for cap in capacities:
        if cap % page_size:
            raise fail(f"--capacity {cap} is not a multiple of --page-size {page_size}", EXIT_USAGE)
    settings = len(capacities) * len(evictions) * len(closes)
    if not compare and settings > 1:
        raise fail("several capacities or policies need --compare", EXIT_USAGE)
    if settings > MAX_COMPARED:
        raise fail(f"--compare of {settings} settings: at most {MAX_COMPARED} side by side (a table "
                   "wider than that cannot be read); give fewer capacities or policies", EXIT_USAGE)
    if compare or fmt != "radixtop":
        from radixtop.cli.trace_replay import run_replay as run_figures

        with trace_errors(trace):
            run_figures(trace, fmt, scale, capacities, evictions, closes, geometry, as_json, sessions)
        return
    with trace_errors(trace):
        if str(trace) == "-":
            doc = run_replay(read_lines(sys.stdin.buffer), capacities[0], page_size, evictions[0], closes[0],
                             geometry)
        else:
            with trace.open("rb") as stream:  # bytes: read_trace names a line that is not UTF-8
                doc = run_replay(read_lines(stream), capacities[0], page_size, evictions[0], closes[0], geometry)
    if as_json:
        typer.echo(json.dumps(doc, separators=(",", ":")))
        return
    from radixtop.cli.trace_replay import print_replay_summary

    print_replay_summary(doc, geometry)


def recording_settings(path: Path, capacity: str | None, page_size: int | None,
                       model: str | None) -> tuple[str, int, Any]:
    """A recording's pool, page size and KV geometry (its first line's), each where not given."""
    from radixtop.cli.recording import RecordingError, read_header
    from radixtop.gpu_backend.kv_geometry import KVGeometry, get_geometry

    header = read_header(path)
    given = header.get("geometry") if isinstance(header.get("geometry"), dict) else {}
    try:
        page = page_size or int(given.get("page_size", 1))
        if model is not None or not given:
            geometry = get_geometry(model or DEMO_MODEL, page)
        else:
            geometry = KVGeometry(str(given["name"]), int(given["num_layers"]), int(given["num_kv_heads"]),
                                  int(given["head_dim"]), str(given["dtype"]), page)
        if max(geometry.num_layers, geometry.num_kv_heads) > 4096 or geometry.head_dim > 65536 \
                or geometry.page_size > 1 << 20:
            raise ValueError(f"{geometry.num_layers} layers, {geometry.num_kv_heads} KV heads of "
                             f"{geometry.head_dim}, pages of {geometry.page_size}")
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise RecordingError(f"{path}: its first line's KV geometry is not one a replay can use ({exc}); "
                             "give --model") from None
    if capacity is None and isinstance(header.get("capacity_tokens"), int) and header["capacity_tokens"] > 0:
        capacity = str(header["capacity_tokens"])
    return capacity or "65536", geometry.page_size, geometry
