"""Where a fleet's workers come from: SMG (``GET /workers``, ``/get_loads``), Dynamo's KV indexer
(``GET /workers``, ``/dump``) or a fleet file. Each source answers one ``Discovery``: the workers
and DP ranks to read, with what the source itself knows of them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from radixtop.adapters.errors import AdapterError, BadRequest, Unauthorized
from radixtop.adapters.fleet.config import FleetEntry, host_of, normal_url, plugin_url
from radixtop.adapters.fleet.dump import DumpError, ParsedDump, parse_dump
from radixtop.adapters.http.bounded import bounded_client, deadline, exchange
from radixtop.adapters.http.wire import is_count

MAX_SOURCE_BYTES = 16 * 2**20
"""The most a gateway's /workers or /get_loads, or the indexer's /workers, may take."""
MAX_DUMP_BYTES = 256 * 2**20
"""The most Dynamo's /dump may take (its whole radix tree as events; over it, the duplicates are
left out with a note)."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker and DP rank to read, and what its source said of it."""

    worker: str
    dp_rank: int | None
    radixtop_url: str | None = None
    by_rule: bool = False
    """The radixtop URL is a guess by the plugin's port rule (checked before it is believed)."""
    engine_url: str | None = None
    """The engine's own routes, read where there is no radixtop (or it does not answer)."""
    engine: str = "sglang"
    """Whose routes ``engine_url`` are: ``sglang`` or ``vllm`` (``config.ENGINES``)."""
    model: str = ""
    healthy: bool | None = None
    running_requests: int | None = None
    capacity_tokens: int | None = None
    unevictable_tokens: int | None = None
    indexed_tokens: int | None = None
    down: str = ""
    """Why the source says the worker is not serving (empty: it does not say so)."""
    source: str = "none"
    """What the source's own figures are (``smg``, ``dynamo``, or ``none``)."""


@dataclass(frozen=True)
class Discovery:
    specs: tuple[WorkerSpec, ...]
    error: str = ""
    dump: ParsedDump | None = None
    """Dynamo's dump, parsed (the duplicates are counted once the bytes per token are known)."""
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Mapping:
    """How a worker finds its radixtop: explicit entries (``--map``) first, then the plugin's
    port rule on the worker's host (``plugin_port``; None: no rule)."""

    entries: dict[str, str] = field(default_factory=dict)
    plugin_port: int | None = None

    def radixtop_for(self, worker: str, dp_rank: int | None, host_url: str | None) -> tuple[str | None, bool]:
        """(radixtop URL, by_rule) for a worker; ``host_url``: where the rule looks (its host)."""
        rank = dp_rank or 0
        for key in (f"{worker}@{rank}", worker if dp_rank is None or rank == 0 else None):
            if key and key in self.entries:
                return self.entries[key], False
        if dp_rank is not None and worker in self.entries and rank:
            base = self.entries[worker]  # a worker's entry names rank 0; rank r is that port + r
            head, _, port = base.rpartition(":")
            if port.isdigit():
                return f"{head}:{int(port) + rank}", False
        if self.plugin_port and host_url:
            return plugin_url(host_url, dp_rank, self.plugin_port), True
        return None, False


def _unambiguous(specs: list[WorkerSpec]) -> tuple[list[WorkerSpec], list[str]]:
    """Drop rule-made radixtop URLs that two workers would share (two SGLang servers on one host
    with the default RADIXTOP_PORT): neither is believed; say so once."""
    seen: dict[str, int] = {}
    for s in specs:
        if s.by_rule and s.radixtop_url:
            seen[s.radixtop_url] = seen.get(s.radixtop_url, 0) + 1
    clash = {u for u, n in seen.items() if n > 1}
    if not clash:
        return specs, []
    notes = [f"{u} would be the radixtop plugin of {seen[u]} workers (one RADIXTOP_PORT per host); "
             "give each worker its radixtop URL with --map" for u in sorted(clash)]
    return [replace(s, radixtop_url=None, by_rule=False) if s.radixtop_url in clash and s.by_rule else s
            for s in specs], notes


LOAD_FIGURES = ("num_running_reqs", "max_total_num_tokens", "num_used_tokens")
"""What a row takes from SMG's /get_loads, per worker and DP rank."""
MAX_DP_RANK = 4095
"""The largest DP rank a source may name (the port rule adds it to a port)."""


class Source:
    """A fleet source; ``discover`` never raises for the source's own failure (it is ``error``)."""

    label = ""

    def discover(self) -> Discovery:
        raise NotImplementedError


def _client(url: str, timeout: float, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return bounded_client(url, timeout, headers)


def _get(client: httpx.Client, path: str, what: str) -> Any:
    """One GET of the source within its client's timeout (wall clock) and its bytes (``/dump``'s
    MAX_DUMP_BYTES, any other MAX_SOURCE_BYTES)."""
    url = f"{client.base_url}".rstrip("/") + path
    response = exchange(client, client.build_request("GET", path), timeout=client.timeout.read or 3.0,
                        what=f"{what} at {url}", max_bytes=MAX_DUMP_BYTES if path == "/dump" else MAX_SOURCE_BYTES)
    if response.status_code in (401, 403):
        raise Unauthorized(f"{what} at {url} refused the request (HTTP {response.status_code}): put its API key "
                           "in the tokens file")
    if not response.is_success:
        raise AdapterError(f"{what} at {url}: HTTP {response.status_code} {response.text[:200]}")
    try:
        return response.json()
    except ValueError:
        raise AdapterError(f"{what} at {url} answered something that is not JSON") from None


def _int(value: Any) -> int | None:
    """A count the source gives (``wire.is_count``), or None (unknown) for anything else."""
    return value if is_count(value) else None


class FleetFileSource(Source):
    """Workers listed in a file: radixtop servers, or SGLang or vLLM workers with or without radixtop."""

    def __init__(self, path: Path, entries: list[FleetEntry], mapping: Mapping):
        self.label = f"fleet {path}"
        self.entries, self.mapping = entries, mapping

    def discover(self) -> Discovery:
        specs: list[WorkerSpec] = []
        for e in self.entries:
            if e.kind == "radixtop":
                specs.append(WorkerSpec(e.url, None, e.url))
                continue
            ranks: list[int | None] = [None] if e.dp_size == 1 else list(range(e.dp_size))
            for rank in ranks:
                if e.radixtop_url:
                    url = e.radixtop_url
                    if rank:
                        head, _, port = url.rpartition(":")
                        url = f"{head}:{int(port) + rank}" if port.isdigit() else url
                    specs.append(WorkerSpec(e.url, rank, url, engine_url=e.url, engine=e.kind))
                else:  # the port rule finds SGLang's plugin; vLLM has none, only --map entries
                    url, by_rule = self.mapping.radixtop_for(e.url, rank, e.url if e.kind == "sglang" else None)
                    specs.append(WorkerSpec(e.url, rank, url, by_rule, engine_url=e.url, engine=e.kind))
        specs, notes = _unambiguous(specs)
        return Discovery(tuple(specs), notes=tuple(notes))


class SmgSource(Source):
    """SGLang's model gateway: its registered workers (``GET /workers``: url, dp_rank, health,
    model) and their engines' loads (``GET /get_loads``: per worker and DP rank)."""

    def __init__(self, url: str, mapping: Mapping, token: str | None = None, timeout: float = 3.0):
        self.url = normal_url(url)
        self.label = f"smg {self.url}"
        self.mapping, self.token, self.timeout = mapping, token, timeout

    def discover(self) -> Discovery:
        """Within 2 x timeout: /workers, then /get_loads (each within timeout)."""
        with _client(self.url, self.timeout, self.token) as client, deadline(2 * self.timeout + 0.1):
            try:
                body = _get(client, "/workers", "SMG")
                workers = body["workers"]
                if not isinstance(workers, list):
                    raise TypeError("workers is not a list")
            except AdapterError as exc:
                return Discovery((), error=exc.message)
            except (KeyError, TypeError) as exc:
                return Discovery((), error=f"unexpected /workers body from SMG at {self.url}: {exc!r}")
            notes: list[str] = []
            loads: dict[tuple[str, int], dict[str, Any]] = {}
            try:
                for load in _get(client, "/get_loads", "SMG").get("loads") or []:
                    if not isinstance(load, dict):
                        continue
                    try:
                        worker = normal_url(str(load.get("worker", "")))
                    except BadRequest:
                        continue  # a grpc:// worker's load: its row is skipped below, with a note
                    rank = load.get("dp_rank") or 0
                    if not is_count(rank) or rank > MAX_DP_RANK:
                        continue  # a rank that is no rank: its load is unknown
                    loads[(worker, rank)] = load
            except (AdapterError, AttributeError, TypeError, ValueError) as exc:
                notes.append(f"SMG's /get_loads: {getattr(exc, 'message', exc)}")
        specs: list[WorkerSpec] = []
        for w in workers:
            if not isinstance(w, dict) or not w.get("url"):
                continue
            try:
                base = normal_url(str(w.get("dp_base_url") or w["url"]))
            except BadRequest:  # SMG also routes to grpc:// workers, which radixtop cannot read
                notes.append(f"worker {w.get('dp_base_url') or w['url']}: not an http(s) URL")
                continue
            rank = _int(w.get("dp_rank"))
            if rank is not None and rank > MAX_DP_RANK:
                notes.append(f"worker {base}: dp_rank {rank} is not a DP rank")
                continue
            ranks: list[int | None] = [rank] if rank is not None else (
                sorted({r for (u, r) in loads if u == base}) if len({r for (u, r) in loads if u == base}) > 1
                else [None])
            healthy = w.get("is_healthy") if isinstance(w.get("is_healthy"), bool) else None
            model = str(w.get("model_id") or "")
            for r in ranks:
                load = loads.get((base, r or 0), {})
                url, by_rule = self.mapping.radixtop_for(base, r, base)
                running, capacity, unevictable = (_int(load.get(k)) for k in LOAD_FIGURES)
                bad = [f"{k} {load[k]!r}"[:80] for k in LOAD_FIGURES if load.get(k) is not None and _int(load[k]) is None]
                if bad:
                    notes.append(f"SMG's load of {base}{'' if r is None else f'@{r}'}: {', '.join(bad)}: not a count "
                                 "(left unknown)")
                specs.append(WorkerSpec(
                    base, r, url, by_rule, engine_url=base, model=model, healthy=healthy,
                    running_requests=running, capacity_tokens=capacity, unevictable_tokens=unevictable,
                    down="" if healthy is not False else "SMG marks it unhealthy", source="smg"))
        specs, clash = _unambiguous(specs)
        return Discovery(tuple(specs), notes=tuple(notes + clash))


class DynamoSource(Source):
    """Dynamo's standalone KV indexer: its workers (``GET /workers``: instance_id, ZMQ endpoint
    per DP rank, listener status) and what each caches (``GET /dump``), hence the duplicates."""

    def __init__(self, url: str, mapping: Mapping, token: str | None = None, timeout: float = 3.0):
        self.url = normal_url(url)
        self.label = f"dynamo {self.url}"
        self.mapping, self.token, self.timeout = mapping, token, timeout

    def discover(self) -> Discovery:
        """Within 2 x timeout (at least 1 s each): /workers, then /dump."""
        timeout = max(self.timeout, 1.0)
        with _client(self.url, timeout, self.token) as client, deadline(2 * timeout + 0.1):
            try:
                workers = _get(client, "/workers", "Dynamo's indexer")
                if not isinstance(workers, list):
                    raise TypeError("/workers is not a list")
            except AdapterError as exc:
                return Discovery((), error=exc.message)
            except TypeError as exc:
                return Discovery((), error=f"unexpected /workers body from Dynamo at {self.url}: {exc}")
            notes: list[str] = []
            parsed = None
            try:
                parsed = parse_dump(_get(client, "/dump", "Dynamo's indexer"))
            except (AdapterError, DumpError) as exc:
                notes.append(f"Dynamo's /dump: {getattr(exc, 'message', exc)}")
        specs: list[WorkerSpec] = []
        for w in workers:
            if not isinstance(w, dict) or w.get("instance_id") is None:
                continue
            wid = str(w["instance_id"])
            endpoints = w.get("endpoints") if isinstance(w.get("endpoints"), dict) else {"0": ""}
            listeners = w.get("listeners") if isinstance(w.get("listeners"), dict) else {}
            ranks = sorted(int(k) for k in endpoints if str(k).isdigit() and int(k) <= MAX_DP_RANK) or [0]
            for r in ranks:
                endpoint = str(endpoints.get(str(r)) or "")
                host = host_of(endpoint)
                listener = listeners.get(str(r))
                status = str((listener.get("status") if isinstance(listener, dict) else None)
                             or w.get("status") or "")
                url, by_rule = self.mapping.radixtop_for(wid, r if len(ranks) > 1 else None,
                                                         f"http://{host}" if host else None)
                who = wid if not r else f"{wid}@{r}"
                specs.append(WorkerSpec(
                    wid, r if len(ranks) > 1 else None, url, by_rule, model=str(w.get("model_name") or ""),
                    indexed_tokens=parsed.indexed_tokens.get(who, 0) if parsed else None,
                    down="" if status in ("", "active") else f"the indexer's listener for {endpoint or 'it'} "
                                                                f"is {status}",
                    source="dynamo"))
        specs, clash = _unambiguous(specs)
        return Discovery(tuple(specs), dump=parsed, notes=tuple(notes + clash))
