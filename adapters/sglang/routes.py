"""SGLangRoutesAdapter: cache totals, close and flush of a plain SGLang server, over its own routes.

For a server with neither the radixtop plugin nor KV events. Totals come from ``/v1/loads``
(``/get_load`` before it), ``/metrics`` (only with ``--enable-metrics``) and ``/server_info``
(``/get_server_info`` before it); close goes through ``/close_session`` and flush through
``/flush_cache``. There is no tree and no session list: SGLang exposes neither over HTTP.

How SGLang counts a DP rank's pool (``pool_stats_observer._get_token_info``):
``num_used = max_total_num_tokens - (available + evictable)``, i.e. every slot that cannot be
taken now: tree nodes locked by running requests plus the requests' own slots. So:
capacity = ``max_total_num_tokens`` (/v1/loads), unevictable = ``num_used_tokens`` (/v1/loads,
republished on every idle loop; SGLang's protected, session_held and uncached together),
available = ``sglang:kv_available_tokens`` (/metrics), evictable =
the rest (what ``sglang:kv_evictable_tokens`` says when both are read at once; the metrics are
refreshed per batch and only every 30 s when idle, so the fresher /v1/loads figure wins).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.errors import (
    AdapterError,
    BadRequest,
    TargetTimeout,
    TargetUnreachable,
    Unsupported,
    read_only,
)
from radixtop.adapters.http.bounded import deadline
from radixtop.adapters.http.routes import MAX_REPLY_BYTES, Samples, ServerRoutes
from radixtop.adapters.http.routes import parse_metrics as parse_samples
from radixtop.adapters.http.wire import MAX_COUNT, WireError, count, is_count
from radixtop.adapters.model import (
    Capabilities,
    ChainView,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    EvictResultView,
    FlushResultView,
    Geometry,
    MatchView,
    NodeDetail,
    SessionDetail,
    SessionsPage,
    Stats,
)

CLOSE_POLICY = "blind"
"""SGLang answers /close_session with an empty 200 and frees later (0.5.16 frees the session's
chains; 0.5.23 only dereferences them): freed tokens are what a re-read of the totals shows."""
PLUGIN_HINT = ("start SGLang with the radixtop plugin (SGLANG_PLUGINS=radixtop) and point radixtop "
               "at the plugin's admin API")
TREE_HINT = (PLUGIN_HINT + ", or give radixtop the server's KV events (--kv-events-config) "
             "for a read-only tree")
GAUGES = ("sglang:kv_available_tokens", "sglang:kv_evictable_tokens", "sglang:kv_used_tokens",
          "sglang:num_used_tokens", "sglang:max_total_num_tokens")
COUNTERS = ("sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:evicted_tokens_total")
RANK_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")


def parse_metrics(text: str, names: tuple[str, ...] = GAUGES + COUNTERS) -> dict[str, Samples]:
    """SGLang's KV pool gauges and counters in ``text`` (``routes.parse_metrics``)."""
    return parse_samples(text, names)


def _rank_key(labels: dict[str, str]) -> tuple[int, ...]:
    return tuple(int(v) if (v := labels.get(name, "0")).isdigit() else 0 for name in RANK_LABELS)


def rank_sum(samples: Samples, dp_rank: int | None) -> int | None:
    """A metric summed over DP ranks (or only ``dp_rank``), one scheduler per DP rank: every
    TP/PP rank of one DP rank reports the same pool, so only the lowest one counts. Series with
    no ``dp_rank`` label are the one rank of a server without DP. None when nothing matches."""
    groups: dict[str | None, Samples] = {}
    for labels, value in samples:
        groups.setdefault(labels.get("dp_rank"), []).append((labels, value))
    if dp_rank is not None:
        groups = {k: g for k, g in groups.items() if k == str(dp_rank) or (k is None and dp_rank == 0)}
    if not groups:
        return None
    total = 0.0
    for group in groups.values():
        lowest = min(_rank_key(labels) for labels, _ in group)
        total += sum(value for labels, value in group if _rank_key(labels) == lowest)
    return min(int(round(total)), MAX_COUNT)


def _capacity(load: dict[str, Any]) -> int | None:
    """A /v1/loads rank's capacity (``max_total_num_tokens``, or its ``memory.token_capacity``);
    None where it gives neither; WireError where it is not a count."""
    value = load.get("max_total_num_tokens")
    if value is None or value == 0:
        memory = load.get("memory")
        value = memory.get("token_capacity") if isinstance(memory, dict) else None
    return None if value is None else count(value, "max_total_num_tokens")


def _size(value: Any) -> int:
    """A size from /server_info (tp_size, page_size, ...): 1 where absent or not a count >= 1."""
    return value if is_count(value) and value >= 1 else 1


@dataclass(frozen=True)
class Totals:
    """One read of the server: token counts (summed over the DP ranks asked for) and what it
    could see."""

    capacity: int
    unevictable: int
    """What SGLang's routes count as used: locked nodes and running requests' slots together."""
    available: int
    evictable: int
    prompt: int
    cached: int
    evicted: int
    metrics: bool
    """/metrics answered (the server runs with --enable-metrics)."""
    split: bool
    """Available and evictable told apart (needs sglang:kv_available_tokens)."""


class SGLangRoutesAdapter(CacheAdapter):
    """A plain SGLang server as a target: totals, blind close, flush; nothing per node or session.

    ``dp_rank``: one DP rank's pool (None: the sum of all). The tokenizer's prompt and cached
    counters are server-wide either way. ``geometry`` or ``bytes_per_token`` give bytes (HTTP
    does not tell them). ``api_key``: the server's ``--api-key``, sent as a Bearer token.
    ``settle_s``: how long a close waits before re-reading the totals it reports as freed.
    ``timeout``: wall clock over one read of the totals (its two to five requests); a reply over
    ``max_reply_bytes`` is stopped. A number of the wrong type in a reply is a WireError.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, dp_rank: int | None = None,
                 geometry: Geometry | None = None, bytes_per_token: int = 0, timeout: float = 5.0,
                 name: str | None = None, settle_s: float = 0.2, max_reply_bytes: int = MAX_REPLY_BYTES):
        if dp_rank is not None and dp_rank < 0:
            raise BadRequest(f"dp_rank must be >= 0, got {dp_rank}")
        self._routes = ServerRoutes(base_url, api_key=api_key, timeout=timeout, max_reply_bytes=max_reply_bytes,
                                    server="SGLang", refused="pass the server's --api-key (its --admin-api-key for /flush_cache)")
        url = self.url = self._routes.url
        self.dp_rank, self.geometry, self.timeout = dp_rank, geometry, timeout
        self.bytes_per_token = bytes_per_token or (geometry.bytes_per_token if geometry else 0)
        self._rank_note = "" if dp_rank is None else f" (DP rank {dp_rank})"
        self._named = name is not None
        self.name = name or f"SGLang at {url}{self._rank_note}"
        self.settle_s, self.max_reply_bytes = settle_s, max_reply_bytes
        self.read_only = False
        """Refuse close and flush here, before any request (``radixtop serve --read-only``)."""
        self._lock = threading.Lock()
        self._info: dict[str, Any] | None = None
        self._loads_route = "/v1/loads"
        self._closes = self._freed_by_close = 0

    def __repr__(self) -> str:
        return f"SGLangRoutesAdapter({self.url!r})"

    # ----- transport -----

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request of ``ServerRoutes.send``; a timeout or a lost connection forgets the
        server's info (it may come back as another one)."""
        try:
            return self._routes.send(method, path, **kwargs)
        except (TargetTimeout, TargetUnreachable):
            self._info = None
            raise

    def _fail(self, response: httpx.Response) -> NoReturn:
        self._routes.fail(response)

    def _get_json(self, path: str, params: dict[str, Any] | None = None) -> Any | None:
        try:
            return self._routes.get_json(path, params)
        except (TargetTimeout, TargetUnreachable):
            self._info = None
            raise

    # ----- reads -----

    def _server_info(self) -> dict[str, Any]:
        """/server_info (or /get_server_info), kept: what it is read for does not change."""
        if self._info is None:
            info = self._get_json("/server_info")
            if info is None:
                info = self._get_json("/get_server_info")
            self._info = info if isinstance(info, dict) else {}
        return self._info

    def _loads(self) -> list[dict[str, Any]] | None:
        """Per DP rank ``{capacity, unevictable}`` (capacity None when the route omits it);
        None when the server has neither /v1/loads nor /get_load."""
        params = {} if self.dp_rank is None else {"dp_rank": self.dp_rank}
        if self._loads_route == "/v1/loads":
            body = self._get_json("/v1/loads", params)
            if body is not None:
                try:
                    return [{"capacity": _capacity(load), "unevictable": count(load["num_used_tokens"],
                                                                                "num_used_tokens")}
                            for load in body["loads"]]
                except WireError as exc:
                    raise WireError(f"unexpected /v1/loads body from {self.url}: {exc.message}") from None
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise WireError(f"unexpected /v1/loads body from {self.url}: {exc!r}") from None
            self._loads_route = "/get_load"  # before /v1/loads (removed again in 0.5.23)
        body = self._get_json("/get_load")
        if body is None:
            return None
        try:  # num_pending_tokens = num_total_tokens - num_used_tokens, num_tokens = num_total_tokens
            return [{"capacity": None,
                     "unevictable": max(count(row["num_tokens"], "num_tokens")
                                        - count(row.get("num_pending_tokens", 0), "num_pending_tokens"), 0)}
                    for row in body if self.dp_rank is None or row.get("dp_rank", 0) == self.dp_rank]
        except WireError as exc:
            raise WireError(f"unexpected /get_load body from {self.url}: {exc.message}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WireError(f"unexpected /get_load body from {self.url}: {exc!r}") from None

    def _metrics(self) -> dict[str, Samples] | None:
        response = self._send("GET", "/metrics")
        if response.status_code == 404:
            return None
        if not response.is_success:
            self._fail(response)
        return parse_metrics(response.text)

    def _capacity_from_info(self, info: dict[str, Any]) -> int | None:
        states = info.get("internal_states")
        if isinstance(states, list) and states:
            if self.dp_rank is not None:
                states = states[self.dp_rank : self.dp_rank + 1]
            caps = [(s.get("memory_usage") or {}).get("token_capacity")
                    for s in states if isinstance(s, dict) and isinstance(s.get("memory_usage") or {}, dict)]
            if caps and all(is_count(c) for c in caps):
                return min(sum(caps), MAX_COUNT)
        top = info.get("max_total_num_tokens")
        return top if is_count(top) else None

    def _evicted(self, samples: Samples, info: dict[str, Any]) -> int:
        """Before 0.5.23 the radix cache's counter has no rank labels, and SGLang's multiprocess
        registry sums it over every scheduler process: divide by the processes per DP rank."""
        if any("tp_rank" in labels for labels, _ in samples):
            return rank_sum(samples, self.dp_rank) or 0
        tp, dp, pp = (_size(info.get(k)) for k in ("tp_size", "dp_size", "pp_size"))
        per_rank = (tp // dp if info.get("enable_dp_attention") else tp) * pp
        return int(sum(v for _, v in samples)) // max(per_rank, 1)

    def read(self) -> Totals:
        """One consistent-as-SGLang-allows read of the totals (two or three requests), all within
        ``timeout``."""
        with deadline(self.timeout):
            info = self._server_info()
            loads = self._loads()
            metrics = self._metrics()
        if not info and loads is None:
            raise AdapterError(f"{self.url} does not look like an SGLang server: /server_info, "
                               "/get_server_info, /v1/loads and /get_load all answer 404")
        if self.dp_rank is not None and loads == []:
            raise BadRequest(f"{self.url} has no DP rank {self.dp_rank}")
        m = metrics or {}

        def gauge(name: str) -> int | None:
            return rank_sum(m.get(name, []), self.dp_rank)

        if loads and all(is_count(r["capacity"]) for r in loads):
            capacity = min(sum(r["capacity"] for r in loads), MAX_COUNT)
        else:
            capacity = self._capacity_from_info(info) or gauge("sglang:max_total_num_tokens") or 0
        unevictable = min(sum(r["unevictable"] for r in loads), MAX_COUNT) if loads else \
            gauge("sglang:kv_used_tokens") or gauge("sglang:num_used_tokens") or 0
        unevictable = min(max(unevictable, 0), capacity)
        room = capacity - unevictable
        available, evictable = gauge("sglang:kv_available_tokens"), gauge("sglang:kv_evictable_tokens")
        if available is not None:
            available = min(max(available, 0), room)
        elif evictable is not None:
            available = room - min(max(evictable, 0), room)
        else:
            available = room
        return Totals(capacity, unevictable, available, room - available,
                      rank_sum(m.get("sglang:prompt_tokens_total", []), None) or 0,
                      rank_sum(m.get("sglang:cached_tokens_total", []), None) or 0,
                      self._evicted(m.get("sglang:evicted_tokens_total", []), info),
                      metrics is not None, available is not None or evictable is not None)

    def capabilities(self) -> Capabilities:
        totals = self.read()
        notes = ["plain SGLang HTTP (no radixtop plugin, no KV events): cache totals only; no tree "
                 f"and no session list (SGLang serves neither): for them {TREE_HINT}",
                 "close is blind: SGLang answers an empty 200 and frees later (0.5.23 only "
                 "dereferences), so the tokens a close reports freed are the change in available tokens "
                 "seen on a re-read (SGLang refreshes its KV metrics per batch, every 30 s when idle)",
                 "no evict (SGLang has no route for it; flush drops the whole cache, only when idle)"]
        if not totals.metrics:
            notes.append("no /metrics (start SGLang with --enable-metrics): available and evictable "
                         "are not told apart, and the prompt, cached and evicted counters read 0")
        elif not totals.split:
            notes.append("/metrics has no KV pool gauges yet (SGLang sets them after its first "
                         "batch, or within 30 s when idle): available and evictable are not told apart")
        if not self.bytes_per_token:
            notes.append("bytes unknown over HTTP (give a model geometry)")
        if self.dp_rank is not None:
            notes.append(f"DP rank {self.dp_rank} only; the prompt and cached counters (and before "
                         "SGLang 0.5.23 the evicted one) are server-wide")
        if self.read_only:
            notes.insert(0, "read-only: close and flush refused")
        return Capabilities(tree=False, sessions=False, close=not self.read_only, evict=False,
                            flush=not self.read_only, changes=False, read_only=self.read_only,
                            reason="; ".join(notes) + ".")

    def stats(self) -> Stats:
        t = self.read()
        info, bpt = self._info or {}, self.bytes_per_token
        page_size = _size(info.get("page_size"))
        geometry = self.geometry or Geometry("unknown", 0, 0, 0, "unknown", page_size, bpt)
        version = info.get("version")
        target = self.name
        if version and not self._named:
            target = f"SGLang {version} at {self.url}{self._rank_note}"
        with self._lock:
            closes, freed_by_close = self._closes, self._freed_by_close
        # SGLang's routes count locked tree nodes and running requests' own slots as one number
        # and say nothing of nodes: the split of the unevictable tokens is unknown, the tree's
        # known tokens are the evictable ones.
        return Stats(target=target, capacity_tokens=t.capacity, available_tokens=t.available,
                     evictable_tokens=t.evictable, protected_tokens=None, session_held_tokens=None,
                     uncached_tokens=None, unevictable_tokens=t.unevictable, total_tokens=t.evictable,
                     bytes_per_token=bpt,
                     node_count=None, open_sessions=None, closed_sessions=None, prompt_tokens=t.prompt,
                     cached_tokens=t.cached, evicted_tokens=t.evicted, closes=closes,
                     freed_by_close_tokens=freed_by_close, version=0, geometry=geometry)

    # ----- what plain HTTP cannot serve -----

    def _no_tree(self, what: str) -> NoReturn:
        raise Unsupported(f"{self.name} serves no {what} over plain HTTP: {TREE_HINT}")

    def _no_sessions(self, what: str) -> NoReturn:
        raise Unsupported(f"{self.name} lists no sessions over plain HTTP, so it cannot {what}: "
                          f"{PLUGIN_HINT} (KV events carry no sessions either)")

    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        self._no_tree("tree")

    def chain(self, node_id: int, limit: int = 10_000) -> ChainView:
        self._no_tree("tree")

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail:
        self._no_tree("tree nodes")

    def match(self, tokens: list[int]) -> MatchView:
        self._no_tree("prefix match")

    def changes(self, since: int) -> Changes:
        self._no_tree("change journal")

    def export(self) -> Iterator[dict[str, Any]]:
        self._no_tree("export")

    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        self._no_sessions("list sessions")

    def session(self, session_id: str) -> SessionDetail:
        self._no_sessions(f"show session {session_id!r}")

    def plan_close(self, session_id: str) -> ClosePlanView:
        self._no_sessions(f"plan the close of {session_id!r} (close itself works, blind)")

    # ----- actions -----

    def close_session(self, session_id: str) -> CloseResultView:
        """POST /close_session, then re-read: SGLang says nothing of what it freed (an empty
        200, for unknown ids too), so ``freed_tokens`` is the rise in available tokens seen
        ``settle_s`` later (0 where SGLang only dereferences, or its metrics lag)."""
        if not session_id:
            raise BadRequest("a session id is required")
        if self.read_only:
            raise read_only(self.name, f"close of session {session_id!r}")
        before = self.read()
        response = self._send("POST", "/close_session", json={"session_id": session_id})
        if not response.is_success:
            self._fail(response)
        if self.settle_s > 0:
            time.sleep(self.settle_s)
        freed = max(self.read().available - before.available, 0)
        with self._lock:
            self._closes += 1
            self._freed_by_close += freed
        return CloseResultView(session_id, CLOSE_POLICY, already_closed=False, freed_node_ids=(),
                               freed_tokens=freed, freed_bytes=freed * self.bytes_per_token,
                               released_holds=0)

    def evict(self, num_tokens: int) -> EvictResultView:
        raise Unsupported(f"{self.name}: SGLang has no route to evict part of the cache (flush drops "
                          f"all of it when idle); to evict, {PLUGIN_HINT}")

    def flush(self) -> FlushResultView:
        """POST /flush_cache. SGLang flushes only when nothing runs or waits and answers 400
        otherwise: that is ``flushed=False`` with its reason. A flush frees every slot (tree
        reset, allocator cleared): what was not available before is what it freed."""
        if self.read_only:
            raise read_only(self.name, "flush")
        before = self.read()
        response = self._send("POST", "/flush_cache")
        text = response.text.strip()
        if response.status_code == 400:
            return FlushResultView(0, 0, 0, False, f"SGLang refused: {text or 'Flush cache failed.'} "
                                   "(it flushes only when no request is running or waiting)")
        if not response.is_success:
            self._fail(response)
        if not before.split:
            return FlushResultView(0, None, 0, True, "flushed; freed tokens unknown (the server has no "
                                   "KV pool metrics: start it with --enable-metrics)")
        freed = before.capacity - before.available
        return FlushResultView(freed, None, freed * self.bytes_per_token, True,
                               f"flushed: the whole cache ({freed:,} tokens) was dropped")

    def release(self) -> None:
        self._routes.close()
