"""The `radixtop` command: the demo view (no arguments) and `replay`."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from radixtop.cli.options import Capacity, Json, Model, PageSize, Scale, TraceFormat
from radixtop.cli.targets import (
    DpRank,
    KvEvents,
    KvReplay,
    MissingExtra,
    SGLangApiKey,
    SGLangUrl,
    TokenizerSpec,
    open_external,
)

app = typer.Typer(
    name="radixtop",
    help="top for radix KV caches: what a prefix cache holds, who holds it, and what it costs.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 1) -> typer.Exit:
    """One line on stderr and an exit code; never a traceback."""
    typer.echo(f"radixtop: {message}", err=True)
    return typer.Exit(code)


@contextlib.contextmanager
def trace_errors(trace: Path | None) -> Iterator[None]:
    """A trace that cannot be read (exit 2), a line it cannot apply (exit 1, the line named), or a
    bad value (exit 2): one line each."""
    from radixtop.gpu_backend.traces.ops import TraceError  # late: the engine's imports are heavy

    try:
        yield
    except OSError as exc:
        raise fail(f"cannot read trace {trace}: {exc.strerror or exc}", 2) from None
    except TraceError as exc:
        raise fail(f"{trace}: {exc}", 1) from None
    except ValueError as exc:
        raise fail(str(exc), 2) from None


@app.callback(invoke_without_command=True)
def main_callback(ctx: typer.Context) -> None:
    """With no command: the dashboard on the embedded engine running its demo workload."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(tui)


def _keymap(text: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    if not all(len(p) == 2 and p[0].strip() and p[1].strip() for p in pairs):
        raise fail(f"--keymap wants binding-id=key pairs, e.g. app.pause=P,tree.toggle=enter; got {text!r}", 2)
    keys = {k.strip(): v.strip() for k, v in pairs}
    if keys:
        from radixtop.inspector.app import binding_ids

        valid = binding_ids()
        unknown = [k for k in keys if k not in valid]
        if unknown:
            raise fail(f"--keymap: no binding {unknown[0]!r}; the ids are {', '.join(valid)}", 2)
    return keys


@app.command()
def tui(
    url: Annotated[str | None, typer.Option(envvar="RADIXTOP_URL", help="A radixtop server; none: the embedded demo.")] = None,
    token: Annotated[str | None, typer.Option(envvar="RADIXTOP_TOKEN", show_default=False, help="Bearer token for actions.")] = None,
    interval: Annotated[float, typer.Option(min=0.25, max=30, help="Seconds between refreshes.")] = 1.0,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the target.")] = 5.0,
    keymap: Annotated[str, typer.Option(help="Remap keys: binding-id=key,... (ids are listed by ?).")] = "",
    capacity: Annotated[int | None, typer.Option(min=1, show_default=False,
                                                 help="KV pool size in tokens (demo: 65536).")] = None,
    model: Annotated[str | None, typer.Option(show_default=False, help="KV geometry preset for bytes "
                                              "(llama-3-8b, llama-3-70b, qwen2.5-7b, qwen2.5-0.5b, tiny; demo: llama-3-8b).")] = None,
    sessions: Annotated[int, typer.Option(help="Embedded demo: sessions open at once.")] = 48,
    seed: Annotated[int, typer.Option(help="Embedded demo: random seed.")] = 0,
    arrival_rate: Annotated[float, typer.Option(min=0, help="Embedded demo: requests per second.")] = 20.0,
    read_only: Annotated[bool, typer.Option("--read-only", help="Embedded demo: refuse every action.")] = False,
    kv_events: KvEvents = None,
    kv_replay: KvReplay = None,
    dp_rank: DpRank = 0,
    sglang_url: SGLangUrl = None,
    sglang_api_key: SGLangApiKey = None,
    tokenizer: TokenizerSpec = None,
    trace: Annotated[Path | None, typer.Option(help="Embedded engine: play this trace instead of the "
                                               "demo workload.")] = None,
    fmt: TraceFormat = "radixtop",
    scale: Scale = 1,
    speed: Annotated[float, typer.Option("--speed", min=0, help="Embedded engine: a --format trace at this "
                                         "many times its own pace (0: all of it at once).")] = 1.0,
) -> None:
    """The dashboard: on the embedded demo engine (or a trace it plays, --trace), on a radixtop
    server or SGLang's radixtop plugin (--url), on an SGLang/vLLM KV-event stream (--kv-events),
    or on a plain SGLang server (--sglang-url)."""
    keys = _keymap(keymap)
    if trace is not None and (url or kv_events or sglang_url):
        raise fail("--trace plays on the embedded engine; it does not go with --url, --kv-events or --sglang-url", 2)
    if trace is None and (fmt != "radixtop" or scale != 1):
        raise fail("--format and --scale go with --trace", 2)
    if kv_events or sglang_url:
        from radixtop.inspector.app import run_dashboard

        try:
            adapter, label, close = open_external(kv_events, kv_replay, dp_rank, sglang_url, sglang_api_key,
                                                  model, capacity, timeout, tokenizer)
        except ValueError as exc:
            raise fail(str(exc), 2) from None
        except MissingExtra as exc:
            raise fail(str(exc), 1) from None
        run_dashboard(adapter, label, interval, keys, on_exit=close)
        return
    if tokenizer is not None:
        raise fail("--tokenizer goes with --kv-events (a radixtop server or the plugin decodes on its side)", 2)
    if url is not None:
        from radixtop.adapters.errors import BadRequest
        from radixtop.adapters.http.client import RadixtopClient
        from radixtop.inspector.app import run_dashboard

        try:
            adapter = RadixtopClient(url, token=token, timeout=timeout)
        except BadRequest as exc:  # a URL or token that cannot be sent
            raise fail(exc.message, 2) from None
        run_dashboard(adapter, url, interval, keys, on_exit=adapter.release)
        return
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.cli.embedded import demo_server
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.inspector.app import run_dashboard

    try:
        geometry = get_geometry(model or "llama-3-8b")
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    name = f"embedded demo · {geometry.name}" + (f" · {trace.name}" if trace else "")
    typer.echo(f"radixtop: starting the embedded demo engine ({geometry.name}, {capacity or 65536:,} tokens)...",
               err=True)
    trace_args = () if trace is None else ("--trace", str(trace.resolve()), "--format", fmt, "--scale",
                                           str(scale), "--speed", repr(speed))
    try:
        with demo_server(name, geometry.name, capacity or 65536, sessions, seed, arrival_rate,
                         read_only, trace_args=trace_args) as child:
            adapter = RadixtopClient(child.url, token=child.token, timeout=timeout)
            run_dashboard(adapter, name, interval, keys, on_exit=adapter.release, notices=child.watch)
            if child.ended:
                typer.echo(f"radixtop: the demo engine had ended; its last words: {child.log_tail()[-500:]}",
                           err=True)
    except RuntimeError as exc:
        raise fail(str(exc), 1) from None


@app.command()
def demo(
    capacity: Capacity = 65536,
    model: Model = "llama-3-8b",
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
    """The embedded demo engine's live text view (the dashboard replaces it): its chat workload,
    or a trace (--trace), a public one (--format) in real time."""
    from radixtop.cli.demo_view import run_demo
    from radixtop.cli.serve import start_trace
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.kv_pool import KVPoolError
    from radixtop.gpu_backend.workload import WorkloadConfig

    try:
        geometry = get_geometry(model)
        workload = WorkloadConfig(sessions=sessions, seed=seed, arrival_rate=arrival_rate,
                                  never_closed_share=never_closed, max_running=max_running, text=True)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    if device not in ("auto", "cpu", "cuda", "meta"):
        raise fail(f"unknown device {device!r}; use auto, cpu, cuda or meta", 2)
    try:
        record_to = record.open("w", encoding="utf-8") if record else None
    except OSError as exc:
        raise fail(f"cannot write {record}: {exc.strerror or exc}", 2) from None
    if trace is None and (fmt != "radixtop" or scale != 1):
        raise fail("--format and --scale go with --trace", 2)
    prepare = None if trace is None else (lambda scheduler: start_trace(scheduler, trace, fmt, scale, speed))
    try:
        with trace_errors(trace):
            run_demo(geometry, capacity, workload, device=device, refresh=refresh, duration=duration,
                     record_to=record_to, prepare=prepare)
    except KVPoolError as exc:  # raised as the pool is made, before the view starts
        raise fail(str(exc), 2) from None
    finally:
        if record_to:
            record_to.close()


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
    model: Model = "tiny",
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
        raise fail(f"unknown --format {fmt!r}; use {', '.join(FORMATS)}", 2)
    try:
        capacities = [parse_capacity(c) for c in split_list(capacity, "--capacity")]
        evictions = split_list(eviction_policy, "--eviction-policy")
        closes = split_list(close_policy, "--close-policy")
        geometry = get_geometry(model, page_size)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    for cap in capacities:
        if cap % page_size:
            raise fail(f"--capacity {cap} is not a multiple of --page-size {page_size}", 2)
    if not compare and len(capacities) * len(evictions) * len(closes) > 1:
        raise fail("several capacities or policies need --compare", 2)
    if compare or fmt != "radixtop":
        from radixtop.cli.trace_replay import run_replay as run_figures

        with trace_errors(trace):
            run_figures(trace, fmt, scale, capacities, evictions, closes, geometry, as_json, sessions)
        return
    capacity_tokens = capacities[0]
    with trace_errors(trace):
        if str(trace) == "-":
            doc = run_replay(read_lines(sys.stdin.buffer), capacity_tokens, page_size, evictions[0],
                             closes[0], geometry)
        else:
            with trace.open("rb") as stream:  # bytes: read_trace names a line that is not UTF-8
                doc = run_replay(read_lines(stream), capacity_tokens, page_size, evictions[0], closes[0],
                                 geometry)
    if as_json:
        typer.echo(json.dumps(doc, separators=(",", ":")))
        return
    from radixtop.cli.render import print_replay_summary

    print_replay_summary(doc, geometry.bytes_per_token)


from radixtop.cli import doctor, fleet, remote, serve  # noqa: E402  (commands defined in their own modules)

app.add_typer(serve.app)
app.add_typer(remote.app)
app.add_typer(doctor.app)
app.add_typer(fleet.app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
