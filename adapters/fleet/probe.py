"""One poll of a fleet: discover the workers, then read every worker at once, each within its own
deadline, so a worker that hangs or refuses gets a reason in its row and never holds the view past
the poll's deadline (2 x timeout + 0.5 s after discovery)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from functools import partial

from radixtop.adapters.errors import AdapterError, TargetTimeout
from radixtop.adapters.fleet.dump import duplicates
from radixtop.adapters.fleet.model import FleetView, WorkerRow, by_pressure
from radixtop.adapters.fleet.sources import Source, WorkerSpec
from radixtop.adapters.http.bounded import deadline
from radixtop.adapters.targets import open_radixtop, open_sglang_routes

MAX_THREADS = 32
WORKER_MAX_BYTES = 2**20
"""The most a worker's radixtop may answer its stats with (they take ~2 KiB); SGLang's own routes
keep their adapter's cap (its /metrics runs to megabytes)."""
PLUGIN_PREFIX = "sglang dp"
"""How the radixtop plugin names itself (``sglang dp<rank> <model>``): a URL guessed by the port
rule is believed only when the server there says so."""


def _row_from_source(spec: WorkerSpec, why: str) -> WorkerRow:
    """What the source alone knows (SMG's loads, Dynamo's dump): reachable unless it says not."""
    reachable = not spec.down and spec.source != "none"
    figures = spec.capacity_tokens is not None or spec.running_requests is not None or spec.indexed_tokens is not None
    return WorkerRow(
        spec.worker, spec.dp_rank, spec.radixtop_url, spec.source if figures else "none", reachable and figures,
        why="; ".join(w for w in (spec.down, why) if w), model=spec.model, healthy=spec.healthy,
        capacity_tokens=spec.capacity_tokens, unevictable_tokens=spec.unevictable_tokens,
        running_requests=spec.running_requests, indexed_tokens=spec.indexed_tokens)


def is_plugin_of(target: str, dp_rank: int | None) -> bool:
    """Whether a radixtop naming itself ``target`` is the plugin of DP rank ``dp_rank``: exactly
    ``sglang dp<rank>``, then the end or a space (``sglang dp1`` is not ``sglang dp10``)."""
    name = f"{PLUGIN_PREFIX}{dp_rank or 0}"
    return target == name or target.startswith(name + " ")


def read_radixtop(spec: WorkerSpec, url: str, token: str | None, timeout: float) -> WorkerRow:
    client = open_radixtop(url, token=token, timeout=timeout)
    client.max_reply_bytes = WORKER_MAX_BYTES
    try:
        s = client.stats()
    finally:
        client.release()
    if spec.by_rule and not is_plugin_of(s.target, spec.dp_rank):
        raise AdapterError(f"{url} is a radixtop ({s.target!r}) but not this worker's plugin; give its URL "
                           "with --map")
    return WorkerRow(
        spec.worker, spec.dp_rank, url, "radixtop", True, why=spec.down, model=spec.model or s.geometry.name,
        healthy=spec.healthy, capacity_tokens=s.capacity_tokens, available_tokens=s.available_tokens,
        evictable_tokens=s.evictable_tokens, unevictable_tokens=s.unevictable_tokens,
        bytes_per_token=s.bytes_per_token or None, open_sessions=s.open_sessions, prompt_tokens=s.prompt_tokens,
        cached_tokens=s.cached_tokens, running_requests=spec.running_requests, indexed_tokens=spec.indexed_tokens,
        by_rule=spec.by_rule)


def _engine_row(spec: WorkerSpec, source: str, why: str, missing: list[str], **figures: int | None) -> WorkerRow:
    """A row from an engine's own routes (``source``); what it cannot tell, ``missing``, is said in
    its why after ``why`` (what went wrong before: its radixtop did not answer)."""
    notes = [w for w in (spec.down, why) if w]
    if missing:
        notes.append("unknown: " + ", ".join(missing))
    figures.setdefault("running_requests", spec.running_requests)
    return WorkerRow(spec.worker, spec.dp_rank, None, source, True, why="; ".join(notes), model=spec.model,
                     healthy=spec.healthy, indexed_tokens=spec.indexed_tokens, **figures)


def read_sglang(spec: WorkerSpec, api_key: str | None, timeout: float, why: str) -> WorkerRow:
    """SGLang's own routes: capacity and unevictable always; available and evictable apart only with its
    KV gauges in /metrics; the hit rate only with --enable-metrics; no sessions."""
    adapter = open_sglang_routes(spec.engine_url or spec.worker, api_key=api_key, dp_rank=spec.dp_rank,
                                 timeout=timeout)
    try:
        t = adapter.read()
    finally:
        adapter.release()
    missing = [] if t.split else ["available and evictable apart (no KV gauges in /metrics)"]
    if not t.metrics:
        missing.append("the hit rate (no /metrics: --enable-metrics)")
    return _engine_row(
        spec, "sglang", why, missing, capacity_tokens=t.capacity, available_tokens=t.available if t.split else None,
        evictable_tokens=t.evictable if t.split else None, unevictable_tokens=t.unevictable,
        prompt_tokens=t.prompt if t.metrics else None, cached_tokens=t.cached if t.metrics else None)


def read_vllm(spec: WorkerSpec, api_key: str | None, timeout: float, why: str) -> WorkerRow:
    """vLLM's own /metrics, for its DP rank (the ``engine`` label): capacity (the usable blocks x
    block size: ``num_gpu_blocks`` less vLLM's null block), unevictable (the blocks running requests
    hold, ``kv_cache_usage_perc``), the hit rate (its prefix-cache queries and hits); available and
    evictable never apart (it counts the blocks nobody holds as one), sessions never."""
    from radixtop.adapters.vllm.server import VLLMServer  # only a fleet with vLLM workers loads it

    server, rank = VLLMServer(spec.engine_url or spec.worker, api_key=api_key, timeout=timeout), spec.dp_rank or 0
    try:
        f = server.figures(rank)
    finally:
        server.close()
    if f.blocks is None and f.usage is None and f.running is None:  # not a row of zeros: none of it is known
        raise AdapterError(f"{server.url}/metrics has no figures of engine {rank} (no vllm:cache_config_info, "
                           "vllm:kv_cache_usage_perc): is it a vLLM server with that DP rank?")

    def tokens(blocks: int | None) -> int | None:
        return None if blocks is None or f.block_size is None else blocks * f.block_size

    capacity, held = tokens(f.usable_blocks), tokens(f.held_blocks)
    missing = ["available and evictable apart (vLLM's /metrics counts the blocks no request holds as one)"]
    if capacity is None:
        missing.append("capacity (no num_gpu_blocks and block_size in vllm:cache_config_info)")
    if held is None and capacity is not None:
        missing.append("unevictable (no vllm:kv_cache_usage_perc)")
    return _engine_row(spec, "vllm", why, missing, capacity_tokens=capacity, unevictable_tokens=held,
                       prompt_tokens=f.queries, cached_tokens=f.hits,
                       running_requests=spec.running_requests if f.running is None else f.running)


ENGINE_READERS = {"sglang": read_sglang, "vllm": read_vllm}
"""How a worker's engine is read where it has no radixtop that answers (``WorkerSpec.engine``)."""


def _read_by(until: float, spec: WorkerSpec, tokens: dict[str, str], timeout: float) -> WorkerRow:
    """``read_worker`` with every request it makes ending by ``until`` (the poll's deadline): a
    read that misses it stops there, its connection closed, instead of running on."""
    with deadline(until - time.monotonic()):
        return read_worker(spec, tokens, timeout)


def read_worker(spec: WorkerSpec, tokens: dict[str, str], timeout: float) -> WorkerRow:
    """The worker's radixtop where it has one; else its engine's routes (SGLang's or vLLM's); else
    its source's figures."""
    why = ""
    if spec.radixtop_url:
        try:
            # a URL guessed by the port rule gets only a token the tokens file gives that very URL:
            # the worker's entry (the engine's API key) is not sent before the plugin is believed
            token = tokens.get(spec.radixtop_url)
            if token is None and not spec.by_rule:
                token = tokens.get(spec.worker)
            return read_radixtop(spec, spec.radixtop_url, token, timeout)
        except AdapterError as exc:
            why = f"radixtop: {exc.message}"
    if spec.engine_url:
        try:
            return ENGINE_READERS[spec.engine](spec, tokens.get(spec.engine_url), timeout, why)
        except AdapterError as exc:
            row = _row_from_source(spec, "; ".join(w for w in (why, f"engine: {exc.message}") if w))
            return replace(row, reachable=False)
    if not spec.radixtop_url and not why:
        why = "no radixtop URL known (give one with --map)"
    return _row_from_source(spec, why)


def _timed_out(spec: WorkerSpec, seconds: float) -> WorkerRow:
    row = _row_from_source(spec, f"no answer within {seconds:g} s")
    return replace(row, reachable=False)


def poll_fleet(source: Source, tokens: dict[str, str] | None = None, timeout: float = 2.0,
               bytes_per_token: int | None = None) -> FleetView:
    """Discover, then read every worker concurrently. Each read's requests end within ``timeout``
    (wall clock); every read ends by the poll's deadline, 2 x timeout + 0.5 s after discovery (a
    radixtop try, then the engine), and a row still out then gets a reason instead of its
    figures. Discovery itself ends within its source's deadline (2 x its timeout)."""
    started, taken_at = time.monotonic(), time.time()
    tokens = tokens or {}
    try:
        found = source.discover()
    except Exception as exc:  # discover() says its failures; a bug in one must not end the caller
        message = exc.message if isinstance(exc, AdapterError) else f"{type(exc).__name__}: {exc}"
        return FleetView(source.label, (), taken_at, time.monotonic() - started,
                         error=f"{source.label}: {message}")
    if found.error:
        return FleetView(source.label, (), taken_at, time.monotonic() - started, error=found.error,
                         notes=found.notes)
    rows: dict[int, WorkerRow] = {}
    budget = 2 * timeout + 0.5
    pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(found.specs))),
                              thread_name_prefix="radixtop-fleet")
    try:
        until = time.monotonic() + budget
        read = partial(_read_by, until)
        futures: dict[Future, int] = {pool.submit(read, spec, tokens, timeout): i
                                      for i, spec in enumerate(found.specs)}
        pending = set(futures)
        while pending:
            left = until - time.monotonic() + 0.05
            if left <= 0:
                break
            done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            for f in done:
                i = futures[f]
                try:
                    rows[i] = f.result()
                except Exception as exc:  # a bug in one read must not hide the others
                    kind = "timed out" if isinstance(exc, TargetTimeout) else type(exc).__name__
                    rows[i] = replace(_row_from_source(found.specs[i], f"{kind}: {exc}"), reachable=False)
        for f in pending:
            i = futures[f]
            rows[i] = _timed_out(found.specs[i], budget)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # reads still out end by the deadline
    ordered = [rows[i] for i in range(len(found.specs))]
    dups = None
    if found.dump is not None:
        bpt = bytes_per_token or _one_bytes_per_token(ordered)
        dups = duplicates(found.dump, bpt)
    return FleetView(source.label, by_pressure(ordered), taken_at, time.monotonic() - started,
                     duplicates=dups, notes=found.notes)


def _one_bytes_per_token(rows: list[WorkerRow]) -> int | None:
    """The bytes per token every row that knows them agrees on (one model), else None."""
    seen = {r.bytes_per_token for r in rows if r.bytes_per_token}
    return seen.pop() if len(seen) == 1 else None


class FleetPoller:
    """Polls one source for many readers (the API's /v1/fleet, a dashboard): one poll at a time,
    a poll younger than ``max_age`` seconds is answered again rather than repeated, and a reader
    that comes while a poll runs gets the last view at once instead of waiting for it."""

    def __init__(self, source: Source, tokens: dict[str, str] | None = None, timeout: float = 2.0,
                 bytes_per_token: int | None = None, max_age: float = 1.0):
        self.source, self.tokens, self.timeout = source, tokens or {}, timeout
        self.bytes_per_token, self.max_age = bytes_per_token, max_age
        self._lock = threading.Lock()
        self._last: tuple[float, FleetView] | None = None
        self._first: Future[FleetView] = Future()
        """The first view, once a poll has ended (``latest`` hands it to readers that came before)."""

    def poll(self) -> FleetView:
        """The last view while it is younger than ``max_age`` or while another reader's poll runs
        (its ``taken_at`` says its age); else a new poll. Only the very first poll is waited for
        (it ends by its deadline: ``poll_fleet``)."""
        last = self._last
        if last is not None and time.monotonic() - last[0] < self.max_age:
            return last[1]
        if last is None:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            return last[1]  # a poll runs: readers never queue behind it
        try:
            last = self._last
            if last is not None and time.monotonic() - last[0] < self.max_age:
                return last[1]
            return self._polled()
        finally:
            self._lock.release()

    def latest(self) -> FleetView | Future[FleetView]:
        """What a reader that must never wait gets (``serve --fleet``'s /v1/fleet): the last view
        at once, a poll started in a thread of its own where it is older than ``max_age`` and none
        runs. Before any poll has ended: the first one's Future (the API awaits it without holding
        a thread; it ends by the poll's deadline)."""
        last = self._last
        if (last is None or time.monotonic() - last[0] >= self.max_age) and self._lock.acquire(blocking=False):
            threading.Thread(target=self._poll_then_release, name="radixtop-fleet-poll", daemon=True).start()
        return last[1] if last is not None else self._first

    def _poll_then_release(self) -> None:
        try:
            self._polled()
        finally:
            self._lock.release()

    def _polled(self) -> FleetView:
        """A new poll, kept as the last view (the lock held). A bug in it is the view's error."""
        try:
            view = poll_fleet(self.source, self.tokens, self.timeout, self.bytes_per_token)
        except Exception as exc:  # poll_fleet says every failure of a source or worker in its view
            view = FleetView(self.source.label, (), time.time(), 0.0, error=f"{type(exc).__name__}: {exc}")
        self._last = (time.monotonic(), view)
        if not self._first.done():
            self._first.set_result(view)
        return view

    def token_for(self, row: WorkerRow) -> str | None:
        """The token for actions on ``row``'s radixtop: the tokens file's entry for that URL, or
        for the worker, as the polls send them (``read_worker``): a URL the port rule guessed gets
        only its own entry, never the worker's (the engine's API key)."""
        if row.radixtop_url and row.radixtop_url in self.tokens:
            return self.tokens[row.radixtop_url]
        return None if row.by_rule else self.tokens.get(row.worker)
