"""`radixtop replay`: a trace applied to a fresh bundled cache, and what happened (``trace_replay`` prints it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from radixtop.cli.errors import EXIT_USAGE, exits, fail, trace_errors
from radixtop.cli.options import DEMO_MODEL, Json, Model, PageSize, Scale, TraceFormat

app = typer.Typer()

MAX_COMPARED = 24
"""Settings compared side by side at most: each is a column of the table and a replay of the trace."""


@app.command()
def replay(
    trace: Annotated[Path, typer.Argument(help="The trace: JSON-lines ops ('-' for stdin), or a public "
                                          "trace in --format.")],
    capacity: Annotated[str, typer.Option("--capacity", help="KV pool size in tokens (64k = 65,536); "
                                          "with --compare, a comma-separated list.")] = "65536",
    page_size: PageSize = 1,
    eviction_policy: Annotated[str, typer.Option("--eviction-policy", "--policy", help="lru, lfu, fifo, mru, "
                                                 "filo or priority; with --compare, a list (lru,lfu).")] = "lru",
    close_policy: Annotated[str, typer.Option("--close-policy", help="free or deref (see `radixtop serve "
                                              "--help`); with --compare, a list.")] = "free",
    model: Model = DEMO_MODEL,
    as_json: Json = False,
    fmt: TraceFormat = "radixtop",
    scale: Scale = 1,
    compare: Annotated[bool, typer.Option("--compare", help="Replay under every combination of the listed "
                                          "capacities and policies; print hit rate, evictions and memory "
                                          "side by side, and per session.")] = False,
    sessions: Annotated[int, typer.Option("--sessions", min=0, help="Sessions shown per table (the ones "
                                          "with the most prompt tokens; --json has all).")] = 10,
) -> None:
    """Apply a trace to a fresh bundled cache and print what happened: radixtop's own ops, or a
    public trace (Mooncake, kv-cache-tester) turned into them; --compare runs it under several
    settings side by side."""
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.traces.compare import parse_capacity, split_list
    from radixtop.gpu_backend.traces.formats import FORMATS
    from radixtop.gpu_backend.traces.ops import read_lines
    from radixtop.gpu_backend.traces.ops import replay as run_replay

    if fmt not in FORMATS:
        raise fail(f"unknown --format {fmt!r}; use {', '.join(FORMATS)}", EXIT_USAGE)
    with exits(ValueError):
        capacities = [parse_capacity(c) for c in split_list(capacity, "--capacity")]
        evictions = split_list(eviction_policy, "--eviction-policy")
        closes = split_list(close_policy, "--close-policy")
        geometry = get_geometry(model, page_size)
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
