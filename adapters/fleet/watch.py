"""What watches a fleet for a command or a server: a ``FleetPoller`` over SMG, Dynamo's KV indexer
or a fleet file (``radixtop fleet``), and the view ``GET /v1/fleet`` answers (``radixtop serve
--fleet``: in serve's process, or in radixtop's process beside its engine)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

FLEET_ENV = ("RADIXTOP_SERVE_FLEET", "RADIXTOP_SERVE_FLEET_MAP", "RADIXTOP_SERVE_FLEET_TOKENS")
"""``serve --fleet``, ``--fleet-map`` and ``--fleet-tokens`` as serve hands them to its process
beside the engine (``watched_from``): a spec and two paths, never a token."""

def open_poller(smg: str | None, dynamo: str | None, fleet: Path | None, map_file: Path | None = None,
                tokens_file: Path | None = None, radixtop_port: int = 30100, timeout: float = 2.0,
                model: str | None = None) -> Any:
    """A ``FleetPoller`` for exactly one of ``smg``, ``dynamo``, ``fleet``; BadRequest (one line)
    for a bad combination or file."""
    from radixtop.adapters.errors import BadRequest
    from radixtop.adapters.fleet.config import read_fleet_file, read_map_file, read_tokens_file
    from radixtop.adapters.fleet.probe import FleetPoller
    from radixtop.adapters.fleet.sources import DynamoSource, FleetFileSource, Mapping, SmgSource

    if sum(x is not None for x in (smg, dynamo, fleet)) != 1:
        raise BadRequest("give one of --smg URL, --dynamo URL or --fleet FILE")
    mapping = Mapping(read_map_file(map_file) if map_file else {}, radixtop_port or None)
    tokens = read_tokens_file(tokens_file) if tokens_file else {}
    bytes_per_token = None
    if model:
        from radixtop.gpu_backend.kv_geometry import get_geometry

        try:
            bytes_per_token = get_geometry(model).bytes_per_token
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    if smg is not None:
        from radixtop.adapters.fleet.config import normal_url

        source: Any = SmgSource(smg, mapping, tokens.get(normal_url(smg)), timeout)
    elif dynamo is not None:
        from radixtop.adapters.fleet.config import normal_url

        source = DynamoSource(dynamo, mapping, tokens.get(normal_url(dynamo)), timeout)
    else:
        assert fleet is not None
        source = FleetFileSource(fleet, read_fleet_file(fleet), mapping)
    return FleetPoller(source, tokens, timeout, bytes_per_token)


def watch_fleet(spec: str | None, map_file: Path | None, tokens_file: Path | None, start: bool = True) -> Any:
    """For ``radixtop serve --fleet SPEC`` (``smg=URL``, ``dynamo=URL`` or a fleet file): what
    ``GET /v1/fleet`` answers (``FleetPoller.latest``: never waits on a poll), its first poll
    started now; or None. ValueError (one line) for a bad spec or file. ``start`` false: the spec
    and files checked only, nothing polled (None: serve beside its engine, whose process beside
    watches the fleet)."""
    from radixtop.adapters.errors import BadRequest

    if spec is None:
        if map_file is not None or tokens_file is not None:
            raise ValueError("--fleet-map and --fleet-tokens go with --fleet")
        return None
    kind, sep, rest = spec.partition("=")
    try:
        if sep and kind == "smg":
            poller = open_poller(rest, None, None, map_file, tokens_file)
        elif sep and kind == "dynamo":
            poller = open_poller(None, rest, None, map_file, tokens_file)
        else:
            poller = open_poller(None, None, Path(spec), map_file, tokens_file)
    except BadRequest as exc:
        raise ValueError(f"--fleet: {exc.message}") from None
    if not start:
        return None
    poller.latest()
    return poller.latest


def watched_from(env: Mapping[str, str]) -> Any:
    """In radixtop's process beside ``serve``'s engine: the fleet serve was given (``FLEET_ENV``),
    watched here (``watch_fleet``), or None."""
    spec, map_file, tokens_file = (env.get(key) or None for key in FLEET_ENV)
    return watch_fleet(spec, None if map_file is None else Path(map_file),
                       None if tokens_file is None else Path(tokens_file))
