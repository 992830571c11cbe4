"""An SGLang server's KV-event publisher, from its ``/server_info`` (``discover``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from radixtop.adapters.errors import BadRequest

WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class Publisher:
    """A server's KV-event publisher as its ``/server_info`` describes it (rank 0's endpoints;
    rank r's ports are these plus r)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    dp_size: int
    block_size: int | None


def _tcp(host: str, port: Any, url_host: str) -> str | None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    if not host or host in WILDCARD_HOSTS:  # where the server binds: reached at the URL's host
        host = url_host
    return f"tcp://{host}:{port}"


def discover(url: str, api_key: str | None = None, timeout: float = 5.0) -> Publisher:
    """The KV-event publisher of the SGLang server at ``url``, from ``/server_info``'s
    ``kv_events`` block (sgl-project/sglang#25844: ``publisher``, ``endpoint_host``,
    ``endpoint_port_base``, ``topic``, ``block_size``, ``dp_size`` and, from 0.5.2x,
    ``replay_endpoint_port_base``; a wildcard host is the URL's). Where the block has no replay
    port (0.5.16), it comes from the ``kv_events_config`` beside it. BadRequest, in one line,
    where the server cannot be read or publishes no KV events over tcp."""
    import httpx

    base = url.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"a server URL is http(s)://host:port, got {url!r}")
    url_host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = httpx.get(f"{base}/server_info", headers=headers, timeout=timeout)
        reply.raise_for_status()
        info = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise BadRequest(f"cannot read {base}/server_info: {type(exc).__name__}: {exc}") from None
    block = info.get("kv_events") if isinstance(info, dict) else None
    if not isinstance(block, dict):
        raise BadRequest(f"{base} publishes no KV events (its /server_info has no kv_events block): start it "
                         "with --kv-events-config '{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'")
    if block.get("publisher") != "zmq":
        raise BadRequest(f"{base} publishes KV events with {block.get('publisher')!r}, not zmq")
    endpoint = _tcp(str(block.get("endpoint_host") or ""), block.get("endpoint_port_base"), url_host)
    if endpoint is None:
        raise BadRequest(f"{base}/server_info's kv_events block has no usable endpoint: {block}")
    replay = None
    if "replay_endpoint_port_base" in block:
        replay = _tcp(str(block.get("endpoint_host") or ""), block["replay_endpoint_port_base"], url_host)
    else:  # 0.5.16: the replay port only in the launch argument
        try:
            config = json.loads(info.get("kv_events_config") or "{}")
            configured = str(config.get("replay_endpoint") or "")
        except (TypeError, ValueError, AttributeError):
            configured = ""
        if configured.startswith("tcp://"):
            host, _, port = configured[len("tcp://"):].rpartition(":")
            replay = _tcp(host, int(port) if port.isdigit() else None, url_host)
    dp_size, block_size = block.get("dp_size"), block.get("block_size")
    return Publisher(endpoint, replay, str(block.get("topic") or ""),
                     dp_size if isinstance(dp_size, int) and dp_size > 0 else 1,
                     block_size if isinstance(block_size, int) else None)
