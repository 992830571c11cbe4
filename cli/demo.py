"""`radixtop demo`: the embedded engine in this process, in a plain-text live view (no Textual)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from radixtop.adapters.errors import AdapterError
from radixtop.cli.errors import EXIT_USAGE, exits, fail, trace_errors
from radixtop.cli.options import DEMO_CAPACITY, DEMO_MODEL, Capacity, Model, Scale, TraceFormat

app = typer.Typer()


@app.command()
def demo(
    capacity: Capacity = DEMO_CAPACITY,
    model: Model = DEMO_MODEL,
    sessions: Annotated[int, typer.Option(help="Sessions open at once.")] = 48,
    seed: Annotated[int, typer.Option(help="Random seed of the workload.")] = 0,
    arrival_rate: Annotated[float, typer.Option(min=0, help="Requests started per second (0: as fast as it steps).")] = 0.0,
    never_closed: Annotated[float, typer.Option(min=0, max=1, help="Share of sessions never closed.")] = 0.2,
    max_running: Annotated[int, typer.Option(min=1, help="Requests in flight at once.")] = 8,
    device: Annotated[
        str,
        typer.Option(help="cpu, cuda or meta (geometry only, no memory); auto: cuda if present, "
                     "else cpu when the pool fits in 1 GiB, else meta."),
    ] = "auto",
    refresh: Annotated[float, typer.Option(min=0.05, help="Seconds between screen refreshes.")] = 0.5,
    duration: Annotated[float, typer.Option(help="Stop after this many seconds (0: until Ctrl-C).")] = 0.0,
    record: Annotated[Path | None, typer.Option(help="Write what the engine does as a trace (JSON lines).")] = None,
    trace: Annotated[Path | None, typer.Option(help="Play this trace instead of the chat workload.")] = None,
    fmt: TraceFormat = "radixtop",
    scale: Scale = 1,
    speed: Annotated[float, typer.Option("--speed", min=0, help="A --format trace in real time at this many "
                                         "times its own pace (0: all of it at once).")] = 1.0,
) -> None:
    """The embedded engine's live text view, read through the same contract as the dashboard (which
    `radixtop` alone opens): its chat workload, or a trace (--trace), a public one (--format) in
    real time."""
    from radixtop.cli.demo_view import run_demo
    from radixtop.cli.serve import start_trace
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.kv_pool import check_device_choice
    from radixtop.gpu_backend.workload import WorkloadConfig

    with exits(ValueError):
        geometry = get_geometry(model)
        workload = WorkloadConfig(sessions=sessions, seed=seed, arrival_rate=arrival_rate,
                                  never_closed_share=never_closed, max_running=max_running, text=True)
        check_device_choice(device)
    try:
        record_to = record.open("w", encoding="utf-8") if record else None
    except OSError as exc:
        raise fail(f"cannot write {record}: {exc.strerror or exc}", EXIT_USAGE) from None
    if trace is None and (fmt != "radixtop" or scale != 1):
        raise fail("--format and --scale go with --trace", EXIT_USAGE)
    prepare = None if trace is None else (lambda scheduler: start_trace(scheduler, trace, fmt, scale, speed))
    try:
        # a pool that cannot be made (KVPoolError, a ValueError) is refused before the view starts
        with trace_errors(trace), exits(AdapterError):
            run_demo(geometry, capacity, workload, device=device, refresh=refresh, duration=duration,
                     record_to=record_to, prepare=prepare)
    finally:
        if record_to:
            record_to.close()
