"""One way to open a target: ``open_target(spec) -> Target(adapter, label, release)``.

One spec and one opener per kind of target a face attaches to: the embedded demo, a radixtop
server, a KV-event stream, SGLang's own routes; a fleet's worker is one of the last two
(``fleet_row_spec``). Heavy imports stay inside the openers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from radixtop.adapters.errors import AdapterError, Unauthorized
from radixtop.cli.errors import MissingExtra, exit_code, exits, fail
from radixtop.cli.options import DEMO_CAPACITY, DEMO_MODEL

if TYPE_CHECKING:
    from radixtop.adapters.base import CacheAdapter
    from radixtop.adapters.fleet.model import WorkerRow
    from radixtop.adapters.fleet.probe import FleetPoller

KV_EVENTS_EXTRA = ("zmq", "msgspec")
"""What ``radixtop[kv-events]`` installs (pyzmq, msgspec), by module name."""


@dataclass(frozen=True)
class Target:
    """An open target: the adapter a face reads, the label it shows, and what ends it (call it once)."""

    adapter: CacheAdapter
    label: str
    release: Callable[[], None]
    notices: Callable[[Callable[[str], None]], None] | None = None
    """The embedded demo's: given the function that puts a note on screen, it says there when its
    engine died and was restarted."""


# ----- the kinds of target: one spec each, opened by its own opener below -----


@dataclass(frozen=True)
class DemoSpec:
    """The embedded demo engine in a `radixtop serve` child of its own: its demo workload, or a trace it plays."""

    model: str | None = None
    capacity: int | None = None
    sessions: int = 48
    seed: int = 0
    arrival_rate: float = 20.0
    read_only: bool = False
    trace: Path | None = None
    fmt: str = "radixtop"
    scale: int = 1
    speed: float = 1.0
    timeout: float = 5.0


@dataclass(frozen=True)
class RadixtopSpec:
    """A radixtop server (``radixtop serve``, or SGLang's radixtop plugin) over its admin API."""

    url: str
    token: str | None = None
    timeout: float = 10.0


@dataclass(frozen=True)
class KVEventsSpec:
    """An SGLang or vLLM server's KV-event stream (read-only): its endpoint, or an SGLang server's URL."""

    stream: str
    replay: str | None = None
    dp_rank: int = 0
    api_key: str | None = None
    model: str | None = None
    capacity: int | None = None
    timeout: float = 5.0
    tokenizer: str | None = None


@dataclass(frozen=True)
class SGLangRoutesSpec:
    """A plain SGLang server's own routes (totals, close, flush; no tree)."""

    url: str
    api_key: str | None = None
    dp_rank: int | None = None
    model: str | None = None
    timeout: float = 5.0
    label: str | None = None
    """What a face calls it (None: the adapter's own name)."""


@dataclass(frozen=True)
class VLLMSpec:
    """A vLLM server: its KV-event publisher (and replay socket), with its HTTP address for the
    figures and the flush the events do not carry."""

    events: str
    replay: str | None = None
    url: str | None = None
    api_key: str | None = None
    dp_rank: int = 0
    model: str | None = None
    capacity: int | None = None
    timeout: float = 5.0
    tokenizer: str | None = None


@dataclass(frozen=True)
class VLLMOptions:
    """The --vllm-* options as given."""

    events: str | None = None
    replay: str | None = None
    url: str | None = None
    api_key: str | None = None


TargetSpec = DemoSpec | RadixtopSpec | KVEventsSpec | SGLangRoutesSpec | VLLMSpec


def external_spec(kv_events: str | None, kv_replay: str | None, dp_rank: int, sglang_url: str | None,
                  sglang_api_key: str | None, model: str | None, capacity: int | None, timeout: float = 5.0,
                  tokenizer: str | None = None, vllm: VLLMOptions = VLLMOptions(),
                  ) -> KVEventsSpec | SGLangRoutesSpec | VLLMSpec | None:
    """The KV-event stream, SGLang server or vLLM server the options name; None when they name
    none. ValueError (a usage error) for a bad combination."""
    given = [flag for flag, value in (("--kv-events", kv_events), ("--sglang-url", sglang_url),
                                      ("--vllm-events", vllm.events)) if value]
    if len(given) > 1:
        raise ValueError(f"give one target: {' or '.join(given)}, not both")
    if (vllm.url or vllm.replay is not None or vllm.api_key) and not vllm.events:
        raise ValueError("--vllm-url, --vllm-replay and --vllm-api-key go with --vllm-events (vLLM's tree is in "
                         "its KV events; its URL adds the pool's figures and the flush)")
    if vllm.events:
        return VLLMSpec(vllm.events, vllm.replay, vllm.url, vllm.api_key, dp_rank, model, capacity, timeout,
                        tokenizer)
    if tokenizer is not None and not kv_events:
        raise ValueError("--tokenizer goes with --kv-events or --vllm-events (a radixtop server or the plugin "
                         "decodes on its side)")
    if kv_events:
        return KVEventsSpec(kv_events, kv_replay, dp_rank, sglang_api_key, model, capacity, timeout, tokenizer)
    if sglang_url:
        return SGLangRoutesSpec(sglang_url, sglang_api_key, dp_rank if dp_rank else None, model, timeout,
                                label=sglang_url)
    return None


def fleet_row_spec(row: WorkerRow, poller: FleetPoller) -> RadixtopSpec | SGLangRoutesSpec:
    """A fleet row's own target: its radixtop, with the token the tokens file gives that URL
    (actions need it); or, without one, SGLang's own routes of that worker and rank. A vLLM
    worker without a radixtop has none to open (its routes serve no tree): ValueError, saying so."""
    if row.source == "radixtop":
        return RadixtopSpec(row.radixtop_url, poller.token_for(row), poller.timeout)
    if row.source == "vllm":
        from radixtop.adapters.fleet.format import why_closed

        raise ValueError(why_closed(row) or f"{row.key}: no dashboard to open")
    return SGLangRoutesSpec(row.worker, poller.tokens.get(row.worker), row.dp_rank, timeout=poller.timeout)


def open_target(spec: TargetSpec) -> Target:
    """The target ``spec`` names, open. Raises ValueError (a usage error), MissingExtra, an
    AdapterError, or RuntimeError (the demo engine did not start): ``cli.errors`` maps each to
    its exit code."""
    return OPENERS[type(spec)](spec)


@contextlib.contextmanager
def remote_target(url: str, token: str | None, timeout: float) -> Iterator[CacheAdapter]:
    """A command's radixtop server at ``url``, released at the end of the block; every adapter
    error, in opening it or in the block, becomes its one line and exit code (``cli.errors``)."""
    with exits(AdapterError):
        target = open_target(RadixtopSpec(url, token, timeout))
    try:
        yield target.adapter
    except Unauthorized as exc:  # say what to do, not which HTTP header was missing
        given = "the token given is not this server's" if token else "no token given"
        raise fail(f"{url} refused the action: {given}; set RADIXTOP_TOKEN to the token the server "
                   "printed at start (or its plugin's token file)", exit_code(exc)) from None
    except AdapterError as exc:
        raise fail(exc.message, exit_code(exc)) from None
    finally:
        target.release()


def model_geometry(model: str | None) -> Any:
    """``adapters.model.Geometry`` of a preset name, or of a model folder (its ``config.json``) or
    that file (None: unknown, bytes read 0). ValueError in one line where it names neither."""
    if not model:
        return None
    from radixtop.adapters.model import Geometry
    from radixtop.gpu_backend.kv_geometry import PRESETS, from_model_folder, get_geometry

    if model not in PRESETS and (Path(model).is_dir() or model.endswith(".json")):
        return Geometry.of(from_model_folder(model))
    return Geometry.of(get_geometry(model))


def load_tokenizer(spec: str | None) -> Any:
    """The tokenizer ``--tokenizer`` names, or None; ValueError (one line) where it cannot load."""
    if spec is None:
        return None
    from radixtop.adapters.text import load_tokenizer as load

    try:
        return load(spec)
    except ModuleNotFoundError:
        raise MissingExtra("--tokenizer needs transformers, which is not installed: pip install transformers") from None


def _open_demo(spec: DemoSpec) -> Target:
    from radixtop.adapters.targets import open_radixtop
    from radixtop.cli.embedded import demo_server
    from radixtop.gpu_backend.kv_geometry import get_geometry

    geometry = get_geometry(spec.model or DEMO_MODEL)
    capacity = spec.capacity or DEMO_CAPACITY
    label = f"embedded demo · {geometry.name}" + (f" · {spec.trace.name}" if spec.trace else "")
    typer.echo(f"radixtop: starting the embedded demo engine ({geometry.name}, {capacity:,} tokens)...", err=True)
    trace_args = () if spec.trace is None else ("--trace", str(spec.trace.resolve()), "--format", spec.fmt,
                                                "--scale", str(spec.scale), "--speed", repr(spec.speed))
    with contextlib.ExitStack() as stack:
        child = stack.enter_context(demo_server(label, geometry.name, capacity, spec.sessions, spec.seed,
                                                spec.arrival_rate, spec.read_only, trace_args=trace_args))
        adapter = open_radixtop(child.url, child.token, spec.timeout)
        stop_child = stack.pop_all().close  # from here the child lives until release

    def release() -> None:
        try:
            adapter.release()
            if child.ended:
                typer.echo(f"radixtop: the demo engine had ended; its last words: {child.log_tail()[-500:]}",
                           err=True)
        finally:
            stop_child()

    return Target(adapter, label, release, notices=child.watch)


def _open_radixtop(spec: RadixtopSpec) -> Target:
    from radixtop.adapters.targets import open_radixtop

    adapter = open_radixtop(spec.url, spec.token, spec.timeout)
    return Target(adapter, spec.url, adapter.release)


def _open_kv_events(spec: KVEventsSpec) -> Target:
    geometry = model_geometry(spec.model)
    try:
        from radixtop.adapters.events.zmq import KVEventsAdapter
        from radixtop.adapters.sglang.events.discover import discover
    except ModuleNotFoundError as exc:
        if exc.name not in KV_EVENTS_EXTRA:
            raise
        raise MissingExtra(f"--kv-events needs {exc.name}, which is not installed: "
                           "pip install 'radixtop[kv-events]'") from None
    stream, replay, topic, name = spec.stream, spec.replay, "", None
    try:
        if stream.startswith(("http://", "https://")):  # the server's URL: ask it where it publishes
            found = discover(stream, spec.api_key, spec.timeout)
            if spec.dp_rank >= found.dp_size:
                raise ValueError(f"DP rank {spec.dp_rank} is not published: {stream} has "
                                 f"{found.dp_size} rank{'s' if found.dp_size > 1 else ''}")
            replay = replay or found.replay_endpoint
            topic, name = found.topic, f"kv-events rank {spec.dp_rank} of {stream}"
            stream = found.endpoint
        adapter = KVEventsAdapter(stream, replay, topic=topic, dp_rank=spec.dp_rank, geometry=geometry,
                                  capacity_tokens=spec.capacity or 0, name=name,
                                  tokenizer=load_tokenizer(spec.tokenizer))
    except AdapterError as exc:  # a stream that cannot be opened as the options name it
        raise ValueError(exc.message) from None
    return Target(adapter, adapter.name, adapter.release)


def _open_vllm(spec: VLLMSpec) -> Target:
    geometry = model_geometry(spec.model)
    try:
        from radixtop.adapters.vllm.adapter import VLLMAdapter
    except ModuleNotFoundError as exc:
        if exc.name not in KV_EVENTS_EXTRA:
            raise
        raise MissingExtra(f"--vllm-events needs {exc.name}, which is not installed: "
                           "pip install 'radixtop[kv-events]'") from None
    adapter = VLLMAdapter(spec.events, spec.replay, url=spec.url, api_key=spec.api_key, dp_rank=spec.dp_rank,
                          geometry=geometry, capacity_tokens=spec.capacity or 0, timeout=spec.timeout,
                          tokenizer=load_tokenizer(spec.tokenizer))
    return Target(adapter, adapter.name, adapter.release)


def _open_sglang_routes(spec: SGLangRoutesSpec) -> Target:
    from radixtop.adapters.targets import open_sglang_routes

    adapter = open_sglang_routes(spec.url, spec.api_key, spec.dp_rank, spec.timeout, model_geometry(spec.model))
    return Target(adapter, spec.label or adapter.name, adapter.release)


OPENERS: dict[type[TargetSpec], Callable[[Any], Target]] = {
    DemoSpec: _open_demo,
    RadixtopSpec: _open_radixtop,
    KVEventsSpec: _open_kv_events,
    SGLangRoutesSpec: _open_sglang_routes,
    VLLMSpec: _open_vllm,
}
"""The opener of each kind of target (k9s's registry, in small)."""
