"""`radixtop fleet`: every worker and DP rank behind SMG, Dynamo's KV indexer or a fleet file, in
one table (or JSON, or the dashboard's fleet view, whose Enter opens that worker's dashboard)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from radixtop.adapters.fleet.watch import open_poller
from radixtop.adapters.text import inert
from radixtop.cli.errors import EXIT_UNREACHABLE, EXIT_USAGE, exits, fail
from radixtop.cli.options import Json
from radixtop.cli.targets import fleet_row_spec, open_target

app = typer.Typer()

SmgUrl = Annotated[str | None, typer.Option("--smg", show_default=False,
                                            help="SGLang's model gateway (SMG): its /workers and /get_loads.")]
DynamoUrl = Annotated[str | None, typer.Option("--dynamo", show_default=False,
                                               help="Dynamo's KV indexer: its /workers and /dump.")]
FleetFile = Annotated[Path | None, typer.Option("--fleet", show_default=False,
                                                help="A file of workers, one a line: a radixtop URL, or "
                                                     "sglang=URL or vllm=URL, then radixtop=URL and dp=N if "
                                                     "need be.")]
MapFile = Annotated[Path | None, typer.Option("--map", show_default=False,
                                              help="Lines of WORKER RADIXTOP_URL: each worker's radixtop "
                                                   "(WORKER: an engine URL or a Dynamo instance id, @DP for one rank).")]
TokensFile = Annotated[Path | None, typer.Option("--tokens", envvar="RADIXTOP_FLEET_TOKENS", show_default=False,
                                                 help="Lines of URL TOKEN (mode 0600): radixtop tokens and "
                                                      "engines' API keys. Tokens never go on the command line.")]
RadixtopPort = Annotated[int, typer.Option("--radixtop-port", min=0, max=65535,
                                           help="Where an SGLang worker's radixtop plugin listens when --map "
                                                "does not say: the worker's host, this port + the DP rank "
                                                "(the plugin's RADIXTOP_PORT); 0: do not guess.")]
FleetTimeout = Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds each worker may take to answer.")]


DROPPED_WHEN_NARROW = ("reqs", "from", "dp", "hit", "sessions")
"""Columns left out, in this order, while the table is wider than the terminal (--json has all)."""


def print_fleet(view: Any) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from radixtop.adapters.fleet.format import COLUMNS, cells, duplicate_cells, reasons, summary

    console = Console(markup=False, highlight=False, emoji=False)
    console.print(Text(inert(summary(view)), style="bold"))
    rows = [[inert(c) for c in cells(row)] for row in view.rows]
    for r in rows:
        r[0] = r[0].removeprefix("http://")
    widths = [max([len(col), *(len(r[i]) for r in rows)]) for i, col in enumerate(COLUMNS)]
    shown = list(range(len(COLUMNS)))
    for name in DROPPED_WHEN_NARROW:
        if sum(widths[i] + 3 for i in shown) <= console.width:
            break
        shown.remove(COLUMNS.index(name))
    table = Table(show_header=True, box=box.SIMPLE_HEAD, pad_edge=False)
    for i in shown:
        col = COLUMNS[i]
        table.add_column(col, justify="left" if col in ("worker", "from", "state") else "right",
                         overflow="fold" if col == "worker" else "ellipsis", no_wrap=col != "worker")
    down = {r.key for r in view.rows if not r.reachable}
    for row, texts in zip(view.rows, rows):
        table.add_row(*(texts[i] for i in shown), style=None if row.reachable else "red")
    console.print(table)
    for line in reasons(view):
        console.print(Text(inert(line), style="red" if line.split(": ", 1)[0] in down else "yellow"))
    dups = duplicate_cells(view)
    if dups:
        t = Table(title="prefixes cached on more than one worker (Dynamo's dump)", title_justify="left")
        for col in ("prefix (last block)", "tokens", "cached on", "duplicated"):
            t.add_column(col, justify="right" if col in ("tokens", "duplicated") else "left")
        for c in dups:
            t.add_row(*(inert(x) for x in c))
        console.print(t)
    for note in view.notes:
        console.print(Text(f"note: {inert(note)}", style="yellow"))
    console.print(Text("? = unknown (the worker cannot tell; never a 0). pressure = unevictable / capacity.",
                       style="dim"))


def open_worker(row: Any, poller: Any) -> tuple[Any, str]:
    """(adapter, label) for a row's own dashboard (``targets.fleet_row_spec``): its radixtop, or
    SGLang's own routes (totals, close, flush)."""
    target = open_target(fleet_row_spec(row, poller))
    return target.adapter, target.label


def run_fleet_dashboard(poller: Any, interval: float) -> None:
    """The fleet view; Enter opens that worker's dashboard, whose q comes back to the fleet (the
    cursor on the same worker); q in the fleet view ends."""
    from radixtop.inspector.app import run_fleet

    run_fleet(poller.poll, interval, lambda row: open_worker(row, poller))


@app.command()
def fleet(
    smg: SmgUrl = None,
    dynamo: DynamoUrl = None,
    fleet_file: FleetFile = None,
    map_file: MapFile = None,
    tokens: TokensFile = None,
    radixtop_port: RadixtopPort = 30100,
    model: Annotated[str | None, typer.Option(show_default=False, help="KV geometry preset for the bytes of "
                                              "Dynamo's duplicates where no worker's radixtop says them.")] = None,
    timeout: FleetTimeout = 2.0,
    as_json: Json = False,
    tui: Annotated[bool, typer.Option("--tui", help="The dashboard's fleet view (Enter opens a worker's "
                                      "dashboard).")] = False,
    interval: Annotated[float, typer.Option(min=0.5, max=60, help="--tui: seconds between polls.")] = 2.0,
) -> None:
    """One row per worker and DP rank (capacity, available/evictable/unevictable, sessions, hit rate,
    reachable or why not), the most pressed first; from Dynamo, the prefixes cached twice."""
    from radixtop.adapters.errors import BadRequest

    if as_json and tui:
        raise fail("give --json or --tui, not both", EXIT_USAGE)
    with exits(BadRequest):
        poller = open_poller(smg, dynamo, fleet_file, map_file, tokens, radixtop_port, timeout, model)
    if tui:
        run_fleet_dashboard(poller, interval)
        return
    view = poller.poll()
    if as_json:
        import json

        typer.echo(json.dumps(view.to_dict(), separators=(",", ":")))
    else:
        print_fleet(view)
    if view.error and as_json:
        raise typer.Exit(EXIT_UNREACHABLE)
    if view.error:
        raise fail(view.error, EXIT_UNREACHABLE)
