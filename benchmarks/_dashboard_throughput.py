"""bench_dashboard's engine-throughput measurements (section 5): an engine running the demo workload
flat out on a fresh tree, requests finished with a dashboard attached and without: separate runs
(``measure_throughput``: without, a dashboard in its own process, one in the engine's process) and
the one-engine run with the dashboard stopped and continued in turn (``alternating_run``); with the
GC pauses and the thread and process CPU they take. The report's tables are in ``bench_dashboard``."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import build_tree, log, median, ms_stats, release, start_engine
from _dashboard_screen import SIZE, new_app

if TYPE_CHECKING:
    from bench_dashboard import BenchConfig

pc = time.perf_counter
HERE = Path(__file__).resolve().parent
CHILD = HERE / "_dashboard_child.py"  # a dashboard in a process of its own


# ----------------------------------------------------------------------------------------------
# GC pauses, CPU time
# ----------------------------------------------------------------------------------------------


class GcPauses:
    """Every cyclic-GC collection in this process (any thread): generation and duration."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float]] = []
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = pc()
        else:
            self.events.append((info["generation"], pc() - self._t0))

    def mark(self) -> int:
        return len(self.events)

    def since(self, mark: int) -> dict[str, Any]:
        ev = self.events[mark:]
        gen2 = [d for g, d in ev if g == 2]
        return {"collections": len(ev), "total_ms": sum(d for _, d in ev) * 1e3, "gen2": len(gen2),
                "gen2_ms": sum(gen2) * 1e3, "max_ms": max((d for _, d in ev), default=0.0) * 1e3}


GC = GcPauses()


def _stat_cpu_s(path: str) -> float:
    """CPU seconds (user + system) from a /proc stat file."""
    with open(path) as fh:
        parts = fh.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds of one thread of this process."""
    return _stat_cpu_s(f"/proc/self/task/{native_id}/stat")


def process_cpu_s(pid: int) -> float:
    """CPU seconds of another process (all its threads)."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


# ----------------------------------------------------------------------------------------------
# the engine and its admin API
# ----------------------------------------------------------------------------------------------


def compact_evict_heap(s) -> int:
    """On the owner thread: the cache's evict-heap compaction, run now if the heap is past half-way
    to the size at which a push runs it (stale entries outnumbering live ones 4 to 1), so that it
    does not run inside a measuring window; the entries the heap held."""
    cache = s.cache
    held = len(cache._evict_heap)
    if held > 2 * len(cache.evictable_leaves) + 1024:
        cache._compact_heap()
    return held


def serve_in_thread(engine) -> tuple[str, Any, Any, Any]:
    """The admin API over ``engine`` in a thread of this process (as `radixtop serve` and the
    SGLang plugin run it): (url, server, thread, adapter)."""
    import socket
    import threading

    import uvicorn

    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.adapters.http.server import create_app
    from radixtop.adapters.http.server.audit import AuditLog

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    adapter = BundledAdapter(engine)
    server = uvicorn.Server(uvicorn.Config(create_app(adapter, "bench", AuditLog(None)),
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread, adapter


# ----------------------------------------------------------------------------------------------
# separate runs, a fresh tree each: without a dashboard, with one in its own process, with one in the
# engine's process
# ----------------------------------------------------------------------------------------------


def throughput_run(cfg: BenchConfig, mode: str) -> dict[str, Any]:
    """A fresh ~100k-node cache, an engine running the demo workload flat out on it, and
    ``engine.requests_finished`` counted over ``tp_window_s``: ``without`` a dashboard; with one in
    its own ``process`` attached over the admin API (served by a thread of the engine's process:
    what `radixtop` and the SGLang plugin do); or with one ``inprocess`` on the engine's own
    adapter, sharing its interpreter (a reference: not how radixtop runs)."""
    import subprocess

    with_dashboard = mode != "without"
    from radixtop.gpu_backend.workload import WorkloadConfig
    from radixtop.inspector.tree_view import CacheTree

    built = build_tree(cfg.throughput_tree, with_facts=False)
    engine = start_engine(built, WorkloadConfig(arrival_rate=0.0), step_interval=0.0)
    holds = built.holds
    rec: dict[str, Any] = {"mode": mode, "with_dashboard": with_dashboard, "tree_nodes": built.facts["nodes"]}
    engine_tid = engine._thread.native_id

    def window_open() -> tuple[float, int, int, float, float]:
        return pc(), engine.requests_finished, engine.steps, time.process_time(), thread_cpu_s(engine_tid)

    def window_close(start) -> None:
        t, f, steps, cpu, ecpu = window_open()
        secs = t - start[0]
        rec.update({"window_s": secs, "finished": f - start[1], "steps": steps - start[2],
                    "finished_at_open": start[1],
                    "requests_per_s": (f - start[1]) / secs,
                    "process_cpu_per_s": (cpu - start[3]) / secs, "engine_cpu_per_s": (ecpu - start[4]) / secs})

    series: list[int] = []  # requests finished, sampled every second of the window

    def sample_until(end: float) -> None:
        while (left := end - pc()) > 0:
            time.sleep(min(1.0, left))
            series.append(engine.requests_finished)

    try:
        if mode == "process":
            url, server, thread, _ = serve_in_thread(engine)
            child = subprocess.Popen(
                [sys.executable, str(CHILD), url, "bench",
                 str(cfg.tp_warmup_s + 3 + cfg.tp_window_s), str(cfg.interval)],
                stdout=subprocess.PIPE, text=True)
            try:
                time.sleep(cfg.tp_warmup_s + 3)  # the child imports textual and paints first
                gc_mark = GC.mark()
                hold0 = holds.mark()
                start = window_open()
                sample_until(start[0] + cfg.tp_window_s)
                window_close(start)
                rec["gc"] = GC.since(gc_mark)
                held = holds.since(hold0)
                out = json.loads(child.communicate(timeout=60)[0].strip().splitlines()[-1])
            finally:
                if child.poll() is None:
                    child.kill()
                server.should_exit = True
                thread.join(10)
            rec.update({"polls": out["polls"], "dashboard_down": out["down"],
                        "engine_hold_ms_per_s": held / rec["window_s"] * 1e3,
                        "engine_hold_ms_per_poll": held / max(out["polls"], 1) * 1e3})
        elif not with_dashboard:
            time.sleep(cfg.tp_warmup_s + 3)  # the same time from engine start as the other modes
            gc_mark = GC.mark()
            start = window_open()
            sample_until(start[0] + cfg.tp_window_s)
            window_close(start)
            rec["gc"] = GC.since(gc_mark)
        else:
            async def attached() -> None:
                app, adapter = new_app(built, poll=True, interval=cfg.interval)
                async with app.run_test(size=SIZE) as pilot:
                    tree = app.query_one(CacheTree)
                    t0 = pc()
                    while not (app.home.polls >= 1 and tree.rows):
                        if pc() - t0 > 60:
                            raise RuntimeError("no first poll within 60 s")
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(max(0.0, cfg.tp_warmup_s + 3 - (pc() - t0)))
                    polls0, coll0, attr0, hold0 = (app.home.polls, len(app.bench_collect),
                                                   len(adapter.attribute_log), holds.mark())
                    gc_mark = GC.mark()
                    start = window_open()
                    while (left := start[0] + cfg.tp_window_s - pc()) > 0:
                        await asyncio.sleep(min(1.0, left))
                        series.append(engine.requests_finished)
                    window_close(start)
                    rec["gc"] = GC.since(gc_mark)
                    polls = app.home.polls - polls0
                    attrs = adapter.attribute_log[attr0:]
                    rec.update({
                        "polls": polls,
                        "collect_ms": ms_stats(app.bench_collect[coll0:], 90),
                        "engine_hold_ms_per_s": holds.since(hold0) / rec["window_s"] * 1e3,
                        "engine_hold_ms_per_poll": holds.since(hold0) / max(polls, 1) * 1e3,
                        "attribute_cold_per_poll": sum(1 for c, _ in attrs if c) / max(polls, 1),
                        "attribute_ms": ms_stats([s for c, s in attrs if c], 90),
                        "sessions_listed": len(app.query_one("#sessions").rows),
                        "sessions_open": app.home.stats.open_sessions, "sessions_closed": app.home.stats.closed_sessions,
                    })
                    await pilot.pause()

            asyncio.run(attached())
        rec["finished_per_second"] = [b - a for a, b in zip([rec["finished_at_open"], *series], series)]
        rec["tree_nodes_after"] = engine.call(lambda s: s.cache.node_count(), 30.0)
        rec["evicted_tokens"] = built.scheduler.evicted_tokens
        rec["aborted"] = engine.requests_aborted
    finally:
        release(built)
    return rec


MODES = ("without", "process", "inprocess")


def measure_throughput(cfg: BenchConfig) -> dict[str, Any]:
    """Rounds of the three modes, the order rotating from round to round; each mode's ratio is
    the median over rounds of (its requests/s) / (the same round's without)."""
    runs = []
    ratios: dict[str, list[float]] = {"process": [], "inprocess": []}
    for k in range(cfg.tp_pairs):
        order = MODES[k % 3:] + MODES[:k % 3]
        round_ = {}
        for mode in order:
            log(f"  throughput round {k + 1} of {cfg.tp_pairs}: {mode}, {cfg.tp_window_s:.0f} s")
            r = throughput_run(cfg, mode)
            r["pair"] = k
            runs.append(r)
            round_[mode] = r
            log(f"    {r['requests_per_s']:.0f} requests/s")
        for mode in ratios:
            ratios[mode].append(round_[mode]["requests_per_s"] / round_["without"]["requests_per_s"])
    return {"runs": runs, "ratio_per_pair": ratios["process"], "ratio": median(ratios["process"]),
            "inprocess_ratio_per_pair": ratios["inprocess"], "inprocess_ratio": median(ratios["inprocess"])}


# ----------------------------------------------------------------------------------------------
# one engine, the dashboard stopped and continued in turn (--only-alternating)
# ----------------------------------------------------------------------------------------------


def alternating_run(cfg: BenchConfig) -> dict[str, Any]:
    """One engine running the demo workload flat out on a fresh ~100k-node cache, the admin API in
    a thread of its process, and a dashboard in its own process attached over it (what `radixtop`
    runs). The dashboard is stopped (SIGSTOP) and continued (SIGCONT) in turn, in windows of
    ``alt_window_s``, in the order without-with-with-without, so that each window with the
    dashboard has a window without it beside it, under the same tree, the same point of the
    workload and the same load on the machine: the drift and noise that separate runs suffer
    (a fresh tree each, minutes apart) cancel in each pair. A stopped dashboard holds an idle
    connection and nothing else.

    The engine's own long passes run between blocks, outside the windows: the GC's generation-2
    passes (automatic ones are held off during the run; ``gc.collect()`` runs before each block)
    and the evict heap's compaction (``compact_evict_heap``). At 1M nodes each takes 1-5 s and
    comes every few tens of seconds with or without a dashboard; left to land where they fall,
    one in a window of 5 s outweighs the effect measured. The windows still hold every
    generation-0 and -1 collection the dashboard's allocations cause. What they leave out (those
    allocations bringing the next full pass sooner) is bounded and subtracted in
    ``ratio_mean_less_left_out``. The dashboard's reads push nothing onto the evict heap."""
    import signal
    import subprocess

    from radixtop.gpu_backend.workload import WorkloadConfig

    built = build_tree(cfg.throughput_tree, with_facts=False)
    engine = start_engine(built, WorkloadConfig(arrival_rate=0.0), step_interval=0.0)
    holds = built.holds
    nodes_before = engine.call(lambda s: s.cache.node_count(), 30.0)
    windows: list[dict[str, Any]] = []
    url, server, thread, adapter = serve_in_thread(engine)
    engine_tid = engine._thread.native_id
    api_tid = thread.native_id  # the admin API's event loop (its worker threads come and go)
    # The child runs until SIGUSR1; this is only its limit (the passes between blocks take time too).
    total_s = 3 + cfg.tp_warmup_s + 2 * cfg.alt_pairs * (cfg.alt_window_s + 30) + 60
    child = subprocess.Popen([sys.executable, str(CHILD), url, "bench", str(total_s),
                              str(cfg.interval)], stdout=subprocess.PIPE, text=True)
    thresholds = gc.get_threshold()
    try:
        time.sleep(cfg.tp_warmup_s + 3)  # the child imports textual and paints first
        gc_mark = GC.mark()
        gc.set_threshold(thresholds[0], thresholds[1], 10**9)  # generation 2: only between blocks
        stopped = False
        for k in range(2 * cfg.alt_pairs):
            with_dashboard = k % 4 in (1, 2)  # without, with, with, without, ...
            if with_dashboard == stopped:
                child.send_signal(signal.SIGCONT if stopped else signal.SIGSTOP)
                stopped = not stopped
            if child.poll() is not None:
                raise RuntimeError(f"the dashboard exited early (status {child.returncode}) at window {k}")
            collect_ms = compact_ms = 0.0
            if k % 4 == 0:  # the engine's own long passes, between blocks (see the docstring)
                t_collect = pc()
                gc.collect()
                collect_ms = (pc() - t_collect) * 1e3
                t_compact = pc()
                engine.call(compact_evict_heap, 120.0)
                compact_ms = (pc() - t_compact) * 1e3
            t0, f0, h0, g0, a0 = pc(), engine.requests_finished, holds.mark(), GC.mark(), thread_cpu_s(api_tid)
            e0, c0, w0 = thread_cpu_s(engine_tid), process_cpu_s(child.pid), engine.slices.work_s
            p0 = built.scheduler.prompt_tokens
            time.sleep(cfg.alt_window_s)
            pass_wait_s = 0.0
            if with_dashboard and (k % 4 == 2 or k == 2 * cfg.alt_pairs - 1):
                # The next window is without: stop the dashboard now, and end this window only
                # when the attribution it asked for is done (it runs in slices between the
                # engine's steps), so that all its work is counted here, none in the next.
                child.send_signal(signal.SIGSTOP)
                stopped = True
                t_wait = pc()
                engine.call(lambda s: None)  # what the dashboard asked of the engine has run
                pass_wait_s = pc() - t_wait
            secs = pc() - t0
            in_window = GC.since(g0)
            windows.append({"with": with_dashboard, "s": secs, "finished": engine.requests_finished - f0,
                            "requests_per_s": (engine.requests_finished - f0) / secs,
                            "collect_before_ms": collect_ms, "compact_before_ms": compact_ms,
                            "collections": in_window["collections"],
                            "gen2": in_window["gen2"],
                            "hold_ms": holds.since(h0) * 1e3, "gc_ms": in_window["total_ms"],
                            "slices_ms": (engine.slices.work_s - w0) * 1e3, "pass_wait_ms": pass_wait_s * 1e3,
                            "prompt_tokens": built.scheduler.prompt_tokens - p0,
                            "api_cpu_ms": (thread_cpu_s(api_tid) - a0) * 1e3,
                            "engine_cpu_ms": (thread_cpu_s(engine_tid) - e0) * 1e3,
                            "dashboard_cpu_ms": (process_cpu_s(child.pid) - c0) * 1e3})
        gc_stats = GC.since(gc_mark)
        if stopped:
            child.send_signal(signal.SIGCONT)
        child.send_signal(signal.SIGUSR1)  # ends its wait early: it prints its polls and exits
        out_text = child.communicate(timeout=60)[0].strip()
    finally:
        gc.set_threshold(*thresholds)
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        server.should_exit = True
        thread.join(10)
        nodes_after = engine.call(lambda s: s.cache.node_count(), 30.0)
        release(built)
    out = json.loads(out_text.splitlines()[-1]) if out_text else {"polls": None, "down": "no report"}
    pairs = [(windows[i], windows[i + 1]) for i in range(0, len(windows), 2)]
    ratios = [w["requests_per_s"] / wo["requests_per_s"] if wo["requests_per_s"] else math.inf
              for wo, w in ((a, b) if b["with"] else (b, a) for a, b in pairs)]
    with_w = [w for w in windows if w["with"]]
    without_w = [w for w in windows if not w["with"]]
    rate = lambda ws: sum(w["finished"] for w in ws) / sum(w["s"] for w in ws)  # noqa: E731
    per_s = lambda ws, key: sum(w[key] for w in ws) / sum(w["s"] for w in ws)  # noqa: E731
    # Each block of four (without, with, with, without) is symmetric in time: a drift that is
    # linear over the block cancels in its ratio, which a single pair's ratio does not.
    blocks = [rate(windows[i + 1 : i + 3]) / max(rate([windows[i], windows[i + 3]]), 1e-9)
              for i in range(0, len(windows) - 3, 4)]
    # What the collections between blocks leave out: the dashboard's allocations in the engine's
    # process bring the engine's next generation-2 pass sooner, at most in proportion to the extra
    # collections they cause. Bounded by that extra share times the time of the passes run
    # between blocks per second of window (one per block: about as often as they come unaided).
    extra_collections = per_s(with_w, "collections") / max(per_s(without_w, "collections"), 1e-9) - 1
    collect_ms_per_s = sum(w["collect_before_ms"] for w in windows) / sum(w["s"] for w in windows)
    left_out = max(0.0, extra_collections) * collect_ms_per_s / 1e3
    ratio_mean = statistics.fmean(blocks)
    # The engine thread's time left for requests: its CPU less what it spent on the dashboard's
    # reads and on attribution slices. The API thread's time shows as less engine CPU (it holds
    # the GIL meanwhile). What this leaves out: the engine's own work made slower by the other
    # core's (caches, memory bandwidth), and noise, which the throughput ratios carry.
    for_requests = lambda ws: per_s(ws, "engine_cpu_ms") - per_s(ws, "hold_ms") - per_s(ws, "slices_ms")  # noqa: E731
    return {"windows": windows, "tree_nodes_before": nodes_before,
            "collections_per_s": {"with": per_s(with_w, "collections"), "without": per_s(without_w, "collections")},
            "collect_between_ms_per_s": collect_ms_per_s, "gen2_left_out_share": left_out,
            "ratio_mean_less_left_out": ratio_mean - left_out,
            "block_ratios": blocks, "ratio_mean": ratio_mean,
            "ratio_mean_ci90": bootstrap_ci(blocks, statistics.fmean),
            "ratio_block_median": median(blocks),
            "pair_ratios": ratios, "ratio_median": median(ratios),
            "ratio_median_ci90": bootstrap_ci(ratios, median),
            "ratio_total": rate(with_w) / rate(without_w), "with_requests_per_s": rate(with_w),
            "engine_ms_for_requests_per_s": {"with": for_requests(with_w), "without": for_requests(without_w)},
            "ratio_engine_time_for_requests": for_requests(with_w) / for_requests(without_w),
            "ratio_tokens": per_s(with_w, "prompt_tokens") / max(per_s(without_w, "prompt_tokens"), 1e-9),
            "without_requests_per_s": rate(without_w), "polls": out["polls"], "dashboard_down": out["down"],
            "hold_ms_per_s_with": sum(w["hold_ms"] for w in with_w) / sum(w["s"] for w in with_w),
            "slices_ms_per_s": {"with": per_s(with_w, "slices_ms"), "without": per_s(without_w, "slices_ms")},
            "slices_ms_most_in_a_window": max(w["slices_ms"] for w in windows),
            "sessions_reads": {"n": len(getattr(adapter, "attribute_log", ())),
                               "work_s": sum(s for _, s in getattr(adapter, "attribute_log", ()))},
            "gc_ms_per_s": {"with": per_s(with_w, "gc_ms"), "without": per_s(without_w, "gc_ms")},
            "api_cpu_ms_per_s": {"with": per_s(with_w, "api_cpu_ms"), "without": per_s(without_w, "api_cpu_ms")},
            "engine_cpu_ms_per_s": {"with": per_s(with_w, "engine_cpu_ms"),
                                    "without": per_s(without_w, "engine_cpu_ms")},
            "dashboard_cpu_ms_per_s": per_s(with_w, "dashboard_cpu_ms"),
            "tree_nodes_after": nodes_after, "gc": gc_stats}


def bootstrap_ci(xs: list[float], stat: Callable[[list[float]], float], level: float = 0.90,
                 rounds: int = 5000) -> tuple[float, float]:
    """A percentile-bootstrap interval of ``stat(xs)`` (``xs`` resampled; seeded)."""
    rng = random.Random(0)
    got = sorted(stat(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    tail = (1 - level) / 2
    return got[int(tail * rounds)], got[min(rounds - 1, int((1 - tail) * rounds))]
