"""`radixtop serve`: the bundled engine (demo workload or a replayed trace) behind the admin API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from radixtop.adapters.errors import AdapterError
from radixtop.cli.errors import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, MissingExtra, exits, fail, trace_errors
from radixtop.cli.options import (
    DEMO_CAPACITY,
    DEMO_MODEL,
    ClosePolicy,
    DpRank,
    EvictionPolicy,
    KvEvents,
    KvReplay,
    PageSize,
    Scale,
    SGLangApiKey,
    SGLangUrl,
    TargetModel,
    TokenizerSpec,
    TraceFormat,
    VLLMApiKey,
    VLLMEvents,
    VLLMReplay,
    VLLMUrl,
)
from radixtop.cli.targets import VLLMOptions, external_spec, open_target

if TYPE_CHECKING:
    import threading

app = typer.Typer()

# ----- the admin API's own options (serve's and attach's) -----
BindHost = Annotated[str, typer.Option("--host", help="Address to bind (loopback unless you give a --token).")]
ActionToken = Annotated[str | None, typer.Option("--token", envvar="RADIXTOP_TOKEN", show_default=False,
                                                 help="Bearer token for actions (16 characters at least); made up "
                                                      "and printed if not given.")]
ReadToken = Annotated[str | None, typer.Option("--read-token", envvar="RADIXTOP_READ_TOKEN", show_default=False,
                                               help="A second token that only reads (a bind that is not loopback "
                                                    "needs a token for reads too).")]
ReadOnly = Annotated[bool, typer.Option("--read-only", help="Refuse every action (403).")]
AuditLogPath = Annotated[Path | None, typer.Option("--audit-log", help="Append the audit journal to this JSON-lines "
                                                   "file.")]


@app.command()
def serve(
    capacity: Annotated[int | None, typer.Option(
        "--capacity", min=1, show_default=False,
        help=f"KV pool size in tokens: the embedded engine's ({DEMO_CAPACITY:,} if not given), or the pool of "
             "a --kv-events stream (which does not say it).")] = None,
    model: TargetModel = None,
    page_size: PageSize = 1,
    eviction_policy: EvictionPolicy = "lru",
    close_policy: ClosePolicy = "free",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or meta.")] = "auto",
    sessions: Annotated[int, typer.Option(min=1, help="Demo workload: sessions open at once.")] = 48,
    seed: Annotated[int, typer.Option(help="Demo workload: random seed.")] = 0,
    arrival_rate: Annotated[float, typer.Option(min=0, help="Demo workload: requests per second (0: flat out).")] = 50.0,
    never_closed: Annotated[float, typer.Option(min=0, max=1, help="Demo workload: share never closed.")] = 0.2,
    max_running: Annotated[int, typer.Option(min=1, help="Demo workload: requests in flight.")] = 8,
    random_ids: Annotated[bool, typer.Option("--random-ids", help="Demo workload: random token ids instead of "
                                             "words (each seed its own system prompts).")] = False,
    trace: Annotated[Path | None, typer.Option(help="Replay this trace instead of running the demo workload.")] = None,
    fmt: TraceFormat = "radixtop",
    scale: Scale = 1,
    speed: Annotated[float, typer.Option("--speed", min=0, help="A --format trace in real time at this many "
                                         "times its own pace (0: all of it at once, before serving).")] = 1.0,
    host: BindHost = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8765,
    token: ActionToken = None,
    read_token: ReadToken = None,
    read_only: ReadOnly = False,
    audit_log: AuditLogPath = None,
    record: Annotated[Path | None, typer.Option("--record", show_default=False, help="Record the target's history to "
                                                "this new file while serving (radixtop record's format; for "
                                                "radixtop diff).")] = None,
    name: Annotated[str | None, typer.Option(show_default=False, help="The target's name, as faces show it.")] = None,
    fleet: Annotated[str | None, typer.Option("--fleet", show_default=False, help="Also watch a fleet: GET /v1/fleet "
                                              "answers its rows (smg=URL, dynamo=URL, or a fleet file).")] = None,
    fleet_map: Annotated[Path | None, typer.Option("--fleet-map", show_default=False,
                                                   help="With --fleet: each worker's radixtop (as radixtop fleet --map).")] = None,
    fleet_tokens: Annotated[Path | None, typer.Option("--fleet-tokens", envvar="RADIXTOP_FLEET_TOKENS",
                                                      show_default=False, help="With --fleet: URL TOKEN lines (mode "
                                                      "0600) for the workers' radixtop and engines.")] = None,
    kv_events: KvEvents = None,
    kv_replay: KvReplay = None,
    dp_rank: DpRank = 0,
    sglang_url: SGLangUrl = None,
    sglang_api_key: SGLangApiKey = None,
    vllm_events: VLLMEvents = None,
    vllm_replay: VLLMReplay = None,
    vllm_url: VLLMUrl = None,
    vllm_api_key: VLLMApiKey = None,
    tokenizer: TokenizerSpec = None,
    socket_fd: Annotated[int | None, typer.Option("--socket-fd", hidden=True, min=0,
                                                  help="Serve on this inherited listening socket (bound on --host by "
                                                       "the process that started this one) instead of binding --port."
                                                  )] = None,
    beside: Annotated[bool | None, typer.Option("--beside/--in-process", show_default=False,
                                                help="--beside (the embedded engine's default, but with "
                                                     "a --trace applied at once before "
                                                     "serving, whose history it would not keep): the engine alone in "
                                                     "this process; the "
                                                     "tree's copy, its figures and the admin API in radixtop's process "
                                                     "beside it (fed by the engine's change records, as beside "
                                                     "SGLang's scheduler). --in-process: all in this one.")] = None,
    proof_key: Annotated[str | None, typer.Option(envvar="RADIXTOP_PROOF_KEY", hidden=True, show_default=False,
                                                  help="A key /healthz proves it holds (the embedded demo's parent "
                                                       "checks who answers before it sends a token).")] = None,
) -> None:
    """Serve a cache over the HTTP admin API: the bundled engine (demo workload or a replayed
    trace), an SGLang server's KV-event stream (--kv-events) or plain HTTP surface (--sglang-url),
    or a vLLM server (--vllm-events, --vllm-url), so every command and the dashboard can use them
    through --url."""
    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.adapters.fleet.watch import watch_fleet
    from radixtop.adapters.http.server import serve as serve_http
    from radixtop.adapters.http.server.logs import limit_repeats
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.kv_pool import check_device_choice, pick_device
    from radixtop.gpu_backend.scheduler import Scheduler
    from radixtop.gpu_backend.workload import WorkloadConfig

    limit_repeats()  # a flood of bad requests, or of turns that do not fit, is said once a minute
    external = bool(kv_events or sglang_url or vllm_events or vllm_url)
    if beside and external:
        raise fail("--beside goes with the embedded engine (an SGLang server's plugin runs beside by itself)",
                   EXIT_USAGE)
    if beside is None:  # (the engine's own default: its reads off its process, as beside SGLang's scheduler)
        at_once = trace is not None and (fmt == "radixtop" or speed == 0)  # (applied before the process beside)
        beside = not external and not at_once
    inherited = None if socket_fd is None else inherited_socket(socket_fd, host)
    with exits(ValueError):  # (beside: checked here, watched by the process beside)
        fleet_poll = watch_fleet(fleet, fleet_map, fleet_tokens, start=not beside)

    def run_server(adapter, release) -> None:
        """Serve ``adapter`` until interrupted; errors become one line and an exit code."""
        recording = None
        try:
            if record is not None:
                recording = start_recording(adapter, record)
            with exits(ValueError):
                serve_http(adapter, host=host, port=port, token=token, audit_path=audit_log, read_token=read_token,
                           fleet=fleet_poll, sock=inherited, proof_key=proof_key.encode() if proof_key else None)
        except OSError as exc:
            raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_REFUSED) from None
        finally:
            if recording is not None:
                recording()
            release()

    if sglang_url and capacity is not None:
        raise fail("--capacity goes with the embedded engine or --kv-events: an SGLang server says its own",
                   EXIT_USAGE)
    if kv_events or sglang_url or vllm_events or vllm_url:
        with exits(ValueError, AdapterError, MissingExtra):
            target = open_target(external_spec(kv_events, kv_replay, dp_rank, sglang_url, sglang_api_key, model,
                                               capacity, tokenizer=tokenizer,
                                               vllm=VLLMOptions(vllm_events, vllm_replay, vllm_url, vllm_api_key)))
        if read_only:
            target.adapter.read_only = True  # the adapters enforce it; the KV-event stream always is
        return run_server(target.adapter, target.release)

    if tokenizer is not None:
        raise fail("--tokenizer goes with --kv-events (the demo has its own words; a trace's ids have none)",
                   EXIT_USAGE)
    capacity = capacity or DEMO_CAPACITY
    with exits(ValueError):
        check_device_choice(device)
        geometry = get_geometry(model or DEMO_MODEL, page_size)
        scheduler = Scheduler(geometry, capacity, device=pick_device(device, capacity * geometry.bytes_per_token),
                              eviction_policy=eviction_policy, close_policy=close_policy,
                              history=not beside)  # (beside: kept in radixtop's process, from the records)
        workload = None
        if trace is None:
            workload = WorkloadConfig(sessions=sessions, seed=seed, arrival_rate=arrival_rate,
                                      never_closed_share=never_closed, max_running=max_running,
                                      text=not random_ids)
    if trace is None and (fmt != "radixtop" or scale != 1):
        raise fail("--format and --scale go with --trace", EXIT_USAGE)
    if trace is not None:
        with trace_errors(trace):
            workload = start_trace(scheduler, trace, fmt, scale, speed,
                                   note=lambda line: typer.echo(f"radixtop: {line}", err=True))
    engine = Engine(scheduler, workload, step_interval=0.01)
    name = name or f"radixtop serve · {geometry.name}" + (f" · {trace.name}" if trace else " · demo")
    from radixtop.gpu_backend.demo_text import DEMO_TOKENIZER

    # The demo talks in real words (its own small vocabulary): its previews show text. A trace's
    # ids have no tokenizer here.
    demo_tokenizer = DEMO_TOKENIZER if isinstance(workload, WorkloadConfig) and workload.text else None
    if beside:
        return serve_beside(engine, name, demo_tokenizer is not None, host=host, port=port, token=token,
                            read_token=read_token, read_only=read_only, audit_log=audit_log, sock=inherited,
                            proof_key=proof_key, record=record, fleet=(fleet, fleet_map, fleet_tokens))
    engine.start()
    run_server(BundledAdapter(engine, name=name, read_only=read_only, tokenizer=demo_tokenizer), engine.stop)


@app.command()
def attach(
    point: Annotated[Path, typer.Argument(show_default=False, help="The probe's socket, as SGLang's log names it "
                                          "(RADIXTOP_BESIDE=attach: probe-PORT.sock in $XDG_RUNTIME_DIR/radixtop).")],
    host: BindHost = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 30100,
    token: ActionToken = None,
    read_token: ReadToken = None,
    read_only: ReadOnly = False,
    audit_log: AuditLogPath = None,
) -> None:
    """radixtop's process beside a running SGLang scheduler whose plugin waits for one
    (RADIXTOP_BESIDE=attach), started and supervised by you.

    The tree's copy (or the tree from the Rust core's events), its figures and the admin API run
    in this process; SGLang's own process keeps only the probe. One at a time a scheduler; it ends
    when SGLang's scheduler does, and SGLang goes on if it ends first."""
    import os
    import socket
    import stat
    import struct

    from radixtop.adapters.http.server.audit import AuditLog
    from radixtop.adapters.http.server.run import base_url, bind, checked_tokens
    from radixtop.adapters.sglang.beside import main as beside_main
    from radixtop.gpu_backend.owner.handover import SOCKET_BUFFER

    with exits(ValueError):
        token, generated = checked_tokens(host, token, read_token)
        AuditLog(audit_log).close()  # (a journal that cannot be written: refused here)
    try:
        if not stat.S_ISSOCK(os.stat(point).st_mode):
            raise fail(f"{point} is not a socket (the probe's: RADIXTOP_BESIDE=attach, in SGLang's log)", EXIT_USAGE)
    except OSError as exc:
        raise fail(f"no probe at {point} ({exc.strerror}): is SGLang running with RADIXTOP_BESIDE=attach?",
                   EXIT_UNREACHABLE) from None
    try:  # (the port first: a probe that took this one on would walk its whole tree for nothing)
        listening = bind(host, port)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_REFUSED) from None
    handover = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            handover.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        except OSError:
            pass
    try:
        handover.connect(str(point))
        _, uid, _ = struct.unpack("3i", handover.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError as exc:
        handover.close()
        listening.close()
        raise fail(f"cannot attach at {point} ({exc.strerror or exc}): is its SGLang scheduler still running?",
                   EXIT_UNREACHABLE) from None
    if uid != os.geteuid():  # (a probe is this user's own: another's socket could tell a made-up tree)
        handover.close()
        listening.close()
        raise fail(f"refusing to attach at {point}: its probe runs as uid {uid}, not this user", EXIT_REFUSED)
    listening.listen(2048)
    os.environ["RADIXTOP_TOKEN"], os.environ["RADIXTOP_READ_ONLY"] = token, "1" if read_only else "0"
    for key, value in (("RADIXTOP_READ_TOKEN", read_token), ("RADIXTOP_AUDIT", audit_log)):
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = str(value)
    typer.echo(f"radixtop attach: attached at {point} (pid {os.getpid()}); the admin API on "
               f"{base_url(host, listening.getsockname()[1])}", err=True)
    if generated:
        typer.echo(f"API token (send as 'Authorization: Bearer <token>'): {token}", err=True)
    code = beside_main(["--handover-fd", str(handover.detach()), "--socket-fd", str(listening.detach()),
                        "--host", host])
    if code:
        raise typer.Exit(code)


def start_recording(adapter, path: Path):
    """``radixtop record`` of ``adapter`` to ``path`` on a thread of its own, for as long as the
    server runs; returns what stops it (and waits for its last lines). One line and an exit where
    the file exists or the target keeps no history (``record.new_recording``)."""
    import threading

    from radixtop.cli.record import new_recording
    from radixtop.cli.recording import Recorder
    from radixtop.cli.render import installed_version

    out = new_recording(adapter, path, "--record")
    recorder = Recorder(adapter, out, float("inf"))

    def run() -> None:
        try:
            with out:
                recorder.run(installed_version() or "")
        except Exception as exc:  # (a full disk, the engine gone): said once; serving goes on
            typer.echo(f"radixtop: the recording to {path} stopped: {exc}", err=True)

    thread = threading.Thread(target=run, name="radixtop-record", daemon=True)
    thread.start()

    def stop() -> None:
        recorder.stop()
        thread.join(timeout=10)

    return stop


def serve_beside(engine, name: str, demo_words: bool, *, host: str, port: int, token: str | None,
                 read_token: str | None, read_only: bool, audit_log: Path | None, sock, proof_key: str | None,
                 record: Path | None = None,
                 fleet: tuple[str | None, Path | None, Path | None] = (None, None, None)) -> None:
    """The engine alone in this process, its probe on its thread; the tree's copy, its figures and the
    admin API in radixtop's process beside it (``adapters.sglang.beside``, as beside SGLang's
    scheduler: started again where it dies, stopped with this one). Until interrupted, or until the
    engine or its probe fails (one line, exit 1). ``record``: the history (kept beside, from the
    engine's records) recorded to that file from this process, read over the admin API as
    ``radixtop record`` reads it, once radixtop's process answers. ``fleet``: ``--fleet``,
    ``--fleet-map`` and ``--fleet-tokens`` (checked already), watched by the process beside."""
    import os
    import signal
    import threading

    from radixtop.adapters.bundled.beside import BundledOps, hello_info
    from radixtop.adapters.bundled.recorder import BundledRecorder
    from radixtop.adapters.fleet.watch import FLEET_ENV
    from radixtop.adapters.http.server.audit import AuditLog
    from radixtop.adapters.http.server.budget import BESIDE_CPU_SHARE, parse_share
    from radixtop.adapters.http.server.run import base_url, bind, checked_tokens
    from radixtop.adapters.sglang.probe import BesideProcess

    with exits(ValueError):
        token, generated = checked_tokens(host, token, read_token)
        # (checked here: the process beside would refuse them at every start)
        parse_share(os.environ.get("RADIXTOP_BESIDE_CPU"), BESIDE_CPU_SHARE)
        AuditLog(audit_log).close()  # (a journal that cannot be written: refused here, not at each start beside)
    try:
        listening = sock if sock is not None else bind(host, port)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_REFUSED) from None
    listening.listen(2048)
    env = {**os.environ, "RADIXTOP_TOKEN": token, "RADIXTOP_READ_ONLY": "1" if read_only else "0"}
    for key, value in (("RADIXTOP_READ_TOKEN", read_token), ("RADIXTOP_AUDIT", audit_log),
                       ("RADIXTOP_PROOF_KEY", proof_key), *zip(FLEET_ENV, fleet, strict=True)):
        env.pop(key, None)
        if value is not None:
            env[key] = str(value)
    failed: list[str] = []
    stopping = threading.Event()
    # (from before the process beside starts: it answers /healthz before this one would reach its
    # loop, and a SIGTERM or a Ctrl-C meanwhile must stop it as cleanly as later)
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    recorder = BundledRecorder(engine.scheduler.cache, engine.scheduler)
    try:
        process = BesideProcess(engine.scheduler.cache, listening, host, hello_info(engine, name, demo_words), env,
                                sglang=BundledOps(engine, name), recorder=recorder, wake=engine.wake)
    except Exception as exc:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        listening.close()
        raise fail(f"radixtop's process beside the engine did not start: {type(exc).__name__}: {exc}",
                   EXIT_REFUSED) from None

    def step() -> None:  # (the engine's thread, once a loop)
        try:
            process.step()
        except Exception as exc:  # the probe failed: the engine goes on, this command says why and stops
            engine.on_step = None
            failed.append(f"{type(exc).__name__}: {exc}")
            stopping.set()

    engine.on_step = step
    engine.start()
    typer.echo(f"radixtop serve: the engine runs here (pid {os.getpid()}); radixtop's process beside it (pid "
               f"{process.child.pid}) serves the admin API on {base_url(host, listening.getsockname()[1])}", err=True)
    if generated:
        typer.echo(f"API token (send as 'Authorization: Bearer <token>'): {token}", err=True)
    recording = None
    try:
        if record is not None:
            recording = record_beside(base_url(host, listening.getsockname()[1]), token, record, stopping,
                                      lambda: engine.alive and not failed)
        while not stopping.wait(0.5) and engine.alive:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if recording is not None:
            recording()
        engine.on_step = None  # (no step of the probe, nor a start of the process beside, from now on)
        engine.stop(timeout=30)
        process.close()
    if failed or engine.error is not None:
        raise fail(f"radixtop serve stopped: {failed[0] if failed else engine._dead_reason()}", EXIT_REFUSED)


def record_beside(url: str, token: str, path: Path, stopping: threading.Event,
                  alive: Callable[[], bool]) -> Callable[[], None] | None:
    """``start_recording`` of radixtop's process beside, over its admin API at ``url``, once it answers
    (its start takes seconds); None where this command stops, or the engine ends, first. An answer
    that is not its start (a refused token) is one line and an exit."""
    from radixtop.adapters.errors import TargetTimeout, TargetUnreachable
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.cli.errors import exit_code

    client = RadixtopClient(url, token=token, timeout=30)
    while True:
        try:
            client.stats()
            break
        except (TargetUnreachable, TargetTimeout):
            if stopping.wait(0.2) or not alive():
                return None
        except AdapterError as exc:
            raise fail(f"--record: {exc.message}", exit_code(exc)) from None
    return start_recording(client, path)


def inherited_socket(fd: int, host: str):
    """The listening socket ``fd`` that the parent bound and handed over, checked to be a TCP socket
    on ``host``; the command's one-line error otherwise."""
    import socket

    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise fail(f"--socket-fd {fd}: not a socket ({exc.strerror or exc})", EXIT_USAGE) from None
    bound = sock.getsockname()
    if sock.type != socket.SOCK_STREAM or not isinstance(bound, tuple) or bound[0] != host:
        sock.detach()
        raise fail(f"--socket-fd {fd}: not a TCP socket bound on {host} (it is on {bound!r})", EXIT_USAGE)
    return sock


def start_trace(scheduler, trace: Path, fmt: str, scale: int, speed: float,
                note: Callable[[str], None] | None = None):
    """Apply ``trace`` to ``scheduler`` at once (a radixtop trace, or ``speed`` 0) and return None,
    or return the TracePlayback that plays it in real time as the engine's workload. ``note``:
    told, before anything runs, how many of a public trace's requests can never fit the pool."""
    from radixtop.gpu_backend.traces.formats import FORMATS, load_trace, scaled_block, timed_ops
    from radixtop.gpu_backend.traces.ops import Replayer, read_lines, read_trace
    from radixtop.gpu_backend.traces.playback import TracePlayback

    if fmt not in FORMATS:
        raise ValueError(f"unknown --format {fmt!r}; use {', '.join(FORMATS)}")
    replayer = Replayer(scheduler)
    if fmt == "radixtop":
        if scale != 1:
            raise ValueError("--scale goes with --format mooncake or kv-cache-tester")
        with trace.open("rb") as stream:
            for op in read_trace(read_lines(stream)):
                replayer.apply(op)
        return None
    parsed = load_trace(trace, fmt)
    scaled_block(parsed.block_size, scale)  # a bad --scale is refused before anything runs
    if note is not None:
        needs = [-(-r.input_length // scale) for r in parsed.requests]
        never = sum(1 for n in needs if not scheduler.fits(n))
        if never:
            note(f"{never:,} of the trace's {len(needs):,} requests need more KV slots than the pool has "
                 f"({scheduler.pool.allocator.size:,}; the largest needs {max(needs):,}): they will never start. "
                 "--capacity sets the pool; --scale shrinks the trace's blocks")
    ops = timed_ops(parsed, scale)
    if speed > 0:
        return TracePlayback(ops, speed)
    from radixtop.gpu_backend.traces.compare import FiguresReplayer

    figures = FiguresReplayer(scheduler, {})  # refuses what does not fit, as the engine does
    for timed in ops:
        figures.apply(timed.op)
    return None
