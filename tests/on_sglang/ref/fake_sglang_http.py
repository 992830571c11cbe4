"""A stand-in for SGLang's own HTTP server (0.5.16 or 0.5.23), for tests of ``SGLangRoutesAdapter``.

SGLang's server (``sglang/srt/entrypoints/http_server.py``) cannot start without a model and a
scheduler process behind it, so ``create_app(version)`` serves the routes radixtop's plain-HTTP
adapter uses, with SGLang's paths, methods, status codes and bodies, over a small in-memory KV
pool per DP rank (``FakeSGLang``). ``[v]`` below is ``sglang/srt/`` of that version's wheel.

SGLang's own code, run here from the installed wheel of the asked version (found on disk, never
imported as the ``sglang`` package, which would load torch and take seconds):
- ``LoadSnapshot`` and its section structs with their ``to_dict()`` (the /v1/loads body):
  the class definitions of ``[v]managers/load_snapshot.py``, compiled alone (its SHM and ZMQ
  transport is left out);
- ``auth_level`` and ``add_api_key_middleware`` (``[v]utils/auth.py``, loaded by path): the same
  Bearer checks, 401 body, ADMIN_OPTIONAL level of /flush_cache, and /metrics left open;
- the metric names, their kinds and extra label names: read (``ast``) from
  ``[v]observability/metrics_collector.py``; ``create_app`` refuses to emit one SGLang lacks.
Copies, with line references (they call into SGLang's TokenizerManager and scheduler): the route
handlers, the /server_info and /get_load bodies, the pool accounting of
``pool_stats_observer._get_token_info`` and the metric label sets. The /metrics text is made by
the real ``prometheus_client`` from a per-app registry (SGLang uses the multiprocess collector,
which drops the ``*_created`` samples a plain registry adds).
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from http import HTTPStatus
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import msgspec
import msgspec.structs
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, make_asgi_app
from pydantic import BaseModel
from starlette.routing import Mount

VERSIONS = ("0.5.16", "0.5.23")
REPO = Path(__file__).resolve().parents[3]
MODEL = "fake-model"


# ----- SGLang's own code, from the wheel on disk -----


@cache
def sglang_source(version: str) -> Path | None:
    """``sglang/srt`` of an installed sglang ``version`` (this interpreter's, or a venv of the repo)."""
    dirs = [Path(p) for p in sys.path if p] + sorted(REPO.glob(".venv*/lib/python3*/site-packages"))
    for site in dirs:
        if (site / f"sglang-{version}.dist-info").is_dir() and (site / "sglang" / "srt").is_dir():
            return site / "sglang" / "srt"
    return None


def _srt(version: str) -> Path:
    src = sglang_source(version)
    if src is None:
        raise RuntimeError(f"sglang {version} is not installed here (.venv has 0.5.16, "
                           f".venv-sglang23 0.5.23)")
    return src


@cache
def load_snapshot_module(version: str) -> ModuleType:
    """``LoadSnapshot`` and its section structs, compiled from ``[v]managers/load_snapshot.py``."""
    path = _srt(version) / "managers" / "load_snapshot.py"
    wanted = {"MemoryMetrics", "SpeculativeMetrics", "LoRAMetrics", "DisaggregationMetrics",
              "QueueMetrics", "LoadSnapshot", "_CORE_KEYS", "_SECTION_FIELDS"}
    body = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name in wanted:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in wanted for t in node.targets):
            body.append(node)
    module = ModuleType(f"sglang_{version.replace('.', '_')}_load_snapshot")
    module.__dict__.update(msgspec=msgspec, Optional=Optional)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module


@cache
def auth_module(version: str) -> ModuleType:
    """``[v]utils/auth.py`` as it is (it imports nothing from sglang)."""
    path = _srt(version) / "utils" / "auth.py"
    spec = importlib.util.spec_from_file_location(f"sglang_{version.replace('.', '_')}_auth", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up while it is being built
    spec.loader.exec_module(module)
    return module


@cache
def metric_specs(version: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{name: (kind, extra label names)}`` of every ``sglang:`` metric that
    ``[v]observability/metrics_collector.py`` defines (extra: beyond the collector's labels)."""
    tree = ast.parse((_srt(version) / "observability" / "metrics_collector.py").read_text())
    specs = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        name = kw.get("name")
        if not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
            continue
        extra = tuple(c.value for c in ast.walk(kw["labelnames"]) if isinstance(c, ast.Constant)
                      and isinstance(c.value, str)) if "labelnames" in kw else ()
        specs[name.value] = (node.func.id, extra)
    return specs


# ----- the pool behind the routes -----


@dataclass
class RankPool:
    """One DP rank's KV pool, counted the way ``pool_stats_observer._get_token_info`` does
    ([16] ``managers/scheduler_components/pool_stats_observer.py:216-226``)."""

    capacity: int
    evictable: int = 0
    """Unlocked radix-tree tokens (``tree_cache.evictable_size()``)."""
    held: int = 0
    """Locked tree tokens plus running requests' own slots (``num_used``)."""
    running_reqs: int = 0
    waiting_reqs: int = 0
    sessions: dict[str, int] = field(default_factory=dict)
    """Tokens each session's tagged chain would free on close (part of ``evictable``)."""

    @property
    def available(self) -> int:
        return self.capacity - self.evictable - self.held


class CloseSessionBody(BaseModel):
    """``CloseSessionReqInput`` ([16] ``managers/io_struct.py:1922``, [23] ``:2436``)."""

    session_id: str


class FakeSGLang:
    """The state behind the app: pools, counters, and what the routes were asked."""

    def __init__(self, version: str, *, dp_size: int = 1, tp_size: int = 1, capacity: int = 4096,
                 enable_metrics: bool = True, api_key: str | None = None, page_size: int = 1):
        if version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
        self.version, self.dp_size, self.tp_size = version, dp_size, tp_size
        self.enable_metrics, self.api_key, self.page_size = enable_metrics, api_key, page_size
        self.ranks = [RankPool(capacity) for _ in range(dp_size)]
        self.prompt_tokens = self.cached_tokens = 0
        self.evicted = [0] * dp_size
        self.calls: list[tuple[str, str, Any]] = []
        """(method, path, JSON body or None) of every request, in order."""
        self.delay_s = 0.0
        """Every answer waits this long (a slow server)."""
        self.startup_time = time.time()
        self.lock = threading.Lock()
        self.registry = CollectorRegistry()
        self._metrics = self._define_metrics() if enable_metrics else {}
        self._publish()

    # ----- what a test does to the server -----

    def finish_request(self, prompt: int, cached: int, *, session_id: str | None = None,
                       rank: int = 0) -> None:
        """A request finished: its uncached prompt tokens join the tree (evictable), tagged
        by its session; the tokenizer counts its prompt and cached tokens."""
        with self.lock:
            pool, new = self.ranks[rank], prompt - cached
            pool.evictable += new
            if session_id is not None:
                pool.sessions[session_id] = pool.sessions.get(session_id, 0) + new
            self.prompt_tokens += prompt
            self.cached_tokens += cached
            self._count_request(prompt, cached)
            self._publish()

    def run(self, tokens: int, *, rank: int = 0, waiting: int = 0) -> None:
        """A request starts running and holds ``tokens`` (its locked prefix and its own slots)."""
        with self.lock:
            pool = self.ranks[rank]
            pool.held += tokens
            pool.running_reqs += 1
            pool.waiting_reqs += waiting
            self._publish()

    def evict(self, tokens: int, *, rank: int = 0) -> None:
        """The radix cache evicted ``tokens`` (``update_eviction_metrics``, [16]
        ``mem_cache/base_prefix_cache.py:232-237``) in every TP rank's copy of the tree."""
        with self.lock:
            self.ranks[rank].evictable -= tokens
            self.evicted[rank] += tokens
            if self.enable_metrics:
                counter = self._metrics["sglang:evicted_tokens_total"]
                for tp_rank in range(self.tp_size):
                    if self.version == "0.5.16":  # no rank labels: the multiprocess registry sums them
                        counter.labels(cache_type="RadixCache").inc(tokens)
                    else:
                        counter.labels(cache_type="UnifiedRadixCache", tp_rank=tp_rank, pp_rank=0,
                                       dp_rank=rank).inc(tokens)
            self._publish()

    # ----- what the routes do (SGLang's scheduler side) -----

    def close_session(self, session_id: str) -> None:
        """0.5.16 ``release_radix_session`` frees the session's chains now; 0.5.23 only
        dereferences (frees nothing; eviction takes them later). Unknown ids are ignored."""
        with self.lock:
            for pool in self.ranks:
                tokens = pool.sessions.pop(session_id, 0)
                if self.version == "0.5.16":
                    pool.evictable -= tokens
            self._publish()

    def flush_cache(self) -> bool:
        """``Scheduler.flush_cache`` ([16] ``managers/scheduler.py:3846``): only when idle."""
        with self.lock:
            if any(p.running_reqs or p.waiting_reqs for p in self.ranks):
                return False
            for pool in self.ranks:
                pool.evictable, pool.held = 0, 0
                pool.sessions.clear()
            self._publish()
            return True

    # ----- bodies -----

    def loads(self, dp_rank: int | None) -> list[Any]:
        """One ``LoadSnapshot`` per rank, filled as ``SchedulerLoadInquirer.get_loads`` does
        ([16] ``managers/scheduler_components/load_inquirer.py:87-208``)."""
        ls = load_snapshot_module(self.version)
        if dp_rank is not None and not 0 <= dp_rank < self.dp_size:
            return []  # TokenizerManager.get_loads ([16] managers/tokenizer_control_mixin.py:843-846)
        out = []
        with self.lock:
            for rank, pool in enumerate(self.ranks):
                if dp_rank is not None and rank != dp_rank:
                    continue
                used = pool.capacity - pool.available - pool.evictable
                queues = dict(waiting=pool.waiting_reqs, grammar=0, paused=0, retracted=0)
                if self.version == "0.5.23":
                    queues["prealloc_ready"] = 0
                out.append(ls.LoadSnapshot(
                    dp_rank=rank, timestamp=time.time(), num_running_reqs=pool.running_reqs,
                    num_waiting_reqs=pool.waiting_reqs, num_used_tokens=used, num_total_tokens=used,
                    max_total_num_tokens=pool.capacity, max_running_requests=128,
                    token_usage=round(used / pool.capacity, 4),
                    memory=ls.MemoryMetrics(weight_gb=1.0, kv_cache_gb=0.5, graph_gb=0.1,
                                            token_capacity=pool.capacity),
                    disaggregation=ls.DisaggregationMetrics(mode="null"),
                    queues=ls.QueueMetrics(**queues)))
        return out

    def server_args(self) -> dict[str, Any]:
        """A few of ``ServerArgs``' fields (the real body carries all of them)."""
        return {"model_path": MODEL, "served_model_name": MODEL, "tp_size": self.tp_size,
                "dp_size": self.dp_size, "pp_size": 1, "enable_dp_attention": False,
                "page_size": self.page_size, "enable_metrics": self.enable_metrics,
                "api_key": self.api_key, "kv_events_config": None}

    def internal_state(self, pool: RankPool) -> dict[str, Any]:
        """``Scheduler.get_internal_state`` ([16] ``managers/scheduler.py:3876-3887``; [23]
        ``managers/scheduler_components/internal_state.py:45-88`` and ``memory_usage.py:15-41``)."""
        if self.version == "0.5.16":
            memory = {"weight": 1.0, "kvcache": 0.5, "token_capacity": pool.capacity, "graph": 0.1}
            return {**self.server_args(), "last_gen_throughput": 0.0, "memory_usage": memory,
                    "effective_max_running_requests_per_dp": 128}
        memory = {"weight": 1.0, "kvcache": 0.5, "startup_available": 70.0,
                  "token_capacity": pool.capacity, "token_capacity_swa": None, "graph": {"decode": 0.1}}
        return {**self.server_args(), "world_size": self.tp_size * self.dp_size,
                "startup_time": self.startup_time, "effective_max_running_requests_per_dp": 128,
                "last_gen_throughput": 0.0, "memory_usage": memory}

    def server_info(self) -> dict[str, Any]:
        """[16] ``entrypoints/http_server.py:743-765``; [23] ``:863-888`` (``build_server_info``,
        ``utils/common.py:3584-3593``). ``scheduler_info`` is ``Scheduler.get_init_info``."""
        scheduler_info = {"status": "ready", "max_total_num_tokens": self.ranks[0].capacity,
                          "max_req_input_len": 8192}
        internal = [self.internal_state(p) for p in self.ranks]
        if self.version == "0.5.16":
            return {**self.server_args(), **scheduler_info, "internal_states": internal,
                    "version": self.version, "kv_events": None}
        scheduler_info.update(startup_time=self.startup_time, hicache_object_layout={})
        return {**self.server_args(), "launch_command": f"sglang serve --model-path {MODEL}",
                **scheduler_info, "kv_events": None, "startup_time": self.startup_time,
                "internal_states": internal, "version": self.version, "frontend": "python"}

    # ----- /metrics -----

    def _scheduler_labels(self, rank: int, tp_rank: int) -> dict[str, Any]:
        """``SchedulerMetricsCollector.init_new`` ([16] ``observability/metrics_collector.py:
        1070-1080``, [23] ``:1382-1392``): ``dp_rank`` only when the server runs DP ranks."""
        labels = {"model_name": MODEL, "engine_type": "unified", "tp_rank": tp_rank, "pp_rank": 0,
                  "moe_ep_rank": 0}
        if self.dp_size > 1:
            labels["dp_rank"] = rank
        return labels

    def _define_metrics(self) -> dict[str, Any]:
        specs = metric_specs(self.version)
        sched = list(self._scheduler_labels(0, 0))
        tokenizer = ["model_name", "engine_type"]  # [16] managers/tokenizer_manager.py:566-569
        if self.version == "0.5.16":
            radix = ["cache_type"]  # [16] mem_cache/base_prefix_cache.py:218-230
        else:
            radix = ["cache_type", "tp_rank", "pp_rank", "dp_rank"]  # [23] metrics_collector.py:2416-2432
        streaming = ["is_streaming"] if self.version == "0.5.23" else []
        wanted = {
            "sglang:num_used_tokens": (Gauge, sched), "sglang:kv_available_tokens": (Gauge, sched),
            "sglang:kv_evictable_tokens": (Gauge, sched), "sglang:kv_used_tokens": (Gauge, sched),
            "sglang:token_usage": (Gauge, sched), "sglang:full_token_usage": (Gauge, sched),
            "sglang:num_running_reqs": (Gauge, sched), "sglang:num_queue_reqs": (Gauge, sched),
            "sglang:max_total_num_tokens": (Gauge, sched),
            "sglang:prompt_tokens_total": (Counter, tokenizer + streaming),
            "sglang:cached_tokens_total": (Counter, tokenizer + ["cache_source"]),
            "sglang:evicted_tokens_total": (Counter, radix),
        }
        metrics = {}
        for name, (kind, labels) in wanted.items():
            sg_kind, sg_extra = specs.get(name, (None, ()))
            if sg_kind != kind.__name__ or not set(sg_extra) <= set(labels):
                raise AssertionError(f"sglang {self.version} defines {name} as {sg_kind} with extra "
                                     f"labels {sg_extra}; this fake would emit {kind.__name__} {labels}")
            metrics[name] = kind(name, f"{name} (fake)", labels, registry=self.registry)
        return metrics

    def _count_request(self, prompt: int, cached: int) -> None:
        """``TokenizerMetricsCollector.observe_one_finished_request`` ([16] ``:1651-1690``,
        [23] ``:2092-2134``): cached tokens by source (the GPU tree is ``device``)."""
        if not self.enable_metrics:
            return
        labels = {"model_name": MODEL, "engine_type": "unified"}
        stream = {"is_streaming": "false"} if self.version == "0.5.23" else {}
        self._metrics["sglang:prompt_tokens_total"].labels(**labels, **stream).inc(prompt)
        if cached > 0:
            self._metrics["sglang:cached_tokens_total"].labels(**labels, cache_source="device").inc(cached)

    def _publish(self) -> None:
        """``SchedulerMetricsCollector.log_stats`` and ``emit_constants`` of every scheduler that
        logs (one per DP rank; every TP rank, as with --enable-metrics-for-all-schedulers)."""
        if not self.enable_metrics:
            return
        m = self._metrics
        for rank, pool in enumerate(self.ranks):
            used = pool.capacity - pool.available - pool.evictable
            for tp_rank in range(self.tp_size):
                labels = self._scheduler_labels(rank, tp_rank)
                for name, value in (("num_used_tokens", used), ("kv_used_tokens", used),
                                    ("kv_available_tokens", pool.available),
                                    ("kv_evictable_tokens", pool.evictable),
                                    ("token_usage", round(used / pool.capacity, 2)),
                                    ("full_token_usage", used / pool.capacity),
                                    ("num_running_reqs", pool.running_reqs),
                                    ("num_queue_reqs", pool.waiting_reqs),
                                    ("max_total_num_tokens", pool.capacity)):
                    m[f"sglang:{name}"].labels(**labels).set(value)


# ----- the app -----


def create_app(version: str = "0.5.16", *, without: tuple[str, ...] = (), **options: Any) -> FastAPI:
    """SGLang's HTTP surface for cache control, as that version serves it. The state is
    ``app.state.sglang`` (a ``FakeSGLang``; ``options`` go to it). ``without``: paths left out,
    e.g. ``("/server_info", "/v1/loads")`` for a server from before those names."""
    sg = FakeSGLang(version, **options)
    auth = auth_module(version)
    app = FastAPI()
    app.state.sglang = sg

    @app.middleware("http")
    async def record_and_delay(request: Request, call_next):
        body = await request.body()
        try:
            payload = msgspec.json.decode(body) if body else None
        except msgspec.DecodeError:
            payload = body.decode(errors="replace")
        sg.calls.append((request.method, request.url.path, payload))
        if sg.delay_s:
            await asyncio.sleep(sg.delay_s)
        return await call_next(request)

    @app.get("/server_info")
    async def server_info():
        return sg.server_info()

    @app.get("/get_server_info")
    async def get_server_info():  # deprecated alias ([16] http_server.py:733, [23] :853)
        return await server_info()

    if version == "0.5.16":  # removed in 0.5.23

        @app.get("/get_load")
        async def get_load():
            """[16] ``http_server.py:768-795``: the snapshot projected to the old fields."""
            ts = time.perf_counter()
            return [{"dp_rank": r.dp_rank, "num_reqs": r.num_running_reqs + r.num_waiting_reqs,
                     "num_waiting_reqs": r.num_waiting_reqs, "num_tokens": r.num_total_tokens,
                     "num_pending_tokens": r.num_total_tokens - r.num_used_tokens, "ts_tic": ts}
                    for r in sg.loads(None)]

    @app.get("/v1/loads")
    async def get_loads(dp_rank: Optional[int] = None, include: Optional[str] = None,
                        format: Optional[str] = None):
        """[16] ``entrypoints/v1_loads.py:72-122``, [23] ``:96-150`` (JSON format only)."""
        include_set = {s.strip() for s in include.split(",")} if include else None
        try:
            loads = [load.to_dict(include_set) for load in sg.loads(dp_rank)]
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e))
        body: dict[str, Any] = {"timestamp": datetime.now(timezone.utc).isoformat(), "version": version}
        if version == "0.5.23":
            body.update(accelerator=None, num_accelerators=sg.tp_size)
        body["loads"] = loads
        return body

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    @auth.auth_level(auth.AuthLevel.ADMIN_OPTIONAL)
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)):
        """[16] ``http_server.py:905-922``, [23] ``:1025-1042``; a refusal carries no message
        when the scheduler is simply busy (``flush_wrapper.py:32-33``)."""
        if sg.flush_cache():
            content = ("Cache flushed.\nPlease check backend logs for more details. "
                       "(When there are running or waiting requests, the operation will not be performed.)\n")
            return Response(content=content, status_code=200)
        return Response(content="Flush cache failed.\n", status_code=HTTPStatus.BAD_REQUEST)

    @app.api_route("/close_session", methods=["GET", "POST"])
    async def close_session(obj: CloseSessionBody):
        """[16] ``http_server.py:1523-1530``, [23] ``:1700-1707``: an empty 200; the scheduler
        releases the session later ([16] ``managers/scheduler.py:4421-4427``)."""
        try:
            sg.close_session(obj.session_id)
            return Response(status_code=200)
        except Exception as e:
            return JSONResponse({"error": {"message": str(e)}}, status_code=HTTPStatus.BAD_REQUEST)

    if sg.enable_metrics:  # add_prometheus_middleware ([16] utils/common.py:2303-2313)
        route = Mount("/metrics", make_asgi_app(registry=sg.registry))
        route.path_regex = re.compile("^/metrics(?P<path>.*)$")
        app.routes.append(route)

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in without]
    if sg.api_key:  # [16] http_server.py:2448-2459
        auth.add_api_key_middleware(app, api_key=sg.api_key, admin_api_key=None)
    return app
