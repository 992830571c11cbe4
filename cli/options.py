"""Option aliases shared by several commands, and the embedded demo's defaults."""

from __future__ import annotations

from typing import Annotated

import typer

from radixtop.gpu_backend.kv_geometry import PRESETS

MODELS = ", ".join(PRESETS)
"""The KV geometry presets, as every --model help lists them."""
DEMO_MODEL = "llama-3-8b"
"""The preset the embedded demo runs where --model does not say."""
DEMO_CAPACITY = 65536
"""The embedded demo's KV pool, in tokens, where --capacity does not say."""

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
Model = Annotated[str, typer.Option("--model", help=f"KV geometry preset ({MODELS}).")]
TargetModel = Annotated[str | None, typer.Option(
    "--model", show_default=False,
    help=f"KV geometry preset ({MODELS}): the embedded engine's ({DEMO_MODEL} if not given), or the bytes "
    "of a target that does not say them (there also a model folder or its config.json).",
)]
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

# ----- the targets besides a radixtop server (the dashboard and serve) -----

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
VLLMEvents = Annotated[
    str | None,
    typer.Option("--vllm-events", envvar="RADIXTOP_VLLM_EVENTS", show_default=False,
                 help="A vLLM server's KV-event publisher (its --kv-events-config endpoint, e.g. "
                      "tcp://127.0.0.1:5557): its prefix cache as a tree, with its sessions (session_id)."),
]
VLLMReplay = Annotated[
    str | None,
    typer.Option("--vllm-replay", show_default=False,
                 help="With --vllm-events: its replay_endpoint (default: the publisher's port + 1; '' for none)."),
]
VLLMUrl = Annotated[
    str | None,
    typer.Option("--vllm-url", envvar="RADIXTOP_VLLM_URL", show_default=False,
                 help="With --vllm-events: the vLLM server's HTTP address (e.g. http://127.0.0.1:8000): pool size, "
                      "usage and hit rate from /metrics, the model from /v1/models, flush via /reset_prefix_cache."),
]
VLLMApiKey = Annotated[
    str | None,
    typer.Option("--vllm-api-key", envvar="VLLM_API_KEY", show_default=False,
                 help="The vLLM server's --api-key, if it has one (prefer the VLLM_API_KEY variable)."),
]
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
