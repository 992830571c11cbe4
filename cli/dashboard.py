"""`radixtop tui` (and `radixtop` alone): the dashboard on whichever target the options name."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from radixtop.adapters.errors import AdapterError
from radixtop.cli.errors import EXIT_USAGE, exits, fail
from radixtop.cli.options import (
    DEMO_CAPACITY,
    DpRank,
    KvEvents,
    KvReplay,
    Scale,
    SGLangApiKey,
    SGLangUrl,
    TargetModel,
    Timeout,
    Token,
    TokenizerSpec,
    TraceFormat,
    VLLMApiKey,
    VLLMEvents,
    VLLMReplay,
    VLLMUrl,
)
from radixtop.cli.targets import DemoSpec, RadixtopSpec, VLLMOptions, external_spec, open_target

app = typer.Typer()


def _keymap(text: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    if not all(len(p) == 2 and p[0].strip() and p[1].strip() for p in pairs):
        raise fail(f"--keymap wants binding-id=key pairs, e.g. app.pause=P,tree.toggle=enter; got {text!r}", EXIT_USAGE)
    keys = {k.strip(): v.strip() for k, v in pairs}
    if keys:
        from radixtop.inspector.app import binding_ids

        valid = binding_ids()
        unknown = [k for k in keys if k not in valid]
        if unknown:
            raise fail(f"--keymap: no binding {unknown[0]!r}; the ids are {', '.join(valid)}", EXIT_USAGE)
    return keys


def _need_terminal() -> None:
    """The dashboard draws on a terminal and reads its keys: without one (stdin from /dev/null,
    stdout a pipe) it would write escape codes to whatever reads them. Refused in one line."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise fail("the dashboard needs a terminal (stdin and stdout are not one here); in scripts use "
                   "`radixtop stats`, `sessions` or `tree`", EXIT_USAGE)


@app.command()
def tui(
    url: Annotated[str | None, typer.Option(envvar="RADIXTOP_URL", help="A radixtop server; none: the embedded demo.")] = None,
    token: Token = None,
    interval: Annotated[float, typer.Option(min=0.25, max=30, help="Seconds between refreshes.")] = 1.0,
    timeout: Timeout = 5.0,
    keymap: Annotated[str, typer.Option(help="Remap keys: binding-id=key,... (ids are listed by ?).")] = "",
    capacity: Annotated[int | None, typer.Option(min=1, show_default=False,
                                                 help=f"KV pool size in tokens (demo: {DEMO_CAPACITY}).")] = None,
    model: TargetModel = None,
    sessions: Annotated[int, typer.Option(help="Embedded demo: sessions open at once.")] = 48,
    seed: Annotated[int, typer.Option(help="Embedded demo: random seed.")] = 0,
    arrival_rate: Annotated[float, typer.Option(min=0, help="Embedded demo: requests per second.")] = 20.0,
    read_only: Annotated[bool, typer.Option("--read-only", help="Embedded demo: refuse every action.")] = False,
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
    trace: Annotated[Path | None, typer.Option(help="Embedded engine: play this trace instead of the "
                                               "demo workload.")] = None,
    fmt: TraceFormat = "radixtop",
    scale: Scale = 1,
    speed: Annotated[float, typer.Option("--speed", min=0, help="Embedded engine: a --format trace at this "
                                         "many times its own pace (0: all of it at once).")] = 1.0,
) -> None:
    """The dashboard: on the embedded demo engine (or a trace it plays, --trace), on a radixtop
    server or SGLang's radixtop plugin (--url), on an SGLang/vLLM KV-event stream (--kv-events),
    on a plain SGLang server (--sglang-url), or on a vLLM server (--vllm-events, --vllm-url)."""
    keys = _keymap(keymap)
    if trace is not None and (url or kv_events or sglang_url or vllm_events):
        raise fail("--trace plays on the embedded engine; it does not go with --url, --kv-events, --sglang-url or "
                   "--vllm-events", EXIT_USAGE)
    if trace is None and (fmt != "radixtop" or scale != 1):
        raise fail("--format and --scale go with --trace", EXIT_USAGE)
    with exits(ValueError):
        spec = external_spec(kv_events, kv_replay, dp_rank, sglang_url, sglang_api_key, model, capacity, timeout,
                             tokenizer, VLLMOptions(vllm_events, vllm_replay, vllm_url, vllm_api_key))
    if spec is None and url is not None:
        spec = RadixtopSpec(url, token, timeout)
    elif spec is None:
        spec = DemoSpec(model, capacity, sessions, seed, arrival_rate, read_only, trace, fmt, scale, speed, timeout)
        _need_terminal()  # before the demo engine starts (seconds, and it says so)
    from radixtop.inspector.app import run_dashboard

    # the demo engine that did not start: its last words as it wrote them
    with exits(ValueError, AdapterError), exits(RuntimeError, lines=True):
        target = open_target(spec)
    try:
        _need_terminal()  # (a target's own refusal, said above, comes first: it is the one to fix)
    except typer.Exit:
        target.release()
        raise
    with exits(RuntimeError, lines=True):  # the demo engine that fails while it runs, or as it stops: one line
        run_dashboard(target.adapter, target.label, interval, keys, on_exit=target.release, notices=target.notices)
