"""Option aliases shared by several commands."""

from __future__ import annotations

from typing import Annotated

import typer

Capacity = Annotated[int, typer.Option("--capacity", min=1, help="KV pool size in tokens.")]
PageSize = Annotated[int, typer.Option("--page-size", min=1, help="Tokens per KV page.")]
EvictionPolicy = Annotated[
    str, typer.Option("--eviction-policy", help="lru, lfu, fifo, mru, filo or priority.")
]
ClosePolicy = Annotated[
    str,
    typer.Option(
        "--close-policy",
        help="free: close frees now every chain of the session that no other session holds and "
        "nothing locks (SGLang 0.5.16's SessionRadixCacheMixin); "
        "deref: close only drops its holds and eviction frees later.",
    ),
]
Model = Annotated[str, typer.Option("--model", help="KV geometry preset (llama-3-8b, llama-3-70b, qwen2.5-7b, tiny).")]
Json = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document.")]
TraceFormat = Annotated[str, typer.Option(
    "--format", help="The trace's format: radixtop (JSON-lines ops), mooncake (Mooncake FAST'25 JSONL) "
    "or kv-cache-tester (a trace_*.json, or a directory of them).",
)]
Scale = Annotated[int, typer.Option(
    "--scale", min=1, help="Divide every length of a --format trace by this (a divisor of its block "
    "size: Mooncake's 512-token blocks at --scale 8 are 64 tokens).",
)]

DEFAULT_URL = "http://127.0.0.1:8765"
Url = Annotated[str, typer.Option("--url", envvar="RADIXTOP_URL", help="radixtop server to talk to.")]
Token = Annotated[
    str | None,
    typer.Option("--token", envvar="RADIXTOP_TOKEN", help="Bearer token for actions (never printed). Prefer the RADIXTOP_TOKEN "
                 "variable: a command line is visible to every user in ps.",
                 show_default=False),
]
Timeout = Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the target.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
