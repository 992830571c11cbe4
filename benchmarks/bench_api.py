"""radixtop's admin API, served over real HTTP, on a cache of ~1M nodes and 10k sessions.

Run from the repository root:

    .venv/bin/python benchmarks/bench_api.py            # full run (~1M nodes; a few minutes)
    .venv/bin/python benchmarks/bench_api.py --quick    # CI smoke run (~100k nodes; < 60 s)

Prints Markdown tables and writes every raw number to ``benchmarks/results/api.json``.
See ``benchmarks/README.md`` for what each figure means.

The cache is built once: a ``Scheduler`` on a ``meta`` KV pool with the llama-3-8b geometry (shapes,
no memory), wrapped in ``Engine(scheduler, None).start()`` (the owner thread, no workload) and a
``BundledAdapter``, served by ``create_app`` on a real uvicorn server on loopback (a thread of this
process). Clients are ``httpx`` (raw bytes) and ``RadixtopClient`` (bytes decoded back into views), in
the main thread. Client, server and engine share one interpreter (one GIL) on this machine's cores,
so a served time is what a client pays for the whole round trip, server and client work included.

Sections:

1. ``reads``: served time per request (median, p95) of page reads: the root's children (order
   ``bytes`` and ``recency``), pages of 1000 under the node with 100k children, sessions (cached),
   stats, node detail; beside each the in-process adapter time and the engine-thread hold time.
2. ``cold``: the reads that attribute memory to sessions (``/v1/sessions``, ``/v1/nodes/{id}``),
   first call after a tree change, so attribution is recomputed inside the request.
3. ``export``: ``/v1/export`` streamed over HTTP (every line consumed and counted) against a bare
   iterative walk of the same tree, side by side in each repeat; peak RSS growth while the export
   streams; tracemalloc peak of ``adapter.export()`` alone against one dict per node.
4. ``attribution``: ``BundledAdapter._attribute`` for every session (10k), timed on the engine
   thread right after a tree change; the cost per session.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
import tracemalloc
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent

from _common import (  # noqa: E402
    Built,
    EngineHolds,
    TreeConfig,
    build_tree,
    change_tree,
    environment,
    finish,
    fmt_nodes,
    log,
    ms_stats,
    release,
    rss_bytes,
    start_engine,
    timed_adapter,
    verdict,
)
from _common import fmt_ms as _fmt_ms  # noqa: E402

pc = time.perf_counter


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------

# The forest's groups (branching, depth, weight): most are small agentic/tool-call trees, a few
# fan out wide.
API_GROUPS = ((2, 4, 20), (3, 3, 20), (4, 3, 15), (2, 6, 10), (3, 4, 10), (5, 3, 10),
              (8, 2, 10), (16, 2, 4), (50, 2, 0.6), (1000, 1, 0.4))

# 10k sessions of 1-8 turns that hold nodes at the end, and 100 more closed; one few-shot prompt
# with 100k children (sessionless); no chains; the forest up to 1M nodes.
API_TREE = TreeConfig(label="1M", target_nodes=1_000_000, sessions=10_000 + 100, closed_sessions=100,
                      turns=(1, 8), running_requests=64, fanouts=(100_000,), chains=(),
                      group_shapes=API_GROUPS, segment_len=(2, 16), token_pool=1 << 21, seed=7)


@dataclass(frozen=True)
class BenchConfig:
    mode: str
    tree: TreeConfig
    read_repeats: int  # warm reads per endpoint
    cold_repeats: int  # tree changes, each followed by cold reads
    export_repeats: int  # paired (bare walk, export) repeats
    client_export_repeats: int  # RadixtopClient.export() (decodes every line), context only
    page: int = 1000


def full_config() -> BenchConfig:
    return BenchConfig(mode="full", tree=API_TREE, read_repeats=30, cold_repeats=7,
                       export_repeats=5, client_export_repeats=2)


def quick_config() -> BenchConfig:
    return BenchConfig(
        mode="quick",
        tree=replace(API_TREE, label="100k", target_nodes=100_000, sessions=10_000 + 50, closed_sessions=50,
                     running_requests=16, fanouts=(10_000,)),
        read_repeats=8, cold_repeats=3, export_repeats=3, client_export_repeats=1,
    )


# Goals (see benchmarks/README.md for why these numbers).
GOAL_PAGE_MS = 100.0  # a page of 1000 rows, served
GOAL_SMALL_MS = 20.0  # stats, node detail: one small object, served
GOAL_COLD_MS = 500.0  # a read that recomputes attribution, served
GOAL_EXPORT_RATIO = 2.0  # HTTP export / bare walk
GOAL_EXPORT_MEMORY_SHARE = 0.2  # tracemalloc peak of export() / one dict per node
GOAL_HOLD_MS = 100.0  # engine thread held by one attribution (10k sessions)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


class RssSampler:
    """Samples this process's resident set (/proc/self/statm) every ``interval`` s in a thread."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.base = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self.base = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return False

    @property
    def growth(self) -> int:
        return self.peak - self.base


# ----------------------------------------------------------------------------------------------
# 1. warm reads
# ----------------------------------------------------------------------------------------------


def read_endpoints(built: Built, page: int) -> list[dict[str, Any]]:
    """(label, URL path and params, in-process call, RadixtopClient call) of each warm read."""
    fan_n = max(built.fanout_ids)  # the one few-shot prompt, its children
    fan = built.fanout_ids[fan_n]
    node_id = built.system_ids[0]
    return [
        {"key": "root_bytes", "label": f"root children, limit {page}, order bytes",
         "path": "/v1/nodes/root/children", "params": {"limit": page, "order": "bytes"},
         "call": lambda a: a.children(0, 0, page, "bytes"), "goal_ms": GOAL_PAGE_MS},
        {"key": "root_recency", "label": f"root children, limit {page}, order recency",
         "path": "/v1/nodes/root/children", "params": {"limit": page, "order": "recency"},
         "call": lambda a: a.children(0, 0, page, "recency"), "goal_ms": GOAL_PAGE_MS},
        {"key": "fanout_first", "label": f"{fan_n // 1000}k-children node, first page of {page}",
         "path": f"/v1/nodes/{fan}/children", "params": {"limit": page, "order": "bytes"},
         "call": lambda a: a.children(fan, 0, page, "bytes"), "goal_ms": GOAL_PAGE_MS},
        {"key": "fanout_deep", "label": f"{fan_n // 1000}k-children node, page at offset {fan_n // 2}",
         "path": f"/v1/nodes/{fan}/children", "params": {"offset": fan_n // 2, "limit": page, "order": "bytes"},
         "call": lambda a: a.children(fan, fan_n // 2, page, "bytes"), "goal_ms": GOAL_PAGE_MS},
        {"key": "sessions_cached", "label": f"sessions, limit {page} (cached attribution)",
         "path": "/v1/sessions", "params": {"limit": page},
         "call": lambda a: a.sessions("exclusive_bytes", 0, page), "goal_ms": GOAL_PAGE_MS},
        {"key": "stats", "label": "stats", "path": "/v1/stats", "params": {},
         "call": lambda a: a.stats(), "goal_ms": GOAL_SMALL_MS},
        {"key": "node", "label": "node detail (a system prompt; cached attribution)",
         "path": f"/v1/nodes/{node_id}", "params": {},
         "call": lambda a: a.node(node_id), "goal_ms": GOAL_SMALL_MS},
    ]


def measure_reads(cfg: BenchConfig, built: Built, adapter, holds: EngineHolds, client, remote) -> dict[str, Any]:
    """Every endpoint in turn, ``read_repeats`` rounds: in-process, httpx, RadixtopClient."""
    eps = read_endpoints(built, cfg.page)
    returned = {}
    for ep in eps:  # warm-up (also fills the attribution cache at this version)
        r = client.get(ep["path"], params=ep["params"])
        r.raise_for_status()
        body = r.json()
        returned[ep["key"]] = len(body.get("children", body.get("sessions", [None])))
        ep["call"](adapter)
    samples = {ep["key"]: {"adapter": [], "hold": [], "served": [], "client": [], "bytes": 0} for ep in eps}
    for k in range(cfg.read_repeats):
        for ep in eps if k % 2 == 0 else eps[::-1]:
            rec = samples[ep["key"]]
            t0 = pc()
            ep["call"](adapter)
            rec["adapter"].append(pc() - t0)
            m = holds.mark()
            t0 = pc()
            r = client.get(ep["path"], params=ep["params"])
            body = r.content
            rec["served"].append(pc() - t0)
            rec["hold"].append(holds.since(m))
            r.raise_for_status()
            rec["bytes"] = len(body)
            t0 = pc()
            ep["call"](remote)
            rec["client"].append(pc() - t0)
    out = {}
    for ep in eps:
        rec = samples[ep["key"]]
        out[ep["key"]] = {
            "label": ep["label"], "path": ep["path"], "params": ep["params"], "rows": returned[ep["key"]],
            "goal_ms": ep["goal_ms"], "response_bytes": rec["bytes"],
            "served_ms": ms_stats(rec["served"]), "adapter_ms": ms_stats(rec["adapter"]),
            "engine_hold_ms": ms_stats(rec["hold"]), "http_adapter_ms": ms_stats(rec["client"]),
        }
    return out


# ----------------------------------------------------------------------------------------------
# 2. cold reads (attribution recomputed inside the request)
# ----------------------------------------------------------------------------------------------


def measure_cold(cfg: BenchConfig, built: Built, adapter, holds: EngineHolds, client) -> dict[str, Any]:
    """Each repeat: change the tree, then the first /v1/sessions (cold), then the same again
    (cached); change again, then the first /v1/nodes/{id} (cold)."""
    node_id = built.system_ids[0]
    res: dict[str, dict[str, list[float]]] = {
        k: {"served": [], "hold": [], "attribute": []} for k in ("sessions_cold", "sessions_repeat", "node_cold")}

    def get(key: str, path: str, params: dict[str, Any]) -> None:
        n_attr = len(adapter.attribute_log)
        m = holds.mark()
        t0 = pc()
        r = client.get(path, params=params)  # reads the whole body
        res[key]["served"].append(pc() - t0)
        r.raise_for_status()
        res[key]["hold"].append(holds.since(m))
        res[key]["attribute"].append(sum(dt for _, dt in adapter.attribute_log[n_attr:]))

    for _ in range(cfg.cold_repeats):
        change_tree(adapter.engine, built.system_prompts[0])
        get("sessions_cold", "/v1/sessions", {"limit": cfg.page})
        get("sessions_repeat", "/v1/sessions", {"limit": cfg.page})
        change_tree(adapter.engine, built.system_prompts[0])
        get("node_cold", f"/v1/nodes/{node_id}", {})
    labels = {"sessions_cold": f"sessions, limit {cfg.page}, first call after a change",
              "sessions_repeat": f"sessions, limit {cfg.page}, repeat at the same version",
              "node_cold": "node detail, first call after a change"}
    goals = {"sessions_cold": GOAL_COLD_MS, "sessions_repeat": GOAL_PAGE_MS, "node_cold": GOAL_COLD_MS}
    return {k: {"label": labels[k], "goal_ms": goals[k], "served_ms": ms_stats(v["served"]),
                "engine_hold_ms": ms_stats(v["hold"]), "attribute_ms": ms_stats(v["attribute"])}
            for k, v in res.items()}


# ----------------------------------------------------------------------------------------------
# 3. export against a bare walk
# ----------------------------------------------------------------------------------------------


def bare_walk(root) -> tuple[int, int]:
    """Iterative DFS over the live tree touching each node's key length: the floor of any export."""
    nodes = tokens = 0
    stack = [root]
    while stack:
        node = stack.pop()
        nodes += 1
        tokens += len(node.key)
        stack.extend(node.children.values())
    return nodes - 1, tokens  # root excluded


def export_over_http(client) -> tuple[int, int]:
    """GET /v1/export, every byte consumed; returns (lines, bytes)."""
    lines = size = 0
    with client.stream("GET", "/v1/export") as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            lines += chunk.count(b"\n")
            size += len(chunk)
    return lines, size


def export_columns_over_http(client) -> int:
    """GET /v1/export?format=columns, every byte consumed; returns bytes."""
    size = 0
    with client.stream("GET", "/v1/export", params={"format": "columns"}) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            size += len(chunk)
    return size


def export_in_process(adapter) -> tuple[int, float, float]:
    """adapter.export() consumed here: (rows, seconds to the header = the snapshot, total seconds)."""
    t0 = pc()
    it = iter(adapter.export())
    next(it)
    t1 = pc()
    rows = 0
    for _ in it:
        rows += 1
    return rows, t1 - t0, pc() - t0


def ndjson_in_process(adapter) -> tuple[int, float]:
    """The server's NDJSON encoding of adapter.export(), without HTTP: (bytes, seconds)."""
    t0 = pc()
    size = sum(len(chunk) for chunk in adapter.export_ndjson())
    return size, pc() - t0


def measure_export(cfg: BenchConfig, built: Built, adapter, holds: EngineHolds, client, remote) -> dict[str, Any]:
    cache = built.scheduler.cache
    n = built.facts["nodes"]
    walk_s, http_s, ratios, rss_growth, holds_s = [], [], [], [], []
    cols_s, cols_ratios = [], []
    cols_bytes = 0
    inproc_s, snapshot_s, ndjson_s = [], [], []
    http_bytes = 0
    gc.collect()
    for k in range(cfg.export_repeats):
        # the walk runs on this thread while the engine idles, as the export's own walk would
        def walk() -> None:
            t0 = pc()
            nodes, _ = bare_walk(cache.root_node)
            walk_s.append(pc() - t0)
            assert nodes == n, (nodes, n)

        def http() -> None:
            nonlocal http_bytes
            m = holds.mark()
            with RssSampler() as rss:
                t0 = pc()
                lines, http_bytes = export_over_http(client)
                http_s.append(pc() - t0)
            holds_s.append(holds.since(m))
            rss_growth.append(rss.growth)
            assert lines == n + 1, (lines, n)

        def columns() -> None:
            nonlocal cols_bytes
            t0 = pc()
            cols_bytes = export_columns_over_http(client)
            cols_s.append(pc() - t0)

        for step in (walk, http, columns) if k % 2 == 0 else (columns, http, walk):
            step()
        ratios.append(http_s[-1] / walk_s[-1])
        cols_ratios.append(cols_s[-1] / walk_s[-1])
        rows, snap, total = export_in_process(adapter)
        assert rows == n
        snapshot_s.append(snap)
        inproc_s.append(total)
        ndjson_s.append(ndjson_in_process(adapter)[1])
    client_s = []
    for _ in range(cfg.client_export_repeats):
        t0 = pc()
        it = remote.export()
        next(it)
        rows = sum(1 for _ in it)
        client_s.append(pc() - t0)
        assert rows == n
    return {
        "nodes": n,
        "http_bytes": http_bytes,
        "walk_ms": ms_stats(walk_s),
        "http_ms": ms_stats(http_s),
        "ratio_per_repeat": ratios,
        "ratio": statistics.median(ratios),
        "columns_ms": ms_stats(cols_s),
        "columns_bytes": cols_bytes,
        "columns_ratio_per_repeat": cols_ratios,
        "columns_ratio": statistics.median(cols_ratios),
        "snapshot_ms": ms_stats(snapshot_s),
        "engine_hold_ms": ms_stats(holds_s),
        "adapter_export_ms": ms_stats(inproc_s),
        "ndjson_in_process_ms": ms_stats(ndjson_s),
        "http_adapter_export_ms": ms_stats(client_s),
        "rss_growth_bytes": rss_growth,
        "rss_growth_max_bytes": max(rss_growth),
    }


def measure_export_memory(adapter, n: int) -> dict[str, Any]:
    """tracemalloc while adapter.export() is consumed in-process: its peak, what is still held
    after the snapshot (the columns), and the peak of a list of one row dict per node."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        it = iter(adapter.export())
        next(it)  # the snapshot: compact columns copied on the engine thread
        after_snapshot = tracemalloc.get_traced_memory()[0] - base
        samples = []
        step = max(1, n // 10)
        rows = 0
        for _ in it:
            rows += 1
            if rows % step == 0:
                samples.append(tracemalloc.get_traced_memory()[0] - base)
        peak = tracemalloc.get_traced_memory()[1] - base
        del it
        gc.collect()
        # reference: one dict per node, the shape an unstreamed export would hold
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        rows_list = [{"id": i, "parent": i // 2, "tokens": 8 + i % 7, "lock_ref": 0, "hit_count": 1 + i % 3,
                      "holders": ()} for i in range(n)]
        dicts_peak = tracemalloc.get_traced_memory()[1] - base
        del rows_list
    finally:
        tracemalloc.stop()
    gc.collect()
    return {
        "nodes": n,
        "rows": rows,
        "export_peak_bytes": peak,
        "export_after_snapshot_bytes": after_snapshot,
        "export_current_during_rows_bytes": samples,
        "export_streaming_bytes": peak - after_snapshot,
        "dicts_reference_bytes": dicts_peak,
        "peak_share_of_dicts": peak / dicts_peak,
        "peak_bytes_per_node": peak / n,
    }


# ----------------------------------------------------------------------------------------------
# 4. session attribution
# ----------------------------------------------------------------------------------------------


def measure_attribution(cfg: BenchConfig, built: Built, adapter, holds: EngineHolds) -> dict[str, Any]:
    """adapter.sessions(limit=page) in-process right after a tree change: the ``_attribute`` call
    inside it is cold. Times: _attribute on the engine thread, the whole engine hold, the call."""
    attr, hold, call = [], [], []
    sessions = 0
    for _ in range(cfg.cold_repeats):
        change_tree(adapter.engine, built.system_prompts[0])
        n_attr = len(adapter.attribute_log)
        m = holds.mark()
        t0 = pc()
        page = adapter.sessions("exclusive_bytes", 0, cfg.page)
        call.append(pc() - t0)
        hold.append(holds.since(m))
        log_ = adapter.attribute_log[n_attr:]
        assert len(log_) == 1 and log_[0][0], log_  # one call, and it recomputed
        attr.append(log_[0][1])
        sessions = page.total
    a = ms_stats(attr)
    return {"sessions": sessions, "attribute_ms": a, "engine_hold_ms": ms_stats(hold),
            "call_ms": ms_stats(call), "per_session_us": a["median"] * 1e3 / max(1, sessions)}


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------


def mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


fmt_ms = partial(_fmt_ms, missing="n/a", sep="")  # this report's style: "n/a", no thousands separator


def report(cfg: BenchConfig, res: dict[str, Any]) -> str:
    f = res["tree"]
    lines = [
        f"### Tree: {f['nodes']:,} nodes, {f['tokens'] / 1e6:.1f}M tokens "
        f"({f['tokens'] * f['bytes_per_token'] / 2**40:.2f} TiB of llama-3-8b KV on a meta pool), "
        f"{f['sessions_known']:,} sessions ({f['sessions_tagging']:,} holding {f['tagged_nodes']:,} tagged nodes, "
        f"{f['closed_sessions']} closed), {f['running_requests']} running requests, "
        f"{f['root_children']:,} root children, largest fan-out {f['max_children']:,}, depth {f['max_depth']}; "
        f"built in {f['build_s']:.1f} s",
        "",
        f"### Reads served over HTTP (median of {cfg.read_repeats}; milliseconds per request)",
        "",
        "| request | rows | response | in-process adapter | engine hold | served median | served p95 | RadixtopClient "
        "| goal | met |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in res["reads"].values():
        s = r["served_ms"]
        lines.append(
            f"| {r['label']} | {r['rows']:,} | {r['response_bytes'] / 1024:.0f} KiB | {fmt_ms(r['adapter_ms']['median'])} | "
            f"{fmt_ms(r['engine_hold_ms']['median'])} | {fmt_ms(s['median'])} | {fmt_ms(s['p95'])} | "
            f"{fmt_ms(r['http_adapter_ms']['median'])} | <= {r['goal_ms']:.0f} ms | {verdict(s['median'] <= r['goal_ms'])} |"
        )
    lines += [
        "",
        f"### Reads that attribute memory to sessions, right after a tree change (median of {cfg.cold_repeats}; ms)",
        "",
        "| request | served median | served p95 | attribution inside it | engine hold | goal | met |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in res["cold"].values():
        s = r["served_ms"]
        lines.append(
            f"| {r['label']} | {fmt_ms(s['median'])} | {fmt_ms(s['p95'])} | {fmt_ms(r['attribute_ms']['median'])} | "
            f"{fmt_ms(r['engine_hold_ms']['median'])} | <= {r['goal_ms']:.0f} ms | {verdict(s['median'] <= r['goal_ms'])} |"
        )
    e, m = res["export"], res["export_memory"]
    lines += [
        "",
        f"### Export of {e['nodes']:,} nodes: `/v1/export` over HTTP against a bare walk "
        f"(median of {cfg.export_repeats} paired repeats; ms)",
        "",
        "| measure | median | min..max | goal | met |",
        "|---|---:|---:|---|---|",
        f"| bare walk (iterative DFS, key lengths) | {fmt_ms(e['walk_ms']['median'])} | "
        f"{fmt_ms(e['walk_ms']['min'])}..{fmt_ms(e['walk_ms']['max'])} | - | - |",
        f"| `/v1/export` over HTTP ({e['http_bytes'] / 2**20:.0f} MiB NDJSON, lines counted) | "
        f"{fmt_ms(e['http_ms']['median'])} | {fmt_ms(e['http_ms']['min'])}..{fmt_ms(e['http_ms']['max'])} | - | - |",
        f"| **NDJSON export / bare walk** (per-repeat ratio) | **{e['ratio']:.2f}x** | "
        f"{min(e['ratio_per_repeat']):.2f}x..{max(e['ratio_per_repeat']):.2f}x | <= {GOAL_EXPORT_RATIO:.0f}x | "
        f"{verdict(e['ratio'] <= GOAL_EXPORT_RATIO)} |",
        f"| `/v1/export?format=columns` over HTTP ({e['columns_bytes'] / 2**20:.0f} MiB, int64 columns) | "
        f"{fmt_ms(e['columns_ms']['median'])} | {fmt_ms(e['columns_ms']['min'])}..{fmt_ms(e['columns_ms']['max'])} "
        f"| - | - |",
        f"| **columnar export / bare walk** (per-repeat ratio) | **{e['columns_ratio']:.2f}x** | "
        f"{min(e['columns_ratio_per_repeat']):.2f}x..{max(e['columns_ratio_per_repeat']):.2f}x | "
        f"<= {GOAL_EXPORT_RATIO:.0f}x | {verdict(e['columns_ratio'] <= GOAL_EXPORT_RATIO)} |",
        f"| of which: snapshot on the engine thread (engine hold) | {fmt_ms(e['engine_hold_ms']['median'])} | "
        f"{fmt_ms(e['engine_hold_ms']['min'])}..{fmt_ms(e['engine_hold_ms']['max'])} | - | - |",
        f"| context: `adapter.export()` in-process, time to its header (the snapshot) | "
        f"{fmt_ms(e['snapshot_ms']['median'])} | {fmt_ms(e['snapshot_ms']['min'])}..{fmt_ms(e['snapshot_ms']['max'])} "
        f"| - | - |",
        f"| context: `adapter.export()` consumed in-process (snapshot + row dicts) | "
        f"{fmt_ms(e['adapter_export_ms']['median'])} | {fmt_ms(e['adapter_export_ms']['min'])}.."
        f"{fmt_ms(e['adapter_export_ms']['max'])} | - | - |",
        f"| context: the same + the server's NDJSON encoding, no HTTP | {fmt_ms(e['ndjson_in_process_ms']['median'])} | "
        f"{fmt_ms(e['ndjson_in_process_ms']['min'])}..{fmt_ms(e['ndjson_in_process_ms']['max'])} | - | - |",
    ]
    if e["http_adapter_export_ms"]:
        c = e["http_adapter_export_ms"]
        lines.append(f"| context: `RadixtopClient.export()` (every line decoded to a dict) | {fmt_ms(c['median'])} | "
                     f"{fmt_ms(c['min'])}..{fmt_ms(c['max'])} | - | - |")
    share = m["peak_share_of_dicts"]
    cur = m["export_current_during_rows_bytes"] or [m["export_after_snapshot_bytes"]]
    lines += [
        "",
        f"### Export memory ({m['nodes']:,} nodes)",
        "",
        "| measure | value | per node | goal | met |",
        "|---|---:|---:|---|---|",
        f"| peak RSS growth while `/v1/export` streams (max over repeats; server + client) | "
        f"{mib(e['rss_growth_max_bytes'])} | {e['rss_growth_max_bytes'] / m['nodes']:.0f} B | - | - |",
        f"| tracemalloc peak of `adapter.export()` consumed in-process | {mib(m['export_peak_bytes'])} | "
        f"{m['peak_bytes_per_node']:.0f} B | - | - |",
        f"| of which: the snapshot's columns, held after the header | {mib(m['export_after_snapshot_bytes'])} | "
        f"{m['export_after_snapshot_bytes'] / m['nodes']:.0f} B | - | - |",
        f"| of which: streaming the rows (peak - columns; held while rows stream: "
        f"{mib(min(cur))}..{mib(max(cur))}) | {mib(m['export_streaming_bytes'])} | "
        f"{m['export_streaming_bytes'] / m['nodes']:.1f} B | - | - |",
        f"| reference: a list of one row dict per node | {mib(m['dicts_reference_bytes'])} | "
        f"{m['dicts_reference_bytes'] / m['nodes']:.0f} B | - | - |",
        f"| **export peak / dict per node** | **{share:.1%}** | - | <= {GOAL_EXPORT_MEMORY_SHARE:.0%} | "
        f"{verdict(share <= GOAL_EXPORT_MEMORY_SHARE)} |",
    ]
    a = res["attribution"]
    hold = a["engine_hold_ms"]["median"]
    lines += [
        "",
        f"### Session attribution: `BundledAdapter._attribute` for {a['sessions']:,} sessions, right after a tree "
        f"change (median of {cfg.cold_repeats})",
        "",
        "| sessions | `_attribute` (ms) | p95 (ms) | per session (us) | engine hold (ms) | `sessions(limit="
        f"{cfg.page})` in-process (ms) | goal (engine hold) | met |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
        f"| {a['sessions']:,} | {fmt_ms(a['attribute_ms']['median'])} | {fmt_ms(a['attribute_ms']['p95'])} | "
        f"{a['per_session_us']:.1f} | {fmt_ms(hold)} | {fmt_ms(a['call_ms']['median'])} | "
        f"<= {GOAL_HOLD_MS:.0f} ms | {verdict(hold <= GOAL_HOLD_MS)} |",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def api_environment() -> dict[str, Any]:
    import fastapi
    import httpx
    import uvicorn

    def has(mod: str) -> bool:
        try:
            __import__(mod)
            return True
        except ImportError:
            return False

    return environment(
        fastapi=fastapi.__version__,
        uvicorn=uvicorn.__version__,
        uvicorn_loop="uvloop" if has("uvloop") else "asyncio",
        uvicorn_http="httptools" if has("httptools") else "h11",
        httpx=httpx.__version__,
        gc="tree built with GC disabled, then collected and frozen; GC enabled while measuring",
        timer="time.perf_counter around each whole call (request sent to body read)",
        threads="client (main), uvicorn server, engine owner thread: one process, one GIL",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a ~100k-node tree for a CI smoke run (< 60 s)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "api.json", help="JSON results path")
    ap.add_argument("--nodes", type=int, help="nodes in the tree (default: 1M full, 100k quick)")
    args = ap.parse_args(argv)

    cfg = quick_config() if args.quick else full_config()
    if args.nodes is not None:
        cfg = replace(cfg, tree=replace(cfg.tree, label=fmt_nodes(args.nodes), target_nodes=args.nodes))

    t_all = pc()
    import httpx

    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.adapters.http.server import create_app
    from radixtop.adapters.http.server.audit import AuditLog
    from tests.support.live_server import running_server

    results: dict[str, Any] = {"mode": cfg.mode, "config": asdict(cfg), "environment": api_environment(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    results["goals"] = {"page_ms": GOAL_PAGE_MS, "small_ms": GOAL_SMALL_MS, "cold_ms": GOAL_COLD_MS,
                        "export_ratio": GOAL_EXPORT_RATIO, "export_memory_share": GOAL_EXPORT_MEMORY_SHARE,
                        "attribution_hold_ms": GOAL_HOLD_MS}
    log(f"mode {cfg.mode}: building a tree of ~{cfg.tree.target_nodes:,} nodes, {cfg.tree.sessions:,} sessions")
    built = build_tree(cfg.tree)
    results["tree"] = built.facts
    log(f"  {built.facts['nodes']:,} nodes in {built.build_s:.1f} s (RSS {rss_bytes() / 2**20:.0f} MiB)")

    engine = start_engine(built)
    holds = built.holds
    # Measure the cost of attribution itself: every read after a tree change recomputes it.
    adapter = timed_adapter(engine)  # a sessions read's owner-thread work is its page (issue 25: no pass)
    token = "bench-token"
    app = create_app(adapter, token, AuditLog(None))
    try:
        with running_server(app) as url, httpx.Client(base_url=url, timeout=300.0) as client:
            remote = RadixtopClient(url, token, timeout=300.0)
            try:
                log(f"reads: {cfg.read_repeats} rounds over {url}")
                results["reads"] = measure_reads(cfg, built, adapter, holds, client, remote)
                log(f"cold reads: {cfg.cold_repeats} tree changes")
                results["cold"] = measure_cold(cfg, built, adapter, holds, client)
                log(f"attribution: {cfg.cold_repeats} tree changes")
                results["attribution"] = measure_attribution(cfg, built, adapter, holds)
                log(f"export: {cfg.export_repeats} paired repeats (bare walk, HTTP export)")
                results["export"] = measure_export(cfg, built, adapter, holds, client, remote)
            finally:
                remote.release()
        log("export memory: tracemalloc")
        # tracemalloc slows the snapshot several-fold: give this adapter a long timeout
        results["export_memory"] = measure_export_memory(BundledAdapter(engine, timeout=300.0),
                                                         built.facts["nodes"])
    finally:
        release(built)
    results["wall_s"] = pc() - t_all
    finish(args.out, results, report(cfg, results),
           f"_{cfg.mode} run, {results['wall_s']:.0f} s wall (tree build {built.build_s:.0f} s included); "
           f"JSON: {args.out}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
