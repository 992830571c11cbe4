"""Helpers shared by the benchmarks: progress lines, statistics and formats, results files, the
instrumentation (engine-thread holds, a timed adapter), and the one builder of the large synthetic
trees that ``bench_api`` and ``bench_dashboard`` measure on."""

from __future__ import annotations

import gc
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter as pc
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------
# progress, statistics, formats
# ----------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ms_stats(secs: list[float], pct: int = 95) -> dict[str, Any] | None:
    """Milliseconds: median, the ``pct`` percentile (nearest rank; key ``p<pct>``), min, max, and
    every sample."""
    if not secs:
        return None
    ms = sorted(x * 1e3 for x in secs)
    p = ms[min(len(ms) - 1, max(0, -(-pct * len(ms) // 100) - 1))]
    return {"median": statistics.median(ms), f"p{pct}": p, "min": ms[0], "max": ms[-1], "n": len(ms),
            "samples": [x * 1e3 for x in secs]}


def fmt_nodes(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e3 else str(n)


def fmt_ms(x: float | None, missing: str = "-", sep: str = ",") -> str:
    """Milliseconds for a table: whole from 100 (``sep`` groups thousands), else 1 or 2 decimals."""
    if x is None:
        return missing
    return f"{x:{sep}.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "NO")


def rss_bytes(pid: int | str = "self") -> int:
    """A process's resident set (this one's by default)."""
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_mib(pid: int | str = "self") -> float:
    return rss_bytes(pid) / 2**20


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------


def environment(**extra: Any) -> dict[str, Any]:
    """The machine and interpreter, then what the benchmark adds (its libraries, how it times)."""
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "numpy": np.__version__, **extra}


def finish(out: Path, results: dict[str, Any], table: str, note: str) -> None:
    """Write ``results`` (with ``table`` as ``table_markdown``) as JSON to ``out``, then print the
    tables and a closing ``note``."""
    results["table_markdown"] = table
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)
        fh.write("\n")
    print(table)
    print()
    print(note)


# ----------------------------------------------------------------------------------------------
# instrumentation (wraps, never edits, the code under test)
# ----------------------------------------------------------------------------------------------


class EngineHolds:
    """Times each command on the engine's owner thread: how long a read holds the cache."""

    def __init__(self, engine):
        self.holds: list[float] = []
        call = engine.call

        def timed_call(fn, timeout: float = 10.0):
            def run(s):
                t0 = pc()
                try:
                    return fn(s)
                finally:
                    self.holds.append(pc() - t0)

            return call(run, timeout)

        engine.call = timed_call  # instance attribute: shadows Engine.call for this engine only

    def mark(self) -> int:
        return len(self.holds)

    def since(self, mark: int) -> float:
        return sum(self.holds[mark:])


def timed_adapter(engine, reads: tuple[str, ...] = (), **kwargs):
    """A BundledAdapter that logs the owner-thread work of each sessions read (its pass's steps
    added up: since issue 25 the figures are kept with the tree, so that is the page's cost, as
    ``(True, seconds)``; before, it was the attribution's) in ``attribute_log``, and (method,
    seconds) of each read named in ``reads`` in ``calls``."""
    from radixtop.adapters.bundled.adapter import BundledAdapter

    class TimedAdapter(BundledAdapter):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.calls: list[tuple[str, float]] = []
            self.attribute_log: list[tuple[bool, float]] = []

        def _sessions_pass(self, *args, **kw):
            work = super()._sessions_pass(*args, **kw)
            spent = 0.0
            while True:
                t0 = pc()
                try:
                    next(work)
                except StopIteration as done:
                    spent += pc() - t0
                    self.attribute_log.append((True, spent))
                    return done.value
                spent += pc() - t0
                yield

    def wrap(name):
        def method(self, *args, **kw):
            t0 = pc()
            try:
                return getattr(BundledAdapter, name)(self, *args, **kw)
            finally:
                self.calls.append((name, pc() - t0))

        method.__name__ = name
        return method

    for name in reads:
        setattr(TimedAdapter, name, wrap(name))
    return TimedAdapter(engine, **kwargs)


# ----------------------------------------------------------------------------------------------
# the trees
# ----------------------------------------------------------------------------------------------

# Shapes of the sessionless forest's groups: a full tree of (branching, depth) under one prefix
# node, and the weight with which it is drawn. These: small agentic/tool-call trees, equally often.
SMALL_GROUPS = ((2, 6, 1), (3, 4, 1), (4, 3, 1), (5, 3, 1), (6, 3, 1), (8, 2, 1), (16, 2, 1))


@dataclass(frozen=True)
class TreeConfig:
    label: str = "10k"
    target_nodes: int = 10_000  # the forest grows the tree until it has at least this many nodes
    sessions: int = 3_000  # sessions made, the closed ones among them
    system_prompts: int = 4
    system_prompt_len: tuple[int, int] = (256, 512)
    turns: tuple[int, int] = (1, 3)
    user_len: tuple[int, int] = (8, 64)
    output_len: tuple[int, int] = (8, 64)
    regenerate_share: float = 0.05
    closed_sessions: int = 100  # closed after the trace (tombstoned; listed as closed)
    running_requests: int = 16  # begun, not finished: they lock their paths
    fanouts: tuple[int, ...] = (1_000,)  # children of each few-shot prompt (sessionless)
    fanout_prompt_len: int = 1024
    fanout_tail: tuple[int, int] = (4, 16)
    chains: tuple[int, ...] = (1_000,)  # depths of runs of single children under the root
    chain_node_tokens: int = 4
    group_shapes: tuple[tuple[int, int, float], ...] = SMALL_GROUPS  # (branching, depth, weight)
    segment_len: tuple[int, int] = (2, 8)  # tokens per node of the forest
    group_prefix_len: tuple[int, int] = (16, 64)
    extra_capacity: int = 0  # free slots on top of what the tree needs (room for a workload)
    token_pool: int = 1 << 20  # token ids drawn up front and handed out in turn
    vocab: int = 128_256  # llama-3
    seed: int = 11
    ledger: bool = True  # keep every session's figures with the tree (False: the baseline without)


class TokenPool:
    """Random token ids from a pre-drawn pool (fast and reproducible)."""

    def __init__(self, rng: np.random.Generator, vocab: int, size: int):
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
    system_prompts: list[tuple[int, ...]]  # fully cached: a request on one changes the version only
    fanout_ids: dict[int, int]  # children -> node id
    chain_ids: dict[int, int]  # depth -> id of the chain's top node (a root child)
    engine: Any = None
    holds: EngineHolds | None = None


def build_tree(cfg: TreeConfig, with_facts: bool = True) -> Built:
    """A tree of about ``cfg.target_nodes`` nodes on a ``Scheduler`` over a ``meta`` KV pool with the
    llama-3-8b geometry (shapes, no memory), in this order:

    1. ``system_prompts`` shared prompts and ``sessions`` multi-turn chats on them, each turn a
       ``scheduler.request`` with its session id (so each turn tags its conversation's leaf), a few
       regenerated answers (a split), ``closed_sessions`` closed afterwards. Identical in every tree
       built from the same seed (the same node ids).
    2. a few-shot prompt per entry of ``fanouts``, with that many sessionless continuations.
    3. a run of single children under the root per entry of ``chains``, that many nodes deep.
    4. a sessionless forest of small full trees (``group_shapes``) under distinct root children
       until the tree has ``target_nodes`` nodes, inserted with slots from the pool's allocator as
       ``cache_finished_req`` would insert them (duplicate prefixes never allocated).
    5. ``running_requests``: the next turn of some open sessions, begun and not finished.

    GC is off while building; the tree is then collected and frozen. ``with_facts`` adds the counts
    that need a walk of the tree."""
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
    s = Scheduler(geometry, capacity, device="meta", ledger=cfg.ledger)
    cache, allocator = s.cache, s.pool.allocator
    prng = random.Random(cfg.seed)
    tokens = TokenPool(np.random.default_rng(cfg.seed), cfg.vocab, cfg.token_pool)
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
        requests = regenerated = 0
        active = list(history)
        while active:
            still = []
            for sid in active:
                if sid in last_input and prng.random() < cfg.regenerate_share:
                    inp = last_input[sid]
                    regenerated += 1
                else:
                    inp = history[sid] + tokens.take(prng.randint(*cfg.user_len))
                    turns_left[sid] -= 1
                out = tokens.take(prng.randint(*cfg.output_len))
                s.request(f"r{next(rid)}", inp, out, sid)
                requests += 1
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
        shapes = [(b, d) for b, d, _ in cfg.group_shapes]
        weights = [w for _, _, w in cfg.group_shapes]
        groups = 0
        while cache.node_count() < cfg.target_nodes - cfg.running_requests:
            b, d = grng.choices(shapes, weights)[0]
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
                             "session_nodes": session_nodes, "session_requests": requests,
                             "regenerated": regenerated, "forest_groups": groups}
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
            "version": cache.version,
        })
    return Built(cfg.label, s, build_s, facts, system_ids, systems, fanout_ids, chain_ids)


def _insert_group(cache, allocator, prng: random.Random, tokens: TokenPool, first: int,
                  b: int, d: int, cfg: TreeConfig) -> None:
    """A full tree of branching ``b`` and depth ``d`` under one prefix, leaf paths in DFS order.
    Each insert allocates slots only for the tokens past the previous path's divergence."""
    prefix = tuple([first] + tokens.take(prng.randint(*cfg.group_prefix_len) - 1))
    segments: dict[tuple[int, ...], tuple[int, ...]] = {}
    lo, hi = cfg.segment_len
    upto = [prefix]  # upto[level] = key through that level
    prev: tuple[int, ...] | None = None
    for path in itertools.product(range(b), repeat=d):
        div = 0 if prev is None else next(i for i in range(d) if path[i] != prev[i])
        del upto[div + 1 :]
        for level in range(div, d):
            node_path = path[: level + 1]
            seg = segments.get(node_path)
            if seg is None:
                # siblings differ in their first token (children are keyed by it)
                seg = segments[node_path] = (path[level],) + tuple(tokens.take(prng.randint(lo, hi) - 1))
            upto.append(upto[-1] + seg)
        key = upto[-1]
        off = 0 if prev is None else len(upto[div])
        value = np.zeros(len(key), dtype=np.int64)
        value[off:] = allocator.alloc(len(key) - off)
        r = cache.insert(key, value)
        assert r.prefix_len == off, (r.prefix_len, off)
        prev = path


def start_engine(built: Built, workload=None, **kwargs) -> Any:
    """``Engine(built.scheduler, workload, **kwargs).start()`` with its holds timed; kept on ``built``."""
    from radixtop.gpu_backend.engine import Engine

    built.engine = Engine(built.scheduler, workload, **kwargs).start()
    built.holds = EngineHolds(built.engine)
    return built.engine


def release(built: Built) -> None:
    """Stop the tree's engine and give its memory back (the tree was frozen: unfreeze first)."""
    if built.engine is not None:
        built.engine.stop()
    built.engine = built.scheduler = built.holds = None
    gc.unfreeze()
    gc.collect()


def change_tree(engine, prompt: tuple[int, ...], counter=itertools.count()) -> None:
    """A sessionless request for a fully cached prompt (a system prompt): it locks and unlocks its
    path, so the cache's version moves (a live engine's every step; attribution is stale) while
    the tree keeps its shape."""
    engine.call(lambda s: s.request(f"touch{next(counter)}", list(prompt), [], None), 30.0)


def stepped(work) -> tuple[tuple[float, Any], float]:
    """A pass run to its end, each step timed: ((its work in seconds, its result), the longest step)."""
    total, longest = 0.0, 0.0
    while True:
        t0 = time.perf_counter()
        try:
            next(work)
        except StopIteration as done:
            took = time.perf_counter() - t0
            return (total + took, done.value), max(longest, took)
        took = time.perf_counter() - t0
        total += took
        longest = max(longest, took)
