"""The targets a face can open besides the embedded engine and a radixtop server: an SGLang
server's KV-event stream, and an SGLang server's plain HTTP surface. Heavy imports stay inside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

KvEvents = Annotated[
    str | None,
    typer.Option("--kv-events", envvar="RADIXTOP_KV_EVENTS", show_default=False,
                 help="Read-only: rebuild the tree from an SGLang/vLLM server's KV-event stream: its "
                      "--kv-events-config endpoint (e.g. tcp://127.0.0.1:5557), or an SGLang server's URL "
                      "(e.g. http://127.0.0.1:30000: the publisher from its /server_info)."),
]
KvReplay = Annotated[
    str | None,
    typer.Option("--kv-replay", show_default=False,
                 help="The stream's replay_endpoint (fills gaps after a sequence jump)."),
]
DpRank = Annotated[int, typer.Option("--dp-rank", min=0, help="Which DP rank's tree (KV events).")]
TokenizerSpec = Annotated[
    str | None,
    typer.Option("--tokenizer", envvar="RADIXTOP_TOKENIZER", show_default=False,
                 help="With --kv-events: a Hugging Face tokenizer (a local path, or a name in the local "
                      "cache) to show previews as text; needs transformers."),
]


def load_tokenizer(spec: str | None) -> Any:
    """The tokenizer ``--tokenizer`` names, or None; ValueError (one line) where it cannot load."""
    if spec is None:
        return None
    try:
        from transformers import AutoTokenizer
    except ModuleNotFoundError:
        raise MissingExtra("--tokenizer needs transformers, which is not installed: pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as exc:  # (OSError, ValueError, ... : transformers raises many kinds)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot load the tokenizer {spec!r} (from local files only): {first[:200]}") from None


SGLangUrl = Annotated[
    str | None,
    typer.Option("--sglang-url", envvar="RADIXTOP_SGLANG_URL", show_default=False,
                 help="An SGLang server without the plugin: totals from /metrics, /server_info and "
                      "/v1/loads; close and flush through its own routes; no tree."),
]
SGLangApiKey = Annotated[
    str | None,
    typer.Option("--sglang-api-key", envvar="SGLANG_API_KEY", show_default=False,
                 help="The SGLang server's --api-key, if it has one."),
]


KV_EVENTS_EXTRA = ("zmq", "msgspec")
"""What ``radixtop[kv-events]`` installs (pyzmq, msgspec), by module name."""


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def model_geometry(model: str | None) -> Any:
    """``adapters.model.Geometry`` of a preset name (None: unknown, bytes read 0)."""
    if not model:
        return None
    from radixtop.adapters.model import Geometry
    from radixtop.gpu_backend.kv_geometry import get_geometry

    g = get_geometry(model)
    return Geometry(g.name, g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.page_size, g.bytes_per_token)


def open_external(kv_events: str | None, kv_replay: str | None, dp_rank: int, sglang_url: str | None,
                  sglang_api_key: str | None, model: str | None, capacity: int | None,
                  timeout: float = 5.0, tokenizer: str | None = None) -> tuple[Any, str, Callable[[], None]] | None:
    """(adapter, label, close) for --kv-events or --sglang-url; None when neither is given.
    Raises ValueError (a usage error) for a bad combination or value."""
    if kv_events and sglang_url:
        raise ValueError("give --kv-events or --sglang-url, not both")
    if tokenizer is not None and not kv_events:
        raise ValueError("--tokenizer goes with --kv-events (a radixtop server or the plugin decodes on its side)")
    geometry = model_geometry(model)
    if kv_events:
        from radixtop.adapters.errors import AdapterError

        try:
            from radixtop.adapters.sglang.events.zmq import KVEventsAdapter
        except ModuleNotFoundError as exc:
            if exc.name not in KV_EVENTS_EXTRA:
                raise
            raise MissingExtra(f"--kv-events needs {exc.name}, which is not installed: "
                               "pip install 'radixtop[kv-events]'") from None

        topic, name = "", None
        try:
            if kv_events.startswith(("http://", "https://")):  # the server's URL: ask it where it publishes
                from radixtop.adapters.sglang.events.zmq import discover

                found = discover(kv_events, sglang_api_key, timeout)
                if dp_rank >= found.dp_size:
                    raise ValueError(f"DP rank {dp_rank} is not published: {kv_events} has "
                                     f"{found.dp_size} rank{'s' if found.dp_size > 1 else ''}")
                kv_replay = kv_replay or found.replay_endpoint
                topic, name = found.topic, f"kv-events rank {dp_rank} of {kv_events}"
                kv_events = found.endpoint
            adapter = KVEventsAdapter(kv_events, kv_replay, topic=topic, dp_rank=dp_rank, geometry=geometry,
                                      capacity_tokens=capacity or 0, name=name, tokenizer=load_tokenizer(tokenizer))
        except AdapterError as exc:
            raise ValueError(exc.message) from None
        return adapter, adapter.name, adapter.release
    if sglang_url:
        from radixtop.adapters.sglang.routes import SGLangRoutesAdapter

        adapter = SGLangRoutesAdapter(sglang_url, api_key=sglang_api_key, geometry=geometry,
                                    dp_rank=dp_rank if dp_rank else None, timeout=timeout)
        return adapter, sglang_url, adapter.release
    return None
