"""radixtop's dashboard (the real Textual app) driven headless by Textual's Pilot, on caches of ~10k
and ~1M nodes, and the cost of a dashboard to a running engine.

Run from the repository root:

    .venv/bin/python benchmarks/bench_dashboard.py            # full run (10k and 1M nodes; < 10 min)
    .venv/bin/python benchmarks/bench_dashboard.py --quick    # CI smoke run (10k and 100k nodes; < 90 s)

Prints Markdown tables and writes every raw number to ``benchmarks/results/dashboard.json``.
See ``benchmarks/README.md`` for what each figure means.

The caches are built fast: a ``Scheduler`` on a ``meta`` KV pool with the llama-3-8b geometry (shapes,
no memory) and a large capacity, driven directly (``scheduler.request`` for the sessions,
``cache.insert`` with real slots from the pool's allocator for the rest), wrapped in
``Engine(scheduler, None).start()`` (the owner thread, no workload) and a ``BundledAdapter``. Every
measurement runs ``RadixtopApp`` itself under ``app.run_test(size=(160, 48))``; the app and the
adapter are only wrapped to time their calls (instance attributes and a subclass that times each
adapter call), never changed.

Sections:

1. ``trees``: one of ~10k nodes and one of ~1M, with the same 3,000 sessions (the same node ids),
   system prompts, a 1k-children node and a 1k-deep chain; the 1M one adds a node with 100k
   children and a chain 10k deep, and a forest of small trees up to the node count.
2. ``first_paint``: from constructing the app to the first completed poll with rows on screen.
3. ``keys``: key-press-to-screen latency: from ``pilot.press`` until the widgets reflect the key,
   the workers are idle and ``pilot.pause()`` (which repaints the screen) has returned; and the
   same key measured directly (the key event, then 1 ms checks and one screen update), without
   Pilot's idle-detection sleeps (about 88 ms a press).
4. ``frame``: the work of one poll, with the poll timer off: ``collect()`` + ``apply_snapshot()``
   + ``render_line`` of every visible line of the tree and the sessions table, on an unchanged
   tree and right after a tree change, with the same nodes expanded at 10k and at 1M.
5. ``throughput``: ``engine.requests_finished`` over a fixed window for an engine running the demo
   workload flat out on a ~100k-node cache, with a dashboard attached (1 s refresh) and without,
   alternating runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent

import numpy as np  # noqa: E402
from _common import EngineHolds, fmt_nodes, log, median  # noqa: E402

pc = time.perf_counter
SIZE = (160, 48)  # the terminal the app runs in (columns, lines)


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeConfig:
    label: str
    target_nodes: int  # the forest grows the tree until it has at least this many nodes
    fanouts: tuple[int, ...] = (1_000,)  # children of each few-shot prompt (sessionless)
    chains: tuple[int, ...] = (1_000,)  # depths of runs of single children under the root
    sessions: int = 3_000  # sessions that tag nodes (closed ones are among them)
    system_prompts: int = 4
    system_prompt_len: tuple[int, int] = (256, 512)
    turns: tuple[int, int] = (1, 3)
    user_len: tuple[int, int] = (8, 64)
    output_len: tuple[int, int] = (8, 64)
    regenerate_share: float = 0.05
    closed_sessions: int = 100  # closed after the trace (tombstoned; listed as closed)
    running_requests: int = 16  # begun, not finished: they lock their paths
    fanout_prompt_len: int = 1024
    fanout_tail: tuple[int, int] = (4, 16)
    chain_node_tokens: int = 4
    segment_len: tuple[int, int] = (2, 8)  # tokens per node of the forest
    group_prefix_len: tuple[int, int] = (16, 64)
    extra_capacity: int = 0  # free slots on top of what the tree needs (room for a workload)
    vocab: int = 128_256  # llama-3
    seed: int = 11


@dataclass(frozen=True)
class BenchConfig:
    mode: str
    small: TreeConfig
    large: TreeConfig
    throughput_tree: TreeConfig
    paint_repeats: int  # app starts per tree (first paint)
    down_presses: int  # cursor-down presses per tree
    press_repeats: int  # expand / collapse / sort / next-page presses per tree
    chain_repeats: int  # fold + unfold of the 1k chain
    long_chain_repeats: int  # fold + unfold of the long chain (large tree only)
    frame_repeats: int  # polls per mode per tree per block
    frame_blocks: int  # blocks of (small, large) app sessions, alternating
    tp_pairs: int  # (without, with) pairs of throughput runs, order alternating
    tp_window_s: float
    tp_warmup_s: float  # engine running before the window opens (without the dashboard)
    alt_pairs: int  # (without, with) windows in the one-engine alternating run
    alt_window_s: float
    interval: float = 1.0  # the dashboard's refresh (its default)


def full_config() -> BenchConfig:
    return BenchConfig(
        mode="full",
        small=TreeConfig("10k", 10_000),
        large=TreeConfig("1M", 1_000_000, fanouts=(1_000, 100_000), chains=(1_000, 10_000)),
        throughput_tree=TreeConfig("1M", 1_000_000, fanouts=(1_000, 100_000), extra_capacity=40_000_000),
        paint_repeats=5, down_presses=60, press_repeats=10, chain_repeats=5, long_chain_repeats=3,
        frame_repeats=10, frame_blocks=4, tp_pairs=6, tp_window_s=20.0, tp_warmup_s=2.0,
        alt_pairs=40, alt_window_s=5.0,
    )


def quick_config() -> BenchConfig:
    return BenchConfig(
        mode="quick",
        small=TreeConfig("10k", 10_000),
        large=TreeConfig("100k", 100_000, fanouts=(1_000, 10_000), chains=(1_000, 2_000)),
        throughput_tree=TreeConfig("30k", 30_000, extra_capacity=4_000_000),
        paint_repeats=2, down_presses=12, press_repeats=3, chain_repeats=2, long_chain_repeats=1,
        frame_repeats=6, frame_blocks=1, tp_pairs=1, tp_window_s=6.0, tp_warmup_s=1.0,
        alt_pairs=4, alt_window_s=2.0,
    )


# Goals (see benchmarks/README.md).
GOAL_FIRST_PAINT_S = 1.0  # at 1M nodes
GOAL_FRAME_RATIO = 1.2  # one poll's work at 1M / at 10k, same things expanded
GOAL_THROUGHPUT_SHARE = 0.95  # requests finished with a dashboard attached / without
INSTANT_MS = 100.0  # reference for key presses (not a goal): what still feels instant


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------




def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def ms_stats(secs: list[float]) -> dict[str, Any] | None:
    """Milliseconds: median, p90 (nearest rank), min, max, and every sample."""
    if not secs:
        return None
    ms = sorted(x * 1e3 for x in secs)
    p90 = ms[min(len(ms) - 1, max(0, -(-90 * len(ms) // 100) - 1))]
    return {"median": statistics.median(ms), "p90": p90, "min": ms[0], "max": ms[-1], "n": len(ms),
            "samples": [x * 1e3 for x in secs]}




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
# the trees
# ----------------------------------------------------------------------------------------------

# Shapes of the forest's groups: a full tree of (branching, depth) under one prefix node.
GROUP_SHAPES = ((2, 6), (3, 4), (4, 3), (5, 3), (6, 3), (8, 2), (16, 2))


class TokenPool:
    """Random token ids from a pre-drawn pool (fast and reproducible)."""

    def __init__(self, rng: np.random.Generator, vocab: int, size: int = 1 << 20):
        self.pool = rng.integers(0, vocab, size).tolist()
        self.size = size
        self.cursor = 0

    def take(self, n: int) -> list[int]:
        if self.cursor + n > self.size:
            self.cursor = 0
        out = self.pool[self.cursor : self.cursor + n]
        self.cursor += n
        return out


@dataclass
class Built:
    label: str
    scheduler: Any
    build_s: float
    facts: dict[str, Any]
    system_ids: list[int]  # system prompt nodes, in the order they were made
    system_prompts: list[tuple[int, ...]]
    fanout_ids: dict[int, int]  # children -> node id
    chain_ids: dict[int, int]  # depth -> id of the chain's top node (a root child)
    engine: Any = None
    holds: Any = None


def build_tree(cfg: TreeConfig, with_facts: bool = True) -> Built:
    """Sessions first (identical in every tree built from the same seed: same node ids), then the
    few-shot fan-outs, the chains, and a sessionless forest up to ``target_nodes``; finally a few
    running requests. GC is off while building; the tree is then collected and frozen."""
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler

    mean = lambda r: (r[0] + r[1]) / 2  # noqa: E731
    est = (cfg.system_prompts * cfg.system_prompt_len[1]
           + cfg.sessions * mean(cfg.turns) * 1.1 * (mean(cfg.user_len) + mean(cfg.output_len))
           + sum(cfg.fanout_prompt_len + n * (1 + cfg.fanout_tail[1]) for n in cfg.fanouts)
           + sum(d * cfg.chain_node_tokens for d in cfg.chains)
           + cfg.target_nodes * (cfg.segment_len[1] + cfg.group_prefix_len[1] / 8)
           + cfg.running_requests * 2 * cfg.user_len[1])
    capacity = (int(est * 1.2) + cfg.extra_capacity) // 1024 * 1024 + 1024
    geometry = get_geometry("llama-3-8b")
    s = Scheduler(geometry, capacity, device="meta")
    cache, allocator = s.cache, s.pool.allocator
    prng = random.Random(cfg.seed)
    tokens = TokenPool(np.random.default_rng(cfg.seed), cfg.vocab)
    # Root children are keyed by their first token: draw those distinct.
    first_tokens = iter(np.random.default_rng(cfg.seed + 1).permutation(cfg.vocab).tolist())
    t0 = pc()
    gc.collect()
    gc.disable()
    try:
        # 1. system prompts and sessions, through the scheduler (the same in every tree)
        systems = []
        for i in range(cfg.system_prompts):
            prompt = [next(first_tokens)] + tokens.take(prng.randint(*cfg.system_prompt_len) - 1)
            s.request(f"sys{i}", prompt, [], None)
            systems.append(tuple(prompt))
        history: dict[str, list[int]] = {}
        last_input: dict[str, list[int]] = {}
        turns_left: dict[str, int] = {}
        for k in range(cfg.sessions):
            sid = f"u{k:05d}"
            history[sid] = list(systems[prng.randrange(cfg.system_prompts)])
            turns_left[sid] = prng.randint(*cfg.turns)
        rid = itertools.count()
        active = list(history)
        while active:
            still = []
            for sid in active:
                if sid in last_input and prng.random() < cfg.regenerate_share:
                    inp = last_input[sid]
                else:
                    inp = history[sid] + tokens.take(prng.randint(*cfg.user_len))
                    turns_left[sid] -= 1
                out = tokens.take(prng.randint(*cfg.output_len))
                s.request(f"r{next(rid)}", inp, out, sid)
                last_input[sid] = inp
                history[sid] = inp + out
                if turns_left[sid] > 0:
                    still.append(sid)
            active = still
        sids = list(history)
        for sid in prng.sample(sids, cfg.closed_sessions):
            s.close_session(sid)
        session_nodes = cache.node_count()

        # 2. few-shot prompts with many continuations (sessionless)
        frng = random.Random(cfg.seed + 2)
        fanout_ids = {}
        for n in cfg.fanouts:
            prompt = tuple([next(first_tokens)] + tokens.take(cfg.fanout_prompt_len - 1))
            fan = cache.insert(prompt, allocator.alloc(len(prompt))).last_node
            plen = len(prompt)
            kids = np.random.default_rng(cfg.seed + n).permutation(cfg.vocab)[:n].tolist()
            for j in range(n):
                tail = (kids[j], *tokens.take(frng.randint(*cfg.fanout_tail)))
                value = np.zeros(plen + len(tail), dtype=np.int64)
                value[plen:] = allocator.alloc(len(tail))
                r = cache.insert(prompt + tail, value)
                assert r.prefix_len == plen
            assert len(fan.children) == n
            fanout_ids[n] = fan.id

        # 3. chains of single children: the whole run inserted once, then ever shorter prefixes
        #    of it (each splits the top node, so no insert walks the chain)
        chain_ids = {}
        per = cfg.chain_node_tokens
        for depth in cfg.chains:
            length = depth * per
            key = tuple([next(first_tokens)] + tokens.take(length - 1))
            slots = allocator.alloc(length)
            cache.insert(key, slots)
            for k in range(1, depth):
                r = cache.insert(key[: length - k * per], slots[: length - k * per])
                assert r.prefix_len == length - k * per
            chain_ids[depth] = cache.root_node.children[key[0]].id

        # 4. a sessionless forest of small full trees, until the tree has target_nodes nodes
        grng = random.Random(cfg.seed + 3)
        groups = 0
        while cache.node_count() < cfg.target_nodes - cfg.running_requests:
            b, d = grng.choice(GROUP_SHAPES)
            _insert_group(cache, allocator, grng, tokens, next(first_tokens), b, d, cfg)
            groups += 1

        # 5. running requests: the next turn of some open sessions, begun and not finished
        open_sids = [x for x in sids if not cache.is_session_closed(x)]
        for k, sid in enumerate(prng.sample(open_sids, cfg.running_requests)):
            s.begin(f"run{k}", history[sid] + tokens.take(prng.randint(*cfg.user_len)), sid)
    finally:
        gc.enable()
    build_s = pc() - t0
    gc.collect()
    gc.freeze()  # the tree is long-lived: keep later collections from walking it

    system_ids = [cache.lookup(p).last_node.id for p in systems]
    facts: dict[str, Any] = {"label": cfg.label, "nodes": cache.node_count(), "build_s": build_s,
                             "session_nodes": session_nodes, "forest_groups": groups}
    if with_facts:
        max_children, max_depth = 0, 0
        stack = [(cache.root_node, 0)]
        while stack:
            node, depth = stack.pop()
            max_children = max(max_children, len(node.children))
            max_depth = max(max_depth, depth)
            stack.extend((c, depth + 1) for c in node.children.values())
        st = s.stats()
        facts.update({
            "tokens": st.total_size,
            "capacity_tokens": st.capacity,
            "bytes_per_token": geometry.bytes_per_token,
            "sessions_tagging": len(cache._session_leaves),
            "sessions_known": len(s.session_activity),
            "closed_sessions": len(cache.closed_session_ids()),
            "tagged_nodes": sum(len(v) for v in cache._session_leaves.values()),
            "running_requests": len(s.running),
            "root_children": len(cache.root_node.children),
            "system_prompt_children": [len(cache.nodes[i].children) for i in system_ids],
            "fanouts": {str(n): len(cache.nodes[i].children) for n, i in fanout_ids.items()},
            "chains": list(cfg.chains),
            "max_children": max_children,
            "max_depth": max_depth,
        })
    return Built(cfg.label, s, build_s, facts, system_ids, systems, fanout_ids, chain_ids)


def _insert_group(cache, allocator, prng: random.Random, tokens: TokenPool, first: int,
                  b: int, d: int, cfg: TreeConfig) -> None:
    """A full tree of branching ``b`` and depth ``d`` under one prefix, leaf paths in DFS order.
    Each insert allocates slots only for the tokens past the previous path's divergence."""
    prefix = tuple([first] + tokens.take(prng.randint(*cfg.group_prefix_len) - 1))
    segments: dict[tuple[int, ...], tuple[int, ...]] = {}
    lo, hi = cfg.segment_len
    upto = [prefix]
    prev: tuple[int, ...] | None = None
    for path in itertools.product(range(b), repeat=d):
        div = 0 if prev is None else next(i for i in range(d) if path[i] != prev[i])
        del upto[div + 1 :]
        for level in range(div, d):
            node_path = path[: level + 1]
            seg = segments.get(node_path)
            if seg is None:
                seg = segments[node_path] = (path[level],) + tuple(tokens.take(prng.randint(lo, hi) - 1))
            upto.append(upto[-1] + seg)
        key = upto[-1]
        off = 0 if prev is None else len(upto[div])
        value = np.zeros(len(key), dtype=np.int64)
        value[off:] = allocator.alloc(len(key) - off)
        r = cache.insert(key, value)
        assert r.prefix_len == off, (r.prefix_len, off)
        prev = path


def release(built: Built) -> None:
    """Stop the tree's engine and give its memory back (the tree was frozen: unfreeze first)."""
    if built.engine is not None:
        built.engine.stop()
    built.engine = built.scheduler = built.holds = None
    gc.unfreeze()
    gc.collect()


def change_tree(engine, prompt: tuple[int, ...], counter=itertools.count()) -> None:
    """A sessionless request for a fully cached system prompt: it locks and unlocks the prompt's
    node, so the cache's version moves (a live engine's every step) while the tree keeps its shape."""
    engine.call(lambda s: s.request(f"touch{next(counter)}", list(prompt), [], None), 30.0)


# ----------------------------------------------------------------------------------------------
# instrumentation (wraps, never edits, the code under test)
# ----------------------------------------------------------------------------------------------




READS = ("stats", "changes", "children", "sessions", "node", "session")


def timed_adapter(engine, **kwargs):
    """A BundledAdapter that logs (method, seconds) of each read and each ``_attribute`` call."""
    from radixtop.adapters.bundled import BundledAdapter

    class TimedAdapter(BundledAdapter):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.calls: list[tuple[str, float]] = []
            self.attribute_log: list[tuple[bool, float]] = []

        def _attribute(self, s):
            before = self.attributions.current
            t0 = pc()
            result = super()._attribute(s)
            self.attribute_log.append((result is not before, pc() - t0))
            return result

    def wrap(name):
        def method(self, *args, **kw):
            t0 = pc()
            try:
                return getattr(BundledAdapter, name)(self, *args, **kw)
            finally:
                self.calls.append((name, pc() - t0))

        method.__name__ = name
        return method

    for name in READS:
        setattr(TimedAdapter, name, wrap(name))
    return TimedAdapter(engine, **kwargs)


def instrument(app) -> None:
    """Time the app's per-poll read and render step, and note every screen update the compositor
    hands to the (headless) driver and the node the detail panel last showed (instance attributes
    over the real methods)."""
    app.bench_collect: list[float] = []
    app.bench_apply: list[float] = []
    app.bench_first_rows_at = None
    app.bench_displays: list[float] = []
    app.bench_detail_id = None
    collect, apply, display, show_detail = app.collect, app.apply_snapshot, app._display, app._show_detail

    def timed_display(screen, renderable):
        if renderable is not None:
            app.bench_displays.append(pc())
        display(screen, renderable)

    def noted_detail(d):
        show_detail(d)
        if d.node.id == app.selected_node:
            app.bench_detail_id = d.node.id

    app._display, app._show_detail = timed_display, noted_detail

    def timed_collect():
        t0 = pc()
        snap = collect()
        app.bench_collect.append(pc() - t0)
        return snap

    def timed_apply(snap):
        t0 = pc()
        apply(snap)
        t1 = pc()
        app.bench_apply.append(t1 - t0)
        if app.bench_first_rows_at is None and snap.get("rows"):
            app.bench_first_rows_at = t1

    app.collect, app.apply_snapshot = timed_collect, timed_apply


def hook_screen(app) -> None:
    """Time every screen update (``Screen._on_timer_update``: layout if needed, then the
    compositor renders the dirty widgets and hands the update to the driver), whether its update
    timer or ``pilot.pause()`` runs it. Call once the app runs."""
    screen = app.screen
    app.bench_screen_updates: list[tuple[float, float]] = []
    update = screen._on_timer_update

    def timed_update():
        t0 = pc()
        update()
        app.bench_screen_updates.append((t0, pc() - t0))

    screen._on_timer_update = timed_update  # what pilot.pause() calls
    screen._update_timer._callback = timed_update  # what the screen's update timer calls


def start_engine(built: Built) -> None:
    from radixtop.gpu_backend.engine import Engine

    built.engine = Engine(built.scheduler, None).start()
    built.holds = EngineHolds(built.engine)


# ----------------------------------------------------------------------------------------------
# driving the app
# ----------------------------------------------------------------------------------------------


async def idle(pilot, app) -> None:
    """Until no worker runs and the screen has caught up."""
    for _ in range(1000):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not len(app.workers):
            return
    raise RuntimeError("the app's workers never went idle")


async def press_pilot(pilot, app, key: str, done: Callable[[], bool], timeout: float = 120.0) -> float:
    """Seconds from ``pilot.press(key)`` until ``done()`` holds, no worker runs, and
    ``pilot.pause()`` (which ends with a screen update) has returned."""
    t0 = pc()
    await pilot.press(key)
    while True:
        await app.workers.wait_for_complete()
        await pilot.pause()
        if done() and not len(app.workers):
            return pc() - t0
        if pc() - t0 > timeout:
            raise RuntimeError(f"key {key!r}: the screen did not reflect it within {timeout:.0f} s")


_KEY_CHARS = {"enter": "\r", "down": None}


async def press_direct(pilot, app, key: str, done: Callable[[], bool], timeout: float = 120.0) -> float:
    """The same key event Pilot sends, handed to the driver; then a 1 ms check (no idle-detection
    sleeps) until ``done()`` holds, no worker runs and no message is queued; then one screen update
    (what ``pilot.pause()`` ends with). Seconds from sending the key to the end of that update."""
    from textual import events
    from textual.worker import WorkerError

    from radixtop.inspector.sessions_view import SessionsTable
    from radixtop.inspector.tree_view import CacheTree

    pumps = (app, app.screen, app.query_one(CacheTree), app.query_one(SessionsTable))
    t0 = pc()
    app._driver.send_message(events.Key(key, _KEY_CHARS.get(key, key)))
    while True:
        if len(app.workers):
            try:  # event-driven while a worker runs: polling here would compete with it for the GIL
                await app.workers.wait_for_complete()
            except WorkerError:  # not started yet
                await asyncio.sleep(0.001)
        else:
            await asyncio.sleep(0.001)
        if done() and not len(app.workers) and all(p._message_queue.empty() for p in pumps):
            app.screen._on_timer_update()
            t1 = pc()
            break
        if pc() - t0 > timeout:
            raise RuntimeError(f"key {key!r}: the screen did not reflect it within {timeout:.0f} s")
    await idle(pilot, app)  # untimed: let anything that follows settle before the next key
    return t1 - t0


def row_of(tree, key: tuple[str, int]):
    return next((r for r in tree.rows if r.key == key), None)


async def prime(pilot, app) -> None:
    """First poll by hand (the timer is off): collect, then apply on the UI thread."""
    await idle(pilot, app)
    app.apply_snapshot(app.collect())
    await idle(pilot, app)


async def set_view(pilot, app, expand: list[tuple[int, int]], cursor: tuple[str, int] | None) -> None:
    """A known state: the root and ``expand`` [(node id, children loaded)] open, no chains folded,
    order bytes, the cursor on ``cursor``. Set on the app's own TreeState, under its lock."""
    from radixtop.adapters.model import ROOT_ID
    from radixtop.inspector.tree_view import CacheTree

    with app.tree_lock:
        st = app.tree_state
        st.expanded, st.loaded, st.chains, st.order = {ROOT_ID}, {}, {}, "bytes"
        st.load(ROOT_ID)
        for node_id, count in expand:
            st.expanded.add(node_id)
            st.load(node_id, count)
        rows = list(st.flatten())
    tree = app.query_one(CacheTree)
    tree.set_rows(rows, app.stats.total_bytes, "bytes")
    if cursor is not None:
        if row_of(tree, cursor) is None:
            raise RuntimeError(f"row {cursor} is not in the view")
        tree.move_to_key(cursor)
    else:
        tree.cursor = 0
    tree.focus()
    await idle(pilot, app)


def run_app(session):
    """Run one app session (a coroutine around ``app.run_test``) in a fresh event loop, then collect
    and freeze what survives it. Textual keeps about 9k GC-tracked objects of every finished app in
    process-wide caches; frozen, they stay out of the next sessions' collections, as they would in a
    process that runs one app."""
    try:
        return asyncio.run(session)
    finally:
        gc.collect()
        gc.freeze()


def new_app(built: Built, poll: bool, interval: float = 1.0):
    from radixtop.inspector.app import RadixtopApp

    adapter = timed_adapter(built.engine, name=f"bench {built.label}")
    app = RadixtopApp(adapter, target=f"bench {built.label}", interval=interval, poll=poll)
    instrument(app)
    return app, adapter


# ----------------------------------------------------------------------------------------------
# 2. first paint
# ----------------------------------------------------------------------------------------------


async def one_first_paint(built: Built, interval: float) -> dict[str, float]:
    from radixtop.inspector.tree_view import CacheTree

    t0 = pc()
    app, adapter = new_app(built, poll=True, interval=interval)  # a fresh adapter: nothing cached
    async with app.run_test(size=SIZE) as pilot:
        t_ready = pc()
        tree = app.query_one(CacheTree)
        while not (app.bench_first_rows_at is not None
                   and app.bench_displays and app.bench_displays[-1] > app.bench_first_rows_at):
            if pc() - t0 > 120:
                raise RuntimeError("no first poll within 120 s")
            await asyncio.sleep(0.001)
        t_screen = next(t for t in app.bench_displays if t > app.bench_first_rows_at)
        await pilot.pause()  # and until the app is idle (Pilot's idle detection)
        t_idle = pc()
        line = "".join(seg.text for seg in tree.render_line(0))
        if "#" not in line:
            raise RuntimeError(f"first tree line has no node: {line!r}")
        attr = [s for cold, s in adapter.attribute_log if cold]
        return {"ready_s": t_ready - t0, "collect_s": app.bench_collect[0], "apply_s": app.bench_apply[0],
                "applied_s": app.bench_first_rows_at - t0, "paint_s": t_screen - t0, "idle_s": t_idle - t0,
                "attribute_s": attr[0] if attr else 0.0, "rows": len(tree.rows)}


def measure_first_paint(cfg: BenchConfig, trees: list[Built]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {b.label: [] for b in trees}
    for k in range(cfg.paint_repeats):
        for b in trees if k % 2 == 0 else trees[::-1]:
            runs[b.label].append(run_app(one_first_paint(b, cfg.interval)))
    out = {}
    for label, rs in runs.items():
        out[label] = {key: ms_stats([r[key] for r in rs]) for key in
                      ("ready_s", "collect_s", "attribute_s", "apply_s", "applied_s", "paint_s", "idle_s")}
        out[label]["rows"] = rs[0]["rows"]
    return out


# ----------------------------------------------------------------------------------------------
# 3. key presses
# ----------------------------------------------------------------------------------------------


def views(built: Built) -> dict[str, list[tuple[int, int]]]:
    """V: root, system prompt 0 and the 1k-children node open (first page each).
    V+ (when the tree has one): V and the 100k-children node open."""
    base = [(built.system_ids[0], 100), (built.fanout_ids[1_000], 100)]
    big = max(built.fanout_ids)
    out = {"V": base}
    if big != 1_000:
        out["V+"] = base + [(built.fanout_ids[big], 100)]
    return out


async def key_session(cfg: BenchConfig, built: Built, method: str) -> dict[str, Any]:
    """Every key press in turn, timed with ``method``: "pilot" (``press_pilot``) or "direct"."""
    from radixtop.inspector.tree_view import CacheTree

    press = press_pilot if method == "pilot" else press_direct
    app, adapter = new_app(built, poll=False)
    res: dict[str, Any] = {}
    async with app.run_test(size=SIZE) as pilot:
        hook_screen(app)
        await prime(pilot, app)
        tree = app.query_one(CacheTree)
        st = app.tree_state
        v = views(built)
        p0, p1 = built.system_ids[0], built.system_ids[1]

        # a key bound to nothing: the floor of the method itself
        await set_view(pilot, app, v["V"], None)
        res["noop"] = [await press(pilot, app, "z", lambda: True) for _ in range(cfg.press_repeats)]

        # cursor down, N times from the top of V (scrolls past the first screen); done when the
        # detail panel shows the new row's node
        times = []
        for i in range(cfg.down_presses):
            want = tree.cursor + 1
            times.append(await press(pilot, app, "down", lambda: tree.cursor == want and tree.current is not None
                                     and app.bench_detail_id == tree.current.node.id))
        res["down"] = times

        # expand (first load of its first page) and collapse: a system prompt, then the fan-outs
        async def expand_collapse(node_id: int, key_e: str, key_c: str, base) -> None:
            await set_view(pilot, app, base, ("node", node_id))
            te, tc = [], []
            for _ in range(cfg.press_repeats):
                with app.tree_lock:
                    st.loaded.pop(node_id, None)  # so every expand loads its page again
                te.append(await press(pilot, app, "enter", lambda: (r := row_of(tree, ("node", node_id)))
                                      is not None and r.expanded))
                tc.append(await press(pilot, app, "enter", lambda: not row_of(tree, ("node", node_id)).expanded))
            res[key_e], res[key_c] = te, tc

        await expand_collapse(p1, "expand_system", "collapse_system", v["V"])
        base = [(p0, 100)]
        for n, node_id in sorted(built.fanout_ids.items()):
            await expand_collapse(node_id, f"expand_fanout_{n}", f"collapse_fanout_{n}", base)

        # the next page of children ("more" row) under each fan-out
        for n, node_id in sorted(built.fanout_ids.items()):
            view = v["V"] if n == 1_000 else v["V+"]
            await set_view(pilot, app, view, ("more", node_id))
            times = []
            for _ in range(min(cfg.press_repeats, n // 100 - 2)):
                want = len(st.loaded[node_id].children) + 100
                times.append(await press(pilot, app, "enter", lambda: len(st.loaded[node_id].children) == want
                                         and row_of(tree, ("more", node_id)).more == n - want))
            res[f"more_{n}"] = times

        # sort order (o): bytes -> recency -> bytes ..., in V and in V+
        for name, view in v.items():
            await set_view(pilot, app, view, ("node", p0))
            times = []
            for _ in range(cfg.press_repeats):
                want = "recency" if st.order == "bytes" else "bytes"
                times.append(await press(pilot, app, "o", lambda: st.order == want and tree.order == want))
            res[f"order_{name}"] = times

        # fold (x) a chain of single children into one row, and unfold it
        for depth, top in sorted(built.chain_ids.items()):
            await set_view(pilot, app, v["V"], ("node", top))
            reps = cfg.chain_repeats if depth <= 1_000 else cfg.long_chain_repeats
            tf, tu = [], []
            for _ in range(reps):
                tf.append(await press(pilot, app, "x", lambda: any(
                    r.kind == "chain" and r.chain[0].id == top and len(r.chain) == depth for r in tree.rows)))
                tu.append(await press(pilot, app, "x", lambda: row_of(tree, ("node", top)) is not None))
            res[f"fold_chain_{depth}"], res[f"unfold_chain_{depth}"] = tf, tu
    return res


def measure_keys(cfg: BenchConfig, trees: list[Built]) -> dict[str, Any]:
    out: dict[str, Any] = {b.label: {} for b in trees}
    for method in ("pilot", "direct"):
        for b in trees:
            log(f"  keys on {b.label}, {method}")
            raw = run_app(key_session(cfg, b, method))
            out[b.label][method] = {k: ms_stats(v) for k, v in raw.items()}
    return out


# ----------------------------------------------------------------------------------------------
# 4. frame work per refresh
# ----------------------------------------------------------------------------------------------


async def frame_session(cfg: BenchConfig, built: Built) -> dict[str, Any]:
    """The poll timer is off; each poll is ``collect()`` (normally a worker thread) then
    ``apply_snapshot()`` (the UI thread), called here on the app's own thread, one after the
    other, then ``render_line`` for every visible line of the tree and the sessions table."""
    from radixtop.inspector.sessions_view import SessionsTable
    from radixtop.inspector.tree_view import CacheTree

    app, adapter = new_app(built, poll=False)
    # The worst case: every changed poll recomputes attribution (no reuse within max age).
    adapter.attributions.max_age = adapter.attributions.budget = 0.0
    adapter.attributions.inline_s = float("inf")  # on the spot, in the frame's own poll
    out: dict[str, Any] = {}
    async with app.run_test(size=SIZE) as pilot:
        hook_screen(app)
        await prime(pilot, app)
        tree, table = app.query_one(CacheTree), app.query_one(SessionsTable)
        for vname, view in views(built).items():
            await set_view(pilot, app, view, ("node", built.system_ids[0]))
            app.apply_snapshot(app.collect())  # warm: the next polls see no change
            await idle(pilot, app)
            for mode in ("idle", "changed"):
                rec = {k: [] for k in ("collect", "apply", "render", "total", "screen", "hold", "after")}
                rec["after_calls"] = []
                rec.update({f"call_{k}": [] for k in (*READS, "attribute", "other")})
                rec["rows"] = len(tree.rows)
                for _ in range(cfg.frame_repeats):
                    if mode == "changed":
                        change_tree(built.engine, built.system_prompts[0])
                    mark_calls, mark_attr = len(adapter.calls), len(adapter.attribute_log)
                    mark_hold = built.holds.mark()
                    t0 = pc()
                    snap = app.collect()
                    t1 = pc()
                    mark_after = len(adapter.calls)
                    app.apply_snapshot(snap)
                    t2 = pc()
                    for y in range(tree.size.height):
                        tree.render_line(y)
                    for y in range(table.size.height):
                        table.render_line(y)
                    t3 = pc()
                    await idle(pilot, app)  # untimed: Textual paints; the detail worker the cursor starts
                    t4 = t3 + sum(d for t, d in app.bench_screen_updates if t >= t3)
                    after = adapter.calls[mark_after:]
                    rec["after"].append(sum(secs for _, secs in after))
                    rec["after_calls"].append(len(after))
                    rec["collect"].append(t1 - t0)
                    rec["apply"].append(t2 - t1)
                    rec["render"].append(t3 - t2)
                    rec["total"].append(t3 - t0)
                    rec["screen"].append(t4 - t3)
                    rec["hold"].append(built.holds.since(mark_hold))
                    per = {k: 0.0 for k in READS}
                    for name, secs in adapter.calls[mark_calls:mark_after]:  # collect's own reads
                        per[name] += secs
                    for k in READS:
                        rec[f"call_{k}"].append(per[k])
                    rec["call_attribute"].append(sum(s for _, s in adapter.attribute_log[mark_attr:]))
                    rec["call_other"].append((t1 - t0) - sum(per.values()))
                    if mode == "changed" and not any(c for c, _ in adapter.attribute_log[mark_attr:]):
                        raise RuntimeError("a changed poll did not recompute attribution")
                out[f"{vname}/{mode}"] = rec
                await idle(pilot, app)
    return out


def measure_frame(cfg: BenchConfig, trees: list[Built]) -> dict[str, Any]:
    merged: dict[str, dict[str, Any]] = {b.label: {} for b in trees}
    for k in range(cfg.frame_blocks):
        for b in trees if k % 2 == 0 else trees[::-1]:
            log(f"  frame work on {b.label} (block {k + 1} of {cfg.frame_blocks})")
            for key, rec in run_app(frame_session(cfg, b)).items():
                into = merged[b.label].setdefault(key, {"rows": rec["rows"]})
                for name, xs in rec.items():
                    if name != "rows":
                        into.setdefault(name, []).extend(xs)
    out: dict[str, Any] = {}
    for label, recs in merged.items():
        out[label] = {key: {name: (xs if name in ("rows", "after_calls") else ms_stats(xs))
                            for name, xs in rec.items()} for key, rec in recs.items()}
    return out


# ----------------------------------------------------------------------------------------------
# 5. engine throughput with and without a dashboard
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

    from radixtop.adapters.bundled import BundledAdapter
    from radixtop.adapters.http.audit import AuditLog
    from radixtop.adapters.http.server import create_app

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


def throughput_run(cfg: BenchConfig, mode: str) -> dict[str, Any]:
    """A fresh ~100k-node cache, an engine running the demo workload flat out on it, and
    ``engine.requests_finished`` counted over ``tp_window_s``: ``without`` a dashboard; with one in
    its own ``process`` attached over the admin API (served by a thread of the engine's process:
    what `radixtop` and the SGLang plugin do); or with one ``inprocess`` on the engine's own
    adapter, sharing its interpreter (a reference: not how radixtop runs)."""
    import subprocess

    with_dashboard = mode != "without"
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.workload import WorkloadConfig
    from radixtop.inspector.tree_view import CacheTree

    built = build_tree(cfg.throughput_tree, with_facts=False)
    wl = WorkloadConfig(arrival_rate=0.0)
    engine = Engine(built.scheduler, wl, step_interval=0.0).start()
    holds = EngineHolds(engine)
    built.engine, built.holds = engine, holds
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
                [sys.executable, str(HERE / "_dashboard_child.py"), url, "bench",
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
                    while not (app.polls >= 1 and tree.rows):
                        if pc() - t0 > 60:
                            raise RuntimeError("no first poll within 60 s")
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(max(0.0, cfg.tp_warmup_s + 3 - (pc() - t0)))
                    polls0, coll0, attr0, hold0 = (app.polls, len(app.bench_collect),
                                                   len(adapter.attribute_log), holds.mark())
                    gc_mark = GC.mark()
                    start = window_open()
                    while (left := start[0] + cfg.tp_window_s - pc()) > 0:
                        await asyncio.sleep(min(1.0, left))
                        series.append(engine.requests_finished)
                    window_close(start)
                    rec["gc"] = GC.since(gc_mark)
                    polls = app.polls - polls0
                    attrs = adapter.attribute_log[attr0:]
                    rec.update({
                        "polls": polls,
                        "collect_ms": ms_stats(app.bench_collect[coll0:]),
                        "engine_hold_ms_per_s": holds.since(hold0) / rec["window_s"] * 1e3,
                        "engine_hold_ms_per_poll": holds.since(hold0) / max(polls, 1) * 1e3,
                        "attribute_cold_per_poll": sum(1 for c, _ in attrs if c) / max(polls, 1),
                        "attribute_ms": ms_stats([s for c, s in attrs if c]),
                        "sessions_listed": len(app.query_one("#sessions").all),
                        "sessions_open": app.stats.open_sessions, "sessions_closed": app.stats.closed_sessions,
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

    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.workload import WorkloadConfig

    built = build_tree(cfg.throughput_tree, with_facts=False)
    engine = Engine(built.scheduler, WorkloadConfig(arrival_rate=0.0), step_interval=0.0).start()
    holds = EngineHolds(engine)
    built.engine, built.holds = engine, holds
    nodes_before = engine.call(lambda s: s.cache.node_count(), 30.0)
    windows: list[dict[str, Any]] = []
    url, server, thread, adapter = serve_in_thread(engine)
    engine_tid = engine._thread.native_id
    api_tid = thread.native_id  # the admin API's event loop (its worker threads come and go)
    # The child runs until SIGUSR1; this is only its limit (the passes between blocks take time too).
    total_s = 3 + cfg.tp_warmup_s + 2 * cfg.alt_pairs * (cfg.alt_window_s + 30) + 60
    child = subprocess.Popen([sys.executable, str(HERE / "_dashboard_child.py"), url, "bench", str(total_s),
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
                while adapter.attributions.refreshing:
                    time.sleep(0.005)
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
            "attributions": {"made": adapter.attributions.made, "in_slices": adapter.attributions.made_in_slices,
                             "work_s": adapter.attributions.work_s},
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
# report
# ----------------------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "NO")


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"




def report(cfg: BenchConfig, res: dict[str, Any]) -> str:
    small, large = cfg.small.label, cfg.large.label
    lines = [
        "### Trees (llama-3-8b KV on a meta pool; built with GC off, then collected and frozen)",
        "",
        "| tree | nodes | tokens | sessions (holding / closed) | running | root children | system prompt "
        "children | fan-outs | chains | max depth | build (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for label in (small, large):
        f = res["trees"][label]
        lines.append(
            f"| {label} | {f['nodes']:,} | {f['tokens'] / 1e6:.2f}M | {f['sessions_known']:,} "
            f"({f['sessions_tagging']:,} / {f['closed_sessions']}) | {f['running_requests']} | "
            f"{f['root_children']:,} | {min(f['system_prompt_children'])}-{max(f['system_prompt_children'])} | "
            f"{', '.join(f'{int(v):,}' for v in f['fanouts'].values())} children | "
            f"{', '.join(f'{d:,}' for d in f['chains'])} deep | {f['max_depth']:,} | {f['build_s']:.1f} |")

    fp = res["first_paint"]
    lines += [
        "",
        f"### Time to first paint: app constructed -> first poll applied with rows on screen "
        f"(median of {cfg.paint_repeats} starts; ms)",
        "",
        "| tree | app ready (mounted) | first `collect()` | of which attribution | rows applied | "
        "**first paint** (on screen) | max | app idle (context) | goal | met |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for label in (small, large):
        p = fp[label]
        goal = label == large
        lines.append(
            f"| {label} | {fmt_ms(p['ready_s']['median'])} | {fmt_ms(p['collect_s']['median'])} | "
            f"{fmt_ms(p['attribute_s']['median'])} | {fmt_ms(p['applied_s']['median'])} | "
            f"**{fmt_ms(p['paint_s']['median'])}** | {fmt_ms(p['paint_s']['max'])} | "
            f"{fmt_ms(p['idle_s']['median'])} | {'< 1 s' if goal else '-'} | "
            f"{verdict(p['paint_s']['median'] < GOAL_FIRST_PAINT_S * 1e3) if goal else '-'} |")

    k = res["keys"]
    big_fan = max(int(x) for x in res["trees"][large]["fanouts"])
    long_chain = max(res["trees"][large]["chains"])
    sp = res["trees"][large]["system_prompt_children"]
    rows = [
        ("noop", "a key bound to nothing (`z`): the method's own floor"),
        ("down", f"cursor down (x{cfg.down_presses}, one press each; the detail pane follows)"),
        ("expand_system", f"expand a system prompt ({min(sp)}-{max(sp)} children; loads its first page of 100)"),
        ("collapse_system", "collapse it"),
        ("expand_fanout_1000", "expand the 1k-children node (first page of 100)"),
        (f"expand_fanout_{big_fan}", f"expand the {big_fan // 1000}k-children node (first page of 100)"),
        ("more_1000", "next page of 100 (\"more\" row) under the 1k-children node"),
        (f"more_{big_fan}", f"next page of 100 (\"more\" row) under the {big_fan // 1000}k-children node"),
        ("order_V", "toggle sort order (`o`), view V"),
        ("order_V+", f"toggle sort order (`o`), view V+ (the {big_fan // 1000}k-children node open)"),
        ("fold_chain_1000", "fold (`x`) the 1k-deep chain into one row"),
        ("unfold_chain_1000", "unfold it (`x`)"),
        (f"fold_chain_{long_chain}", f"fold (`x`) the {long_chain // 1000}k-deep chain (walks it)"),
        (f"unfold_chain_{long_chain}", "unfold it (`x`)"),
    ]
    lines += [
        "",
        "### Key press to screen (medians, ms; p90 in brackets). Pilot: `pilot.press` -> widgets reflect it, "
        "workers idle, `pilot.pause()` returned. Direct: the same key event -> reflected, idle, one screen update "
        "(1 ms checks, none of Pilot's idle-detection sleeps)",
        "",
        f"| key press | {small}: Pilot | {small}: direct | {large}: Pilot | {large}: direct | "
        f"{large}/{small} (direct) | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    cell = lambda x: "-" if x is None else f"{fmt_ms(x['median'])} ({fmt_ms(x['p90'])})"  # noqa: E731
    for key, label in rows:
        ap, ad = k[small]["pilot"].get(key), k[small]["direct"].get(key)
        bp, bd = k[large]["pilot"].get(key), k[large]["direct"].get(key)
        if bd is None:
            continue
        ratio = f"{bd['median'] / ad['median']:.2f}x" if ad else "-"
        lines.append(f"| {label} | {cell(ap)} | {cell(ad)} | {cell(bp)} | {cell(bd)} | {ratio} | {bd['n']} |")

    fr = res["frame"]
    lines += [
        "",
        f"### Frame work per refresh: one poll's `collect()` + `apply_snapshot()` + `render_line` of every "
        f"visible line (median of {cfg.frame_repeats * cfg.frame_blocks}; ms)",
        "",
        f"| poll | view | {small}: collect | apply | render | **total** | {large}: collect | apply | render | "
        f"**total** | {large}/{small} | goal | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for mode, what in (("idle", "tree unchanged"), ("changed", "after a tree change")):
        for vname in ("V", "V+"):
            b = fr[large].get(f"{vname}/{mode}")
            if b is None:
                continue
            a = fr[small][f"V/{mode}"]
            ratio = b["total"]["median"] / a["total"]["median"]
            goal = vname == "V"
            vlabel = f"V ({b['rows']} rows)" if vname == "V" else f"V+ at {large} vs V at {small}"
            lines.append(
                f"| {what} | {vlabel} | {fmt_ms(a['collect']['median'])} | {fmt_ms(a['apply']['median'])} | "
                f"{fmt_ms(a['render']['median'])} | **{fmt_ms(a['total']['median'])}** | "
                f"{fmt_ms(b['collect']['median'])} | {fmt_ms(b['apply']['median'])} | "
                f"{fmt_ms(b['render']['median'])} | **{fmt_ms(b['total']['median'])}** | {ratio:.2f}x | "
                f"{f'<= {GOAL_FRAME_RATIO}x' if goal else '-'} | "
                f"{verdict(ratio <= GOAL_FRAME_RATIO) if goal else '-'} |")
    g = res["gc"]["frame"]
    lines += [
        "",
        f"Cyclic GC while the frame work was measured (both trees): {g['collections']:,} collections "
        f"({g['gen2']} of generation 2), {g['total_ms']:,.0f} ms in all, the longest {g['max_ms']:.0f} ms.",
    ]
    lines += [
        "",
        "Where a poll's `collect()` goes (median ms per poll; `children` sums every page reloaded; "
        "attribution runs inside `sessions`/`node`; engine hold is the time the reads held the owner thread):",
        "",
        "| poll | tree / view | stats | changes | children | sessions | of which attribution | node | other "
        "(flatten, copies) | engine hold | reads after apply (calls) | Textual screen updates after it (context) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in ("idle", "changed"):
        for label, vname in ((small, "V"), (large, "V"), (large, "V+")):
            r = fr[label].get(f"{vname}/{mode}")
            if r is None:
                continue
            m = lambda x: fmt_ms(r[x]["median"])  # noqa: E731
            lines.append(f"| {mode} | {label} / {vname} | {m('call_stats')} | {m('call_changes')} | "
                         f"{m('call_children')} | {m('call_sessions')} | {m('call_attribute')} | {m('call_node')} | "
                         f"{m('call_other')} | {m('hold')} | {m('after')} ({median(r['after_calls']):.0f}) | "
                         f"{m('screen')} |")
    lines += ["", throughput_table(cfg, res["throughput"])]
    return "\n".join(lines)


def alternating_table(cfg: BenchConfig, alt: dict[str, Any]) -> str:
    ws = alt["windows"]
    pct = lambda xs: ", ".join(f"{x:.1%}" for x in xs)  # noqa: E731
    return "\n".join([
        f"### Engine throughput with the dashboard attached and stopped in turn ({cfg.interval:g} s refresh): "
        f"one engine, demo workload flat out on a {fmt_nodes(alt['tree_nodes_before'])}-node cache "
        f"({fmt_nodes(alt['tree_nodes_after'])} at the end), "
        f"{len(ws)} windows of {cfg.alt_window_s:g} s in blocks of (without, with, with, without)",
        "",
        "| measure | value | goal | met |",
        "|---|---:|---|---|",
        f"| **with / without** (mean over the {len(alt['block_ratios'])} blocks) | "
        f"**{alt['ratio_mean']:.1%}** | >= {GOAL_THROUGHPUT_SHARE:.0%} | "
        f"{verdict(alt['ratio_mean'] >= GOAL_THROUGHPUT_SHARE)} |",
        f"| 90% interval of that mean (bootstrap over the blocks) | "
        f"{alt['ratio_mean_ci90'][0]:.1%} .. {alt['ratio_mean_ci90'][1]:.1%} | - | - |",
        f"| that mean less the bound on the generation-2 cost left out "
        f"({alt['gen2_left_out_share']:.2%}: collections {alt['collections_per_s']['without']:.1f} / "
        f"{alt['collections_per_s']['with']:.1f} per s without / with, full passes between blocks "
        f"{alt['collect_between_ms_per_s']:.0f} ms per s of window) | "
        f"{alt['ratio_mean_less_left_out']:.1%} | >= {GOAL_THROUGHPUT_SHARE:.0%} | "
        f"{verdict(alt['ratio_mean_less_left_out'] >= GOAL_THROUGHPUT_SHARE)} |",
        f"| with / without, median of the blocks | {alt['ratio_block_median']:.1%} | - | - |",
        f"| with / without, median of the {len(alt['pair_ratios'])} adjacent pairs "
        f"(90% interval {alt['ratio_median_ci90'][0]:.1%} .. {alt['ratio_median_ci90'][1]:.1%}) | "
        f"{alt['ratio_median']:.1%} | - | - |",
        f"| with / without (all windows: requests / seconds) | {alt['ratio_total']:.1%} | - | - |",
        f"| requests/s without / with | {alt['without_requests_per_s']:,.0f} / {alt['with_requests_per_s']:,.0f} | - | - |",
        f"| prompt tokens/s, with / without (all windows) | {alt['ratio_tokens']:.1%} | - | - |",
        f"| engine thread time left for requests, with / without (its CPU less the dashboard's reads "
        f"and attribution slices: {alt['engine_ms_for_requests_per_s']['without']:.0f} / "
        f"{alt['engine_ms_for_requests_per_s']['with']:.0f} ms per s) | "
        f"{alt['ratio_engine_time_for_requests']:.1%} | - | - |",
        f"| engine hold by the dashboard's reads (ms per s, windows with it; most in one window) | "
        f"{alt['hold_ms_per_s_with']:.1f}; {max(w['hold_ms'] for w in ws):,.0f} ms | - | - |",
        f"| attribution in slices between the engine's steps (ms per s) without / with; most in one "
        f"window; attributions made (in slices) | {alt['slices_ms_per_s']['without']:.1f} / "
        f"{alt['slices_ms_per_s']['with']:.1f}; {alt['slices_ms_most_in_a_window']:,.0f} ms; "
        f"{alt['attributions']['made']} ({alt['attributions']['in_slices']}) | - | - |",
        f"| admin API event-loop thread CPU (ms per s) without / with | "
        f"{alt['api_cpu_ms_per_s']['without']:.1f} / {alt['api_cpu_ms_per_s']['with']:.1f} | - | - |",
        f"| engine thread CPU (ms per s) without / with | "
        f"{alt['engine_cpu_ms_per_s']['without']:.0f} / {alt['engine_cpu_ms_per_s']['with']:.0f} | - | - |",
        f"| dashboard process CPU (ms per s, windows with it) | {alt['dashboard_cpu_ms_per_s']:.0f} | - | - |",
        f"| GC pauses in the engine's process within the windows (ms per s) without / with | "
        f"{alt['gc_ms_per_s']['without']:.0f} / {alt['gc_ms_per_s']['with']:.0f} | - | - |",
        f"| dashboard polls (all windows with it) | {alt['polls']} | - | - |",
        "",
        f"Per block: {pct(alt['block_ratios'])}.",
        "",
        f"Per pair: {pct(alt['pair_ratios'])}.",
    ])


def throughput_table(cfg: BenchConfig, tp: dict[str, Any]) -> str:
    by_mode = {m: [r for r in tp["runs"] if r["mode"] == m] for m in MODES}
    med = lambda rs, key: median([r[key] for r in rs])  # noqa: E731
    gc_rate = lambda rs: median([r["gc"]["total_ms"] / r["window_s"] for r in rs])  # noqa: E731
    per_run = lambda rs: ", ".join(f"{r['requests_per_s']:,.0f}" for r in rs)  # noqa: E731
    label = {"without": "without", "process": "**dashboard in its own process** (what `radixtop` runs)",
             "inprocess": "dashboard in the engine's process (reference)"}
    lines = [
        f"### Engine throughput with a dashboard attached ({cfg.interval:g} s refresh) and without: demo workload "
        f"flat out on a ~{fmt_nodes(tp['runs'][0]['tree_nodes'])}-node cache, {cfg.tp_window_s:.0f} s windows, "
        f"{cfg.tp_pairs} rounds of the three runs (order rotating)",
        "",
        "| run | requests/s (median) | per run | engine thread CPU (s/s) | process CPU (s/s) | GC pauses (ms/s) | "
        "polls | engine hold per poll (ms) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        rs = by_mode[mode]
        if not rs:
            continue
        polls = f"{med(rs, 'polls'):.0f}" if mode != "without" else "-"
        hold = f"{med(rs, 'engine_hold_ms_per_poll'):.1f}" if mode != "without" else "-"
        lines.append(f"| {label[mode]} | {med(rs, 'requests_per_s'):,.0f} | {per_run(rs)} | "
                     f"{med(rs, 'engine_cpu_per_s'):.2f} | {med(rs, 'process_cpu_per_s'):.2f} | "
                     f"{gc_rate(rs):.0f} | {polls} | {hold} |")
    lines += [
        "",
        "| measure | value | per round | goal | met |",
        "|---|---:|---|---|---|",
        f"| **with / without**, dashboard in its own process (median of the per-round ratios) | "
        f"**{tp['ratio']:.1%}** | {', '.join(f'{x:.1%}' for x in tp['ratio_per_pair'])} | "
        f">= {GOAL_THROUGHPUT_SHARE:.0%} | {verdict(tp['ratio'] >= GOAL_THROUGHPUT_SHARE)} |",
        f"| with / without, dashboard in the engine's process (reference) | {tp['inprocess_ratio']:.1%} | "
        f"{', '.join(f'{x:.1%}' for x in tp['inprocess_ratio_per_pair'])} | - | - |",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import rich
    import textual
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "textual": textual.__version__,
        "rich": getattr(rich, "__version__", "?"),
        "terminal": f"{SIZE[0]}x{SIZE[1]} (app.run_test, headless)",
        "gc": "trees built with GC disabled, then collected and frozen; GC enabled while measuring",
        "timer": "time.perf_counter",
        "threads": "app (main thread, asyncio), its thread workers, engine owner thread: one process, one GIL",
    }


class _SkipTreeSections(Exception):
    """--only-throughput: sections 1-4 are left out."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k and 100k nodes, fewer repeats (< 90 s)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "dashboard.json", help="JSON results path")
    ap.add_argument("--skip-throughput", action="store_true", help="leave out section 5")
    ap.add_argument("--only-throughput", action="store_true", help="run section 5 alone")
    ap.add_argument("--only-alternating", action="store_true",
                    help="run only section 5's one-engine measurement (dashboard stopped and continued in turn)")
    ap.add_argument("--pairs", type=int, default=None, help="(without, with) pairs in the alternating run")
    args = ap.parse_args(argv)
    cfg = quick_config() if args.quick else full_config()
    if args.pairs is not None:
        cfg = replace(cfg, alt_pairs=args.pairs)

    t_all = pc()
    import logging

    logging.getLogger("gpu_backend.engine").setLevel(logging.ERROR)
    results: dict[str, Any] = {"mode": cfg.mode, "config": asdict(cfg), "environment": environment(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "goals": {"first_paint_s": GOAL_FIRST_PAINT_S, "frame_ratio": GOAL_FRAME_RATIO,
                                         "throughput_share": GOAL_THROUGHPUT_SHARE, "instant_ms": INSTANT_MS}}
    trees = []
    for tc in () if args.only_throughput or args.only_alternating else (cfg.small, cfg.large):
        log(f"mode {cfg.mode}: building the {tc.label} tree")
        b = build_tree(tc)
        start_engine(b)
        trees.append(b)
        log(f"  {b.facts['nodes']:,} nodes in {b.build_s:.1f} s (RSS {rss_mib():.0f} MiB)")
    results["trees"] = {b.label: b.facts for b in trees}
    try:
        if args.only_throughput or args.only_alternating:
            raise _SkipTreeSections
        log(f"first paint: {cfg.paint_repeats} starts per tree")
        results["gc"] = {}
        mark = GC.mark()
        results["first_paint"] = measure_first_paint(cfg, trees)
        results["gc"]["first_paint"], mark = GC.since(mark), GC.mark()
        log("key presses")
        results["keys"] = measure_keys(cfg, trees)
        results["gc"]["keys"], mark = GC.since(mark), GC.mark()
        log("frame work per refresh")
        results["frame"] = measure_frame(cfg, trees)
        results["gc"]["frame"] = GC.since(mark)
    except _SkipTreeSections:
        pass
    finally:
        for b in trees:
            release(b)
        trees.clear()
    if not args.skip_throughput:
        log(f"throughput, one engine: {cfg.alt_pairs} pairs of {cfg.alt_window_s:g} s windows, "
            f"the dashboard stopped and continued in turn")
        results["alternating"] = alternating_run(cfg)
        alt = results["alternating"]
        log(f"  with / without: {alt['ratio_mean']:.1%} (mean of blocks; 90% interval "
            f"{alt['ratio_mean_ci90'][0]:.1%} .. {alt['ratio_mean_ci90'][1]:.1%})")
    if not args.skip_throughput and not args.only_alternating:
        log(f"throughput: {cfg.tp_pairs} rounds of {cfg.tp_window_s:.0f} s runs")
        results["throughput"] = measure_throughput(cfg)
    results["wall_s"] = pc() - t_all
    table = (report(cfg, results) if "throughput" in results and "frame" in results
             else throughput_table(cfg, results["throughput"]) if "throughput" in results
             else "(throughput skipped: no report)" if "alternating" not in results else "")
    if "alternating" in results:
        table = alternating_table(cfg, results["alternating"]) + ("\n\n" + table if table else "")
    results["table_markdown"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
        fh.write("\n")
    print(table)
    print()
    print(f"_{cfg.mode} run, {results['wall_s']:.0f} s wall (tree builds included); JSON: {args.out}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
