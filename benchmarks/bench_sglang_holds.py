"""How long radixtop holds SGLang's scheduler thread, with a dashboard attached at its default refresh.

Run from the repository root (in the venv with sglang 0.5.16, or 0.5.23 for ``--unified``):

    .venv/bin/python benchmarks/bench_sglang_holds.py            # 100k and 1M nodes (several minutes)
    .venv/bin/python benchmarks/bench_sglang_holds.py --quick    # 20k nodes, short windows

A real SGLang ``RadixCache`` with its session mixin (0.5.16; ``--unified``: 0.5.23's
``UnifiedRadixCache`` on its Python core), its real allocator and pools, is grown to the node count
with ~5% of its nodes tagged by sessions (50k sessions at 1M nodes), through the calls its scheduler
makes (``tests/on_sglang/ref``: match, lock, allocate, ``cache_finished_req``). Then a scheduler
thread keeps serving requests (new turns of those sessions and sessionless prompts, evicting when the
pool is full) and between its steps runs radixtop's ``OwnerQueue.between_steps()``, exactly where the plugin's
hook runs it. Meanwhile the dashboard's own ``Poller`` (``radixtop.inspector.poller``) polls the
in-process ``SGLangInProcessAdapter`` as the dashboard does at its default refresh: the next poll a
second after one ends (``PollLoop``), each reading the stats, the expanded pages, the selected node and
the sessions (the rows a sessions pane of up to 30 rows asks for, ``SESSIONS_LOADED``; ``--session-rows``
for another pane). Every ``step()`` is timed: that is radixtop's hold of the scheduler thread; each
read's steps are timed too, so the share is told by the read that made it (per poll, on the scheduler
thread's CPU clock).

Two modes, alternating in windows on the same tree: ``index`` (the code as it is: ``TreeIndex``)
and ``walk`` (the index switched off, so reads walk the tree as before it: the baseline).
Reported per size and mode: holds, the longest, p99, and their share of the scheduler's time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from time import perf_counter as pc
from time import thread_time
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import environment, fmt_nodes, log  # noqa: E402

STEP_DEVICE_S = 0.005
"""A batch's time on the accelerator, per scheduler step (the scheduler thread waits, GIL released)."""
GOAL_LONGEST_MS = 5.0
GOAL_SHARE = 0.01
GC_S = [0.0]  # seconds in the cyclic GC so far (any thread): a hold that met one says so


def _gc_clock(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_clock.started = pc()
    else:
        GC_S[0] += pc() - _gc_clock.started


gc.callbacks.append(_gc_clock)


class Tree:
    """A real SGLang cache and a way to serve requests on it (0.5.16 replayer or 0.5.23 driver)."""

    def __init__(self, unified: bool, capacity: int, seed: int = 7):
        self.rng = random.Random(seed)
        self.unified = unified
        self.rid = 0
        if unified:
            from tests.on_sglang.ref import drive23

            self.d = drive23
            self.cache, self.pools = drive23.build_unified_cache23(capacity, tree_core_backend="python",
                                                                   max_running=64, max_context_len=4096)
        else:
            from tests.on_sglang.ref.replay_sglang import SGLangReplayer, import_sglang

            self.replayer = SGLangReplayer(import_sglang(), capacity, max_running=64, max_context_len=4096,
                                           kv_shape=(1, 1, 1, "float16"))
            self.cache = self.replayer.cache

    def request(self, tokens: list[int], output: list[int], session: str | None) -> None:
        self.rid += 1
        if self.unified:
            self.d.run_request(self.cache, self.pools, tokens, output, session_id=session)
        else:
            rid = f"q{self.rid}"
            self.replayer.begin(rid, tokens, session)
            self.replayer.finish(rid, output)


def grow(tree: Tree, nodes: int, session_share: float = 0.05, vocab: int = 30_000) -> dict[str, Any]:
    """Sessions (multi-turn chats on shared system prompts) and a sessionless forest of prompts
    sharing prefixes, until the tree has ``nodes`` nodes. Returns the histories and facts."""
    rng = tree.rng
    systems = [[rng.randrange(2, vocab) for _ in range(rng.randint(64, 256))] for _ in range(4)]
    sessions = max(1, int(nodes * session_share))
    history: dict[str, list[int]] = {}
    count = _counter(tree)
    started = pc()
    gc.disable()
    try:
        for k in range(sessions):  # each session: a first turn (a leaf under its system prompt)
            sid = f"s{k}"
            history[sid] = systems[k % 4] + [rng.randrange(2, vocab) for _ in range(rng.randint(4, 24))]
            tree.request(history[sid], [rng.randrange(2, vocab) for _ in range(4)], sid)
        groups = []
        while count() < nodes:
            if not groups or rng.random() < 0.05:
                groups.append([rng.randrange(2, vocab) for _ in range(rng.randint(8, 32))])
            base = rng.choice(groups)
            cut = rng.randint(1, len(base))
            tokens = base[:cut] + [rng.randrange(2, vocab) for _ in range(rng.randint(2, 12))]
            if rng.random() < 0.3:
                groups.append(tokens)
            tree.request(tokens, [rng.randrange(2, vocab)], None)
    finally:
        gc.enable()
    gc.collect()
    gc.freeze()
    return {"history": history, "systems": systems, "build_s": pc() - started, "nodes": count(),
            "sessions": sessions}


def serve_one(tree: Tree, rng: random.Random, grown: dict[str, Any], vocab: int = 30_000) -> None:
    """One request of the steady mix: a session's next turn, or a prompt on a system prompt."""
    history = grown["history"]
    if rng.random() < 0.5:
        sid = rng.choice(grown.setdefault("sids", list(history)))
        tree.request(history[sid] + [rng.randrange(2, vocab) for _ in range(8)],
                     [rng.randrange(2, vocab) for _ in range(4)], sid)
    else:
        tree.request(rng.choice(grown["systems"]) + [rng.randrange(2, vocab) for _ in range(rng.randint(4, 16))],
                     [7], None)


def _counter(tree: Tree):
    from radixtop.adapters.sglang.index import INDEX, install

    index = getattr(tree.cache, INDEX, None) or install(tree.cache)
    return lambda: index.count


def measure(tree: Tree, grown: dict[str, Any], window_s: float, windows: int,
            baseline_s: float | None = None, session_rows: int | None = None) -> dict[str, Any]:
    from sglang.srt.managers.io_struct import OpenSessionReqInput
    from sglang.srt.session.session_controller import SessionController

    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
    from radixtop.gpu_backend.owner.queue import OwnerQueue
    from radixtop.inspector.poller import SESSIONS_LOADED, Poller, PollRequest, SessionsQuery
    from radixtop.inspector.tree_ops import Toggle

    owner = OwnerQueue("the benchmark scheduler")
    sessions = SessionsQuery(limit=session_rows or SESSIONS_LOADED)
    history = grown["history"]
    # the sessions open in SGLang's own SessionController (/open_session), given to the adapter as
    # the plugin gives the scheduler's (followed as they open and close, never diffed)
    controller = SessionController(tree.cache)
    for sid in history:
        controller.open(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id=sid))
    adapter = SGLangInProcessAdapter(tree.cache, owner, model="bench", session_controller=controller,
                                     timeout=60.0)
    index = adapter._index
    by_op: dict[str, list[float]] = {}  # what the holds were made of: each read of a poll, timed
    by_cpu: dict[str, list[float]] = {}  # the same steps on the scheduler thread's CPU clock
    read_pass = adapter._read_pass

    def cpu_timed(steps: Any, name: str, each: bool) -> Any:
        """A pass's steps on the scheduler thread's CPU clock: each step under ``name`` (where
        ``each``), and the pass's steps summed under ``name + ", whole"``."""
        whole = 0.0
        while True:
            c0 = thread_time()
            try:
                next(steps)
            except StopIteration as done:
                finished = True
                value = done.value
            else:
                finished = False
            took = thread_time() - c0
            whole += took
            if each:
                by_cpu.setdefault(name, []).append(took)
            if finished:
                by_cpu.setdefault(name + ", whole", []).append(whole)
                return value
            yield

    def timed_read_pass(owner_args: Any, op: str, args: tuple) -> Any:
        """Each read of a poll's batch, by its kind ("read <op>": each step; "read <op>, whole":
        each read's steps summed)."""
        return cpu_timed(read_pass(owner_args, op, args), f"{mode['name']}:read {op}", each=True)

    adapter._read_pass = timed_read_pass
    orders = adapter._orders
    if orders is not None:  # a sessions read's rows apart from the rest of it (its order's catch-up)
        rows_pass = orders.rows_pass

        def timed_rows_pass(ids: list[str]) -> Any:
            row_counts.append(len(ids))
            return cpu_timed(rows_pass(ids), f"{mode['name']}:read sessions: its rows", each=False)

        orders.rows_pass = timed_rows_pass
    row_counts: list[int] = []
    slice_run = owner.slices.run

    def timed_slices(idle: bool = False, deadline: float | None = None) -> float:
        spent = slice_run(idle, deadline)
        if spent:
            by_op.setdefault(f"{mode['name']}:slice", []).append(spent)
        return spent

    owner.slices.run = timed_slices
    slice_add = owner.slices.add

    def timed_pass(steps):  # each step of a pass, timed by what it runs (the innermost generator)
        while True:
            inner, g = "?", steps
            while g is not None:
                inner = getattr(g, "__qualname__", inner)
                frame = getattr(g, "gi_frame", None)
                g = getattr(g, "gi_yieldfrom", None) or (frame.f_locals.get("steps") if frame is not None else None)
                g = g if hasattr(g, "gi_frame") else None
            started, cpu = pc(), thread_time()
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            finally:
                by_op.setdefault(f"{mode['name']}:step of {inner}", []).append(pc() - started)
                by_cpu.setdefault(f"{mode['name']}:step of {inner}", []).append(thread_time() - cpu)
            yield

    owner.slices.add = lambda steps: slice_add(timed_pass(steps))
    rng = random.Random(3)
    stop = threading.Event()
    mode = {"name": "attach"}  # the first poll's reads and holds apart from the windows'
    holds: list[tuple[str, float, float, float]] = []  # (mode, hold, GC seconds during it, thread CPU)
    steps: list[tuple[str, float]] = []

    def scheduler() -> None:
        while not stop.is_set():
            started = pc()
            # A step, in the order of SGLang's event loop: the previous batch's device time (the
            # thread waits on the accelerator and lets others run), then its CPU work (here one
            # request: a session's next turn, or a prompt on a system prompt), then radixtop's
            # turn, where the plugin's hook takes it (after process_input_requests). radixtop's
            # turn thus follows the scheduler's own Python work, as it does in SGLang, not a sleep
            # (after which any code runs cold: an empty step then measured ~30 us, not ~3 us).
            time.sleep(STEP_DEVICE_S)
            serve_one(tree, rng, grown)
            gc0, c0, t0 = GC_S[0], thread_time(), pc()
            owner.between_steps(max_items=64)
            t1 = pc()
            holds.append((mode["name"], t1 - t0, GC_S[0] - gc0, thread_time() - c0))
            steps.append((mode["name"], t1 - started))

    thread = threading.Thread(target=scheduler, name="scheduler", daemon=True)
    thread.start()
    poller = Poller(adapter)
    started = pc()
    first = poller.collect(PollRequest(sessions=sessions))  # the attach: the first sessions read makes the orders
    first_s = pc() - started
    firsts = [(h, c) for _, h, _, c in holds]
    first_holds = {"longest_ms": max((h for h, _ in firsts), default=0.0) * 1e3,
                   "longest_cpu_ms": max((c for _, c in firsts), default=0.0) * 1e3, "steps": len(firsts)}
    log(f"  first poll (the attach: the orders made, in slices): {first_s:.1f} s; "
        f"its longest hold {first_holds['longest_ms']:.1f} ms "
        f"({first_holds['longest_cpu_ms']:.1f} ms of the scheduler thread's CPU)")
    top = first.tree.rows[0] if first.tree and first.tree.rows else None
    if top is not None and top.node is not None and top.node.num_children:
        poller.tree_op(Toggle(top.node))
    results: dict[str, dict[str, Any]] = {}
    polls = {"index": 0, "walk": 0}
    poll_s: list[float] = []  # each poll, from its start to its snapshot
    try:
        for w in range(windows):
            name = ("index", "walk")[w % 2]
            adapter._index = index if name == "index" else None
            adapter._walk = None
            mode["name"] = name
            mark = len(holds)
            end = time.monotonic() + (window_s if name == "index" or baseline_s is None else baseline_s)
            while time.monotonic() < end:
                t = time.monotonic()
                request = PollRequest(selected_node=top.node.id if top and top.node else None, sessions=sessions)
                poller.collect(request)
                poll_s.append(time.monotonic() - t)
                polls[name] += 1
                time.sleep(request.interval)  # as the dashboard's PollLoop: the next an interval after one ends
            window = [h for m, h, _, _ in holds[mark:] if m == name]
            without_gc = [h - g for m, h, g, _ in holds[mark:] if m == name]
            cpu = [c for m, _, _, c in holds[mark:] if m == name]
            spent = [s for m, s in steps[mark:] if m == name]
            agg = results.setdefault(name, {"holds": [], "steps": [], "without_gc": [], "cpu": []})
            agg["holds"].extend(window)
            agg["without_gc"].extend(without_gc)
            agg["cpu"].extend(cpu)
            agg["steps"].extend(spent)
            log(f"  window {w + 1}/{windows} ({name}): {len(window)} steps, longest hold "
                f"{max(window) * 1e3 if window else 0:.1f} ms, share {sum(window) / sum(spent):.2%}")
    finally:
        stop.set()
        thread.join(30)
    out: dict[str, Any] = {"first_poll_s": first_s, "first_poll_holds": first_holds,
                           "by_op": {k: {"n": len(v), "longest_ms": max(v) * 1e3, "total_ms": sum(v) * 1e3,
                                         "longest_cpu_ms": max(by_cpu[k]) * 1e3 if by_cpu.get(k) else None}
                                     for k, v in sorted(by_op.items())},
                           "reads_cpu": {k: {"n": len(v), "longest_ms": max(v) * 1e3, "total_ms": sum(v) * 1e3}
                                         for k, v in sorted(by_cpu.items()) if ":read " in k}}
    for k, v in out["by_op"].items():
        cpu = f" ({v['longest_cpu_ms']:.1f} ms CPU)" if v["longest_cpu_ms"] is not None else ""
        log(f"  {k}: {v['n']} calls, longest {v['longest_ms']:.1f} ms{cpu}, total {v['total_ms']:.0f} ms")
    for k, v in out["reads_cpu"].items():
        log(f"  {k}: {v['n']}, longest {v['longest_ms']:.2f} ms CPU, total {v['total_ms']:.0f} ms CPU")
    # What one poll of the windows cost the scheduler thread, by the read that took it (its CPU)
    per_poll: dict[str, dict[str, float]] = {}
    for name, agg in results.items():
        n = max(polls[name], 1)
        kinds = {k.split(":read ", 1)[1][: -len(", whole")]: sum(v) / n * 1e3
                 for k, v in by_cpu.items() if k.startswith(f"{name}:read ") and k.endswith(", whole")}
        kinds["all holds (wall)"] = sum(agg["holds"]) / n * 1e3
        kinds["all holds (CPU)"] = sum(agg["cpu"]) / n * 1e3
        per_poll[name] = kinds
        log(f"  {name}: per poll ({polls[name]} polls), ms of the scheduler thread: "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items())))
    if row_counts:
        log(f"  session rows per sessions read: {row_counts[-1]} (the last; the attach's first: {row_counts[0]})")
    if poll_s:
        log(f"  a poll took {statistics.mean(poll_s) * 1e3:.0f} ms on average (the longest {max(poll_s) * 1e3:.0f} ms): "
            f"one every {1 + statistics.mean(poll_s):.2f} s")
    out["per_poll_ms"] = per_poll
    out["session_rows"] = row_counts[-1] if row_counts else None
    out["poll_s_mean"] = statistics.mean(poll_s) if poll_s else None
    for name, agg in results.items():
        hs, ss, ng = sorted(agg["holds"]), agg["steps"], sorted(agg["without_gc"])
        out[name] = {
            "steps": len(hs),
            "longest_ms": hs[-1] * 1e3 if hs else 0.0,
            "longest_without_gc_ms": ng[-1] * 1e3 if ng else 0.0,
            "longest_cpu_ms": max(agg["cpu"]) * 1e3 if agg["cpu"] else 0.0,
            "p99_ms": hs[int(0.99 * (len(hs) - 1))] * 1e3 if hs else 0.0,
            "median_ms": statistics.median(hs) * 1e3 if hs else 0.0,
            "share": sum(hs) / sum(ss) if ss else 0.0,
            "seconds": sum(ss),
        }
    return out


PROFILE = None
if os.environ.get("RADIXTOP_BENCH_PROFILE"):
    import cProfile
    PROFILE = cProfile.Profile()


def innermost(gen: Any) -> str:
    """The generator a ``yield from`` chain is suspended in, and its line."""
    name, line = "?", 0
    while gen is not None and getattr(gen, "gi_frame", None) is not None:
        name, line = gen.__qualname__, gen.gi_frame.f_lineno
        gen = gen.gi_yieldfrom
    return f"{name}:{line}"


def measure_bundled(nodes: int, window_s: float, windows: int) -> dict[str, Any]:
    """The same with radixtop's own engine: the 1M-node tree of ``_common.build_tree`` (sessions,
    few-shot fan-outs, a forest) under the demo workload, the dashboard's Poller on a
    ``BundledAdapter``; every ``owner.between_steps()`` of the engine's loop timed (its commands and
    slices: the evict heap's compaction, the reads' passes)."""
    from _common import TreeConfig, build_tree

    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.workload import WorkloadConfig
    from radixtop.inspector.poller import Poller, PollRequest
    from radixtop.inspector.tree_ops import Toggle

    cfg = TreeConfig(fmt_nodes(nodes), nodes, sessions=max(1000, nodes // 20), fanouts=(1_000, nodes // 10),
                     chains=(1_000,), extra_capacity=nodes * 40)
    built = build_tree(cfg, with_facts=False)
    log(f"  {built.facts['nodes']:,} nodes in {built.build_s:.0f} s")
    engine = Engine(built.scheduler, WorkloadConfig(sessions=48, seed=1, arrival_rate=0.0))
    holds: list[tuple[float, float, float]] = []  # (hold, GC seconds during it, thread CPU)
    loops: list[float] = []
    step, last = engine.owner.between_steps, [pc()]

    def timed_step(idle: bool = False, max_items: int | None = None, budget: float | None = None) -> int:
        gc0, c0, t0 = GC_S[0], thread_time(), pc()
        ran = step(idle, max_items, budget)
        t1 = pc()
        cpu = thread_time() - c0
        if idle and budget is not None:  # the engine idles until a deadline: only running past it stalls
            over = max(0.0, t1 - t0 - budget)
            holds.append((over, 0.0, min(cpu, over)))
        else:
            holds.append((t1 - t0, GC_S[0] - gc0, cpu))
        loops.append(t1 - last[0])
        compacting.append(cache._compacting is not None)
        last[0] = t1
        return ran

    engine.owner.between_steps = timed_step
    compactions = [0]
    compaction_steps: list[float] = []
    cache = built.scheduler.cache
    compacting: list[bool] = []  # per hold: a compaction was under way
    compact = cache._compact_pass

    def counted_compaction(*args: Any, **kwargs: Any):
        compactions[0] += 1
        steps = compact(*args, **kwargs)
        while True:  # ``yield from``, each step timed on the engine thread's CPU clock
            c0 = thread_time()
            try:
                next(steps)
            except StopIteration as done:
                compaction_steps.append(thread_time() - c0)
                return done.value
            compaction_steps.append(thread_time() - c0)
            yield

    built.scheduler.cache._compact_pass = counted_compaction
    engine.start()
    adapter = BundledAdapter(engine, timeout=60.0)
    long_steps: list[tuple[float, str]] = []
    attaching = [True]
    steps_by_read: dict[str, list[float]] = {}  # each step of each read, on the engine thread's CPU clock
    read_pass = adapter._read_pass

    def timed_read_pass(owner: Any, op: str, args: tuple) -> Any:
        steps = read_pass(owner, op, args)
        name = op if op != "sessions" else f"sessions:{args[0]}"
        spent = steps_by_read.setdefault(name, [])
        while True:  # ``yield from``, each step timed
            c0 = thread_time()
            where = innermost(steps)
            if PROFILE is not None and name.startswith("sessions"):
                PROFILE.enable()
            try:
                next(steps)
            except StopIteration as done:
                spent.append(thread_time() - c0)
                return done.value
            finally:
                if PROFILE is not None:
                    PROFILE.disable()
                if thread_time() - c0 > 0.004:  # where a long one ran, from -> to
                    long_steps.append((thread_time() - c0, f"{'attach' if attaching[0] else 'window'}: {name}: "
                                                           f"{where} -> {innermost(steps)}"))
            spent.append(thread_time() - c0)
            yield

    adapter._read_pass = timed_read_pass
    poller = Poller(adapter)
    started = pc()
    first = poller.collect(PollRequest())
    first_s = pc() - started
    attaching[0] = False
    first_cpu = max((c for _, _, c in holds), default=0.0)
    log(f"  first poll (the sessions' first kept order, in slices): {first_s:.1f} s; "
        f"its longest hold {max((h for h, _, _ in holds), default=0.0) * 1e3:.1f} ms ({first_cpu * 1e3:.1f} ms CPU)")
    top = first.tree.rows[0] if first.tree and first.tree.rows else None
    if top is not None and top.node is not None and top.node.num_children:
        poller.tree_op(Toggle(top.node))
    mark = len(holds)
    end = time.monotonic() + window_s * windows
    while time.monotonic() < end:
        t = time.monotonic()
        poller.collect(PollRequest(selected_node=top.node.id if top and top.node else None))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    window, spent = holds[mark:], loops[mark:]
    engine.stop()
    during = [h for (h, _, _), c in zip(holds, compacting, strict=False) if c]
    outside = [h for (h, _, _), c in zip(holds[mark:], compacting[mark:], strict=False) if not c]
    log(f"  compactions: {compactions[0]}, {len(compaction_steps)} steps, the longest "
        f"{max(compaction_steps, default=0.0) * 1e3:.1f} ms CPU; the longest hold while one ran "
        f"{max(during, default=0.0) * 1e3:.1f} ms, in the windows while none ran {max(outside, default=0.0) * 1e3:.1f} ms")
    for op, read_steps in sorted(steps_by_read.items()):  # not ``spent``: the loops' times, below
        log(f"  read {op}: {len(read_steps):,} steps, the longest {max(read_steps) * 1e3:.2f} ms CPU, "
            f"p99 {sorted(read_steps)[int(0.99 * (len(read_steps) - 1))] * 1e3:.2f} ms, "
            f"{sum(read_steps):.2f} s in all")
    if PROFILE is not None:
        import pstats
        pstats.Stats(PROFILE).sort_stats("tottime").print_stats(15)
    for cpu, where in sorted(long_steps, reverse=True)[:8]:
        log(f"  a step over 4 ms: {cpu * 1e3:.2f} ms CPU, {where}")
    hs = sorted(h for h, _, _ in window)
    # the longest: over the whole run, the first poll (the attach) included
    longest = max(h for h, _, _ in holds)
    longest_ng = max(h - g for h, g, _ in holds)
    longest_cpu = max(c for _, _, c in holds)
    return {"nodes": built.facts["nodes"], "sessions": cfg.sessions, "build_s": built.build_s,
            "first_poll_s": first_s, "compactions": compactions[0],
            "requests_finished": engine.requests_finished,
            "modes": {"index": {"steps": len(hs), "longest_ms": longest * 1e3, "longest_without_gc_ms": longest_ng * 1e3,
                                "longest_cpu_ms": longest_cpu * 1e3,
                                "longest_in_window_ms": hs[-1] * 1e3, "p99_ms": hs[int(0.99 * (len(hs) - 1))] * 1e3,
                                "median_ms": statistics.median(hs) * 1e3,
                                "share": sum(hs) / sum(spent), "seconds": sum(spent)}}}


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| tree | mode | seconds | steps | longest hold (ms) | the same less GC pauses (ms) "
             "| longest, the scheduler thread's own CPU (ms) | p99 (ms) | median (ms) "
             "| share of the scheduler | goal | met |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        for name in ("walk", "index"):
            m = r["modes"].get(name)
            if m is None:
                continue
            met = m["longest_ms"] <= GOAL_LONGEST_MS and m["share"] <= GOAL_SHARE
            label = "before (walk)" if name == "walk" else "as now (index)"
            if r.get("bundled"):
                label = f"bundled engine, as now ({r['compactions']} compactions in slices)"
            lines.append(f"| {fmt_nodes(r['nodes'])} nodes, {r['sessions']:,} sessions | {label} | "
                         f"{m.get('seconds', 0):.0f} | {m['steps']:,} | "
                         f"{m['longest_ms']:.1f} | {m['longest_without_gc_ms']:.1f} | {m.get('longest_cpu_ms', 0):.1f} | "
                         f"{m['p99_ms']:.2f} | {m['median_ms']:.3f} | "
                         f"{m['share']:.2%} | "
                         f"<= {GOAL_LONGEST_MS:g} ms, <= {GOAL_SHARE:.0%} | {'yes' if met else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20k nodes, short windows (CI smoke run)")
    parser.add_argument("--unified", action="store_true", help="0.5.23 UnifiedRadixCache (Python core)")
    parser.add_argument("--bundled", action="store_true", help="radixtop's own engine instead of SGLang")
    parser.add_argument("--sizes", type=int, nargs="*", help="node counts (default 100000 1000000)")
    parser.add_argument("--windows", type=int, default=None, help="alternating windows per size")
    parser.add_argument("--window-s", type=float, default=None)
    parser.add_argument("--session-rows", type=int, default=None,
                        help="session rows each poll reads (default: SESSIONS_LOADED, what a pane of up to "
                             "30 rows asks for; a taller pane asks for three of its screens)")
    parser.add_argument("--baseline-s", type=float, default=None,
                        help="length of the baseline's (walk) windows (default: --window-s)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sglang_holds.json")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([20_000] if args.quick else [100_000, 1_000_000])
    windows = args.windows or (2 if args.quick else 4)
    window_s = args.window_s or (4.0 if args.quick else 20.0)
    rows = []
    for size in sizes:
        if args.bundled:
            log(f"{fmt_nodes(size)} nodes: radixtop's engine")
            rows.append({**measure_bundled(size, window_s, windows), "bundled": True})
            gc.unfreeze()
            gc.collect()
            continue
        capacity = size * 40 + 100_000
        log(f"{fmt_nodes(size)} nodes: growing a real SGLang tree ({'unified' if args.unified else 'RadixCache'})")
        tree = Tree(args.unified, capacity)
        grown = grow(tree, size)
        log(f"  {grown['nodes']:,} nodes, {grown['sessions']:,} sessions in {grown['build_s']:.0f} s")
        modes = measure(tree, grown, window_s, windows, args.baseline_s, args.session_rows)
        rows.append({"nodes": grown["nodes"], "sessions": grown["sessions"], "build_s": grown["build_s"],
                     "modes": modes})
        del tree, grown
        gc.unfreeze()
        gc.collect()
    table = report(rows)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": environment(), "rows": rows, "window_s": window_s,
                                    "windows": windows}, indent=1))
    print(f"\n_{'quick' if args.quick else 'full'} run; JSON: {args.out}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
