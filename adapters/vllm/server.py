"""What a vLLM server tells over HTTP: its ``/metrics`` (prefix-cache queries and hits, the KV pool's
usage, the pool's size in ``vllm:cache_config_info``), its ``/v1/models`` and its dev-mode
``/reset_prefix_cache``. Every read is bounded in time and size (``adapters.http.routes``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixtop.adapters.errors import AdapterError, Unsupported
from radixtop.adapters.http.routes import Samples, ServerRoutes, parse_metrics
from radixtop.adapters.model import Geometry

USAGE, QUERIES, HITS = "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
RUNNING, WAITING, CONFIG = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:cache_config_info"
METRICS = (USAGE, QUERIES, HITS, RUNNING, WAITING, CONFIG)
DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (its /reset_prefix_cache is a dev-mode route)"


@dataclass(frozen=True)
class Figures:
    """One DP rank's figures from vLLM's ``/metrics`` (``engine`` label = the rank); None where
    the server did not say. ``blocks``: ``num_gpu_blocks`` (one of them is vLLM's null block,
    never used); ``usage``: the share of the usable blocks that running requests hold."""

    blocks: int | None
    block_size: int | None
    cache_dtype: str | None
    usage: float | None
    queries: int
    hits: int
    running: int | None
    waiting: int | None

    @property
    def usable_blocks(self) -> int | None:
        return None if self.blocks is None else max(self.blocks - 1, 0)

    @property
    def held_blocks(self) -> int | None:
        """Blocks running requests hold now (``kv_cache_usage_perc`` x the usable blocks)."""
        if self.usage is None or self.usable_blocks is None:
            return None
        return min(round(self.usage * self.usable_blocks), self.usable_blocks)


def _engine(samples: Samples, rank: int) -> Samples:
    """The samples of engine ``rank`` (a series with no ``engine`` label: the one engine, rank 0)."""
    return [(labels, v) for labels, v in samples if labels.get("engine", "0") == str(rank)]


MAX_BLOCKS = 2**40
"""More blocks than any pool has (2**40 blocks of 16 tokens of a small model: petabytes)."""
MAX_BLOCK_SIZE = 2**20
"""More tokens per block than any vLLM uses (its block sizes are 16 to a few thousand)."""


def _int_label(labels: dict[str, str], name: str, most: int) -> int | None:
    """A label's count, where it is one and at most ``most`` (else unknown)."""
    value = labels.get(name, "")
    return int(value) if value.isdigit() and len(value) < 20 and int(value) <= most else None


def figures_of(text: str, rank: int = 0) -> Figures:
    """``Figures`` of engine ``rank`` in vLLM's Prometheus text."""
    m = {name: _engine(samples, rank) for name, samples in parse_metrics(text, METRICS).items()}

    def one(name: str) -> float | None:
        return m[name][0][1] if m[name] else None

    config = m[CONFIG][0][0] if m[CONFIG] else {}
    usage = one(USAGE)
    running, waiting = one(RUNNING), one(WAITING)
    return Figures(_int_label(config, "num_gpu_blocks", MAX_BLOCKS), _int_label(config, "block_size", MAX_BLOCK_SIZE),
                   config.get("cache_dtype"), None if usage is None else min(usage, 1.0),
                   int(one(QUERIES) or 0), int(one(HITS) or 0),
                   None if running is None else int(running), None if waiting is None else int(waiting))


class VLLMServer:
    """A vLLM server's routes. ``api_key``: its ``--api-key`` (sent as a Bearer token)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 5.0):
        self.routes = ServerRoutes(url, api_key=api_key, timeout=timeout, server="vLLM",
                                   refused="pass the server's --api-key (--vllm-api-key or VLLM_API_KEY)")
        self.url = self.routes.url

    def figures(self, rank: int = 0) -> Figures:
        text = self.routes.get_text("/metrics")
        if text is None:
            raise AdapterError(f"{self.url}/metrics answers 404: is this a vLLM server?")
        return figures_of(text, rank)

    def model(self) -> dict[str, Any]:
        """The first model ``/v1/models`` lists (``id``, ``root``, ``max_model_len``); {} where none."""
        body = self.routes.get_json("/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}

    def can_reset(self) -> bool:
        """Whether ``/reset_prefix_cache`` exists (dev mode): a GET of a POST-only route answers
        405, of a missing one 404; nothing is reset."""
        return self.routes.send("GET", "/reset_prefix_cache").status_code == 405

    def reset(self) -> bool:
        """POST /reset_prefix_cache: True where vLLM reset its prefix cache, False where it refused
        (it resets only while no block is held by a running request). Unsupported outside dev mode."""
        response = self.routes.send("POST", "/reset_prefix_cache")
        if response.status_code == 404:
            raise Unsupported(f"vLLM at {self.url} has no /reset_prefix_cache: {DEV_MODE_HINT}")
        if not response.is_success:
            self.routes.fail(response)
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("success"), bool):
            return body["success"]
        return True  # older vLLM: an empty 200

    def close(self) -> None:
        self.routes.close()


def geometry_from(model: str, cache_dtype: str = "auto", block_size: int = 1) -> Geometry:
    """The KV geometry of a model folder or its ``config.json`` (``kv_geometry.from_model_folder``)."""
    from radixtop.gpu_backend.kv_geometry import from_model_folder

    return Geometry.of(from_model_folder(model, cache_dtype, block_size))
