"""radixtop's RadixCache against SGLang 0.5.16's, on the same workloads, side by side in one process.

Run from the repository root:

    .venv/bin/python benchmarks/bench_cache.py            # full run (a few minutes)
    .venv/bin/python benchmarks/bench_cache.py --quick    # CI smoke run (< 60 s)

Prints Markdown tables and writes every raw number to ``benchmarks/results/cache.json``.
See ``benchmarks/README.md`` for what each column means.

Sections:

1. ``throughput``: a multi-turn chat trace (a few shared system prompts, many sessions whose turns
   extend their conversation, a few regenerated answers). For each request both caches get
   ``match_prefix(input)``, ``inc_lock_ref``, ``insert(input + output)`` with real slots from their
   own allocator, the duplicate slots freed, the session tagged, ``dec_lock_ref``. Only the cache
   calls are timed (each call between two ``perf_counter`` reads). Then half the sessions are closed
   (``release_radix_session``) and ``evict(N)`` is called in a loop on what is left.
2. ``scaling``: the cost of one close (a session of 8 tagged nodes, 2048 tokens) and of one
   ``evict(2048)`` on a tree of ~10k nodes and on a tree of ~1M nodes.

Fairness rules (both sides alike):

* The two caches are driven request by request in one loop (which one goes first alternates), so
  a noisy neighbour slows both; ratios are paired per chunk/per repeat and medians are reported.
* The cyclic GC is disabled during every timed phase (objects built before it are frozen), for both.
* Each side gets its own native input: radixtop a ``list[int]`` (what its ``Req`` holds; the cache
  turns it into a tuple inside the call, which is timed); SGLang an ``array('q')`` wrapped in
  ``RadixKey``/``MatchPrefixParams``/``InsertParams`` built *outside* the timed span (conservative
  for radixtop). Token ids are fresh ``int`` objects per request, as a tokenizer would give.
* SGLang's allocator frees by ``torch.cat`` onto its free list, which costs O(free list). After each
  close / evict the freed slots are allocated again (untimed, both sides), as the scheduler's next
  allocation would, so the free list stays short and that cost stays O(freed).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import types
import warnings
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import environment, finish, fmt_nodes, log, median, rss_mib, verdict  # noqa: E402

from radixtop.gpu_backend.allocator import TokenToKVPoolAllocator as RtAllocator  # noqa: E402
from radixtop.gpu_backend.radix_cache import RadixCache as RtCache  # noqa: E402

pc = time.perf_counter


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceConfig:
    requests: int = 100_000
    system_prompts: int = 4
    system_prompt_len: tuple[int, int] = (256, 512)
    user_len: tuple[int, int] = (8, 192)
    output_len: tuple[int, int] = (8, 256)
    turns: tuple[int, int] = (1, 12)
    active_sessions: int = 256
    regenerate_share: float = 0.05
    vocab: int = 32_000
    seed: int = 1234


@dataclass(frozen=True)
class BenchConfig:
    mode: str
    trace: TraceConfig
    repeats: int  # whole throughput runs (fresh caches each)
    chunk: int  # requests per paired chunk
    close_share: float  # share of sessions closed in the close phase
    evict_tokens: int  # N of each evict(N) call in the throughput section
    evict_calls: int  # at most this many evict calls per repeat
    scale_small: int  # nodes of the small tree (scaling)
    scale_large: int  # nodes of the large tree (scaling)
    scale_reps: int  # closes and evicts measured per tree (radixtop)
    sgl_scale_reps_small: int
    sgl_scale_reps_large_close: int
    sgl_scale_reps_large_evict: int
    sgl_large_budget_s: float  # give up SGLang's large tree when its build takes longer
    session_turns: int = 8  # tagged nodes per measured session (scaling)
    turn_tokens: int = 256  # tokens per tagged node (8 x 256 = 2048)


def full_config() -> BenchConfig:
    return BenchConfig(
        mode="full",
        trace=TraceConfig(requests=100_000),
        repeats=3,
        chunk=5_000,
        close_share=0.5,
        evict_tokens=2048,
        evict_calls=1500,
        scale_small=10_000,
        scale_large=1_000_000,
        scale_reps=40,
        sgl_scale_reps_small=20,
        sgl_scale_reps_large_close=20,
        sgl_scale_reps_large_evict=4,
        sgl_large_budget_s=60.0,
    )


def quick_config() -> BenchConfig:
    return BenchConfig(
        mode="quick",
        trace=TraceConfig(requests=3_000, active_sessions=64),
        repeats=1,
        chunk=500,
        close_share=0.5,
        evict_tokens=2048,
        evict_calls=150,
        scale_small=2_000,
        scale_large=50_000,
        scale_reps=15,
        sgl_scale_reps_small=8,
        sgl_scale_reps_large_close=8,
        sgl_scale_reps_large_evict=3,
        sgl_large_budget_s=15.0,
    )


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


class GCPaused:
    """Collect, freeze what exists, and disable the cyclic GC for a timed phase (both sides alike)."""

    def __enter__(self):
        self.was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        return self

    def __exit__(self, *exc):
        gc.unfreeze()
        if self.was_enabled:
            gc.enable()
        return False


def call_stats(secs: list[float]) -> dict[str, float] | None:
    """Per-call microseconds: first call, median, p90, p99, max (spikes show up here)."""
    if not secs:
        return None
    us = sorted(x * 1e6 for x in secs)
    pick = lambda q: us[min(len(us) - 1, int(q * len(us)))]  # noqa: E731
    return {"first": secs[0] * 1e6, "median": statistics.median(us), "p90": pick(0.9), "p99": pick(0.99), "max": us[-1]}


def tokens_array(rng: np.random.Generator, vocab: int, n: int) -> array:
    out = array("q")
    out.frombytes(rng.integers(0, vocab, n, dtype=np.int64).tobytes())
    return out


# ----------------------------------------------------------------------------------------------
# the chat trace
# ----------------------------------------------------------------------------------------------

FIRST, TURN, REGEN = 0, 1, 2


def plan_trace(cfg: TraceConfig) -> tuple[list[tuple[int, int, int, int]], list[int], list[int], int]:
    """Lengths only: (session, kind, user_len, out_len) per request, each session's system prompt,
    each system prompt's length, and an upper bound on the distinct tokens the trace caches."""
    rng = random.Random(cfg.seed)
    sys_lens = [rng.randint(*cfg.system_prompt_len) for _ in range(cfg.system_prompts)]
    session_sys: list[int] = []
    turns_left: list[int] = []
    active: list[int] = []

    def open_session() -> int:
        sid = len(session_sys)
        session_sys.append(rng.randrange(cfg.system_prompts))
        turns_left.append(rng.randint(*cfg.turns))
        return sid

    for _ in range(cfg.active_sessions):
        active.append(open_session())
    started: set[int] = set()
    seen_sys: set[int] = set()
    plan = []
    bound = 0
    for _ in range(cfg.requests):
        slot = rng.randrange(len(active))
        sid = active[slot]
        out_len = rng.randint(*cfg.output_len)
        if sid not in started:
            kind, user_len = FIRST, rng.randint(*cfg.user_len)
            started.add(sid)
            if session_sys[sid] not in seen_sys:
                seen_sys.add(session_sys[sid])
                bound += sys_lens[session_sys[sid]]
            bound += user_len + out_len
        elif rng.random() < cfg.regenerate_share:
            kind, user_len = REGEN, 0
            bound += out_len
        else:
            kind, user_len = TURN, rng.randint(*cfg.user_len)
            bound += user_len + out_len
        plan.append((sid, kind, user_len, out_len))
        if kind != REGEN:
            turns_left[sid] -= 1
            if turns_left[sid] <= 0:
                active[slot] = open_session()
    return plan, session_sys, sys_lens, bound


class TraceTokens:
    """Token contents for a plan, generated request by request from a seed (identical every run)."""

    def __init__(self, cfg: TraceConfig, session_sys: list[int], sys_lens: list[int]):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed + 1)
        self.system = [tokens_array(self.rng, cfg.vocab, n) for n in sys_lens]
        self.session_sys = session_sys
        self.history: dict[int, array] = {}
        self.last_input: dict[int, array] = {}

    def next(self, sid: int, kind: int, user_len: int, out_len: int) -> tuple[array, array]:
        """(input, input + output) as arrays; the session's history becomes input + output."""
        rng, vocab = self.rng, self.cfg.vocab
        if kind == FIRST:
            inp = self.system[self.session_sys[sid]] + tokens_array(rng, vocab, user_len)
        elif kind == TURN:
            inp = self.history[sid] + tokens_array(rng, vocab, user_len)
        else:
            inp = self.last_input[sid]
        full = inp + tokens_array(rng, vocab, out_len)
        self.last_input[sid] = inp
        self.history[sid] = full
        return inp, full


# ----------------------------------------------------------------------------------------------
# the two sides
# ----------------------------------------------------------------------------------------------


class RtSide:
    name = "radixtop"

    def __init__(self, capacity: int):
        self.alloc = RtAllocator(capacity, page_size=1)
        self.cache = RtCache(self.alloc, page_size=1)

    def request(self, inp: list[int], full: list[int], sid: str) -> tuple[float, float, float, int]:
        cache, alloc = self.cache, self.alloc
        t0 = pc()
        m = cache.match_prefix(inp)
        t1 = pc()
        cache.inc_lock_ref(m.last_node)
        t2 = pc()
        plen = m.prefix_len
        own = alloc.alloc(len(full) - plen)
        slots = np.concatenate((m.device_indices, own)) if plen else own
        t3 = pc()
        r = cache.insert(full, slots)
        t4 = pc()
        if r.prefix_len > plen:
            alloc.free(slots[plen : r.prefix_len])
        cache._tag_session_leaf(sid, r.last_node)
        t5 = pc()
        cache.dec_lock_ref(m.last_node)
        t6 = pc()
        return t1 - t0, t4 - t3, (t2 - t1) + (t6 - t5), plen

    def close(self, sid: str) -> tuple[float, int, int]:
        t0 = pc()
        res = self.cache.release_radix_session(sid)
        t1 = pc()
        return t1 - t0, res.freed_nodes, res.freed_tokens

    def evict(self, n: int) -> tuple[float, int]:
        t0 = pc()
        res = self.cache.evict(n)
        t1 = pc()
        return t1 - t0, res.num_tokens_evicted

    def take_free(self) -> None:
        """Allocate every free slot (untimed): the next requests' allocation after a free."""
        n = self.alloc.available_size()
        if n:
            self.alloc.alloc(n)

    def sizes(self) -> tuple[int, int]:
        return self.cache.total_size(), self.cache.node_count()


class SglSide:
    name = "SGLang"

    def __init__(self, sgl: types.SimpleNamespace, capacity: int):
        import torch

        self.torch = torch
        self.sgl = sgl
        self.alloc = sgl.TokenToKVPoolAllocator(
            size=capacity, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
        )
        self.cache = sgl.RadixCache(
            sgl.CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.alloc,
                page_size=1,
                eviction_policy="lru",
                enable_session_radix_cache=True,
            )
        )
        self.reqs: dict[str, types.SimpleNamespace] = {}

    def request(self, inp: array, full: array, sid: str) -> tuple[float, float, float, int]:
        sgl, cache, alloc = self.sgl, self.cache, self.alloc
        req = self.reqs.get(sid)
        if req is None:
            req = self.reqs[sid] = types.SimpleNamespace(session_id=sid)
        mparams = sgl.MatchPrefixParams(key=sgl.RadixKey(inp))
        full_key = sgl.RadixKey(full)
        t0 = pc()
        m = cache.match_prefix(mparams)
        t1 = pc()
        cache.inc_lock_ref(m.last_device_node)
        t2 = pc()
        plen = len(m.device_indices)
        own = alloc.alloc(len(full) - plen)
        slots = self.torch.cat((m.device_indices, own)) if plen else own.clone()
        iparams = sgl.InsertParams(key=full_key, value=slots, priority=0)
        t3 = pc()
        r = cache.insert(iparams)
        t4 = pc()
        if r.prefix_len > plen:
            alloc.free(slots[plen : r.prefix_len])
        cache._tag_session_leaf(req, None, node=r.last_device_node)
        t5 = pc()
        cache.dec_lock_ref(m.last_device_node)
        t6 = pc()
        return t1 - t0, t4 - t3, (t2 - t1) + (t6 - t5), plen

    def close(self, sid: str) -> tuple[float, int, int]:
        before = self.cache.evictable_size_ + self.cache.protected_size_
        t0 = pc()
        freed = self.cache.release_radix_session(sid)
        t1 = pc()
        after = self.cache.evictable_size_ + self.cache.protected_size_
        return t1 - t0, freed, before - after

    def evict(self, n: int) -> tuple[float, int]:
        params = self.sgl.EvictParams(num_tokens=n)
        t0 = pc()
        res = self.cache.evict(params)
        t1 = pc()
        return t1 - t0, res.num_tokens_evicted

    def take_free(self) -> None:
        n = self.alloc.available_size()
        if n:
            self.alloc.alloc(n)

    def sizes(self) -> tuple[int, int]:
        nodes = 0
        stack = [self.cache.root_node]
        while stack:
            node = stack.pop()
            children = node.children.values()
            nodes += len(children)
            stack.extend(children)
        return self.cache.evictable_size_ + self.cache.protected_size_, nodes


# ----------------------------------------------------------------------------------------------
# section 1: throughput on the chat trace
# ----------------------------------------------------------------------------------------------


def throughput_once(cfg: BenchConfig, sgl, rep: int) -> dict[str, Any]:
    tc = cfg.trace
    plan, session_sys, sys_lens, bound = plan_trace(tc)
    capacity = bound + 16
    tokens = TraceTokens(tc, session_sys, sys_lens)
    rt, sg = RtSide(capacity), SglSide(sgl, capacity)
    sides = (rt, sg)
    n_chunks = -(-len(plan) // cfg.chunk)
    # per side: [match, insert, lock] seconds per chunk
    acc = {s.name: [[0.0, 0.0, 0.0] for _ in range(n_chunks)] for s in sides}
    hits = 0
    input_tokens = 0
    mismatches = 0
    sids: list[str] = []
    seen: set[int] = set()
    t_start = pc()
    with GCPaused():
        for i, (sid_i, kind, user_len, out_len) in enumerate(plan):
            inp_arr, full_arr = tokens.next(sid_i, kind, user_len, out_len)
            if sid_i not in seen:
                seen.add(sid_i)
                sids.append(f"s{sid_i}")
            sid = f"s{sid_i}"
            # radixtop's native input: fresh Python ints in lists, as a tokenizer and its Req give
            inp_list = inp_arr.tolist()
            full_list = inp_list + full_arr[len(inp_arr) :].tolist()
            chunk = i // cfg.chunk
            order = (rt, sg) if i % 2 == 0 else (sg, rt)
            plens = []
            for side in order:
                if side is rt:
                    tm, ti, tl, plen = rt.request(inp_list, full_list, sid)
                else:
                    tm, ti, tl, plen = sg.request(inp_arr, full_arr, sid)
                a = acc[side.name][chunk]
                a[0] += tm
                a[1] += ti
                a[2] += tl
                plens.append(plen)
            if plens[0] != plens[1]:
                mismatches += 1
            hits += plens[0]
            input_tokens += len(inp_arr)
    t_trace = pc() - t_start
    rt_size, sg_size = rt.sizes(), sg.sizes()
    log(
        f"  repeat {rep}: trace of {len(plan)} requests done in {t_trace:.1f}s "
        f"(tree tokens/nodes radixtop {rt_size}, SGLang {sg_size}; RSS {rss_mib():.0f} MiB)"
    )
    chunk_sizes = [min(cfg.chunk, len(plan) - c * cfg.chunk) for c in range(n_chunks)]
    ops = {}
    for j, op in enumerate(("match_prefix", "insert", "lock")):
        per_side = {}
        for side in sides:
            secs = [acc[side.name][c][j] for c in range(n_chunks)]
            per_side[side.name] = {
                "seconds": sum(secs),
                "ops_per_s": len(plan) / sum(secs),
                "chunk_ops_per_s": [n / s for n, s in zip(chunk_sizes, secs)],
            }
        chunk_ratios = [
            b / a for a, b in zip(
                [acc["radixtop"][c][j] for c in range(n_chunks)], [acc["SGLang"][c][j] for c in range(n_chunks)]
            )
        ]
        ops[op] = {
            **per_side,
            "ratio": per_side["radixtop"]["ops_per_s"] / per_side["SGLang"]["ops_per_s"],
            "chunk_ratio_median": median(chunk_ratios),
            "chunk_ratio_min": min(chunk_ratios),
            "chunk_ratio_max": max(chunk_ratios),
        }

    # ----- close half the sessions (same ones, same order) -----
    rng = random.Random(tc.seed + 7 + rep)
    to_close = rng.sample(sids, int(len(sids) * cfg.close_share))
    for side in sides:
        side.take_free()
    close_t = {s.name: 0.0 for s in sides}
    close_nodes = {s.name: 0 for s in sides}
    close_tokens = {s.name: 0 for s in sides}
    close_mismatch = 0
    close_calls: dict[str, list[float]] = {s.name: [] for s in sides}
    with GCPaused():
        for k, sid in enumerate(to_close):
            order = (rt, sg) if k % 2 == 0 else (sg, rt)
            freed = []
            for side in order:
                dt, nodes, toks = side.close(sid)
                close_t[side.name] += dt
                close_calls[side.name].append(dt)
                close_nodes[side.name] += nodes
                close_tokens[side.name] += toks
                freed.append(toks)
                side.take_free()
            if freed[0] != freed[1]:
                close_mismatch += 1
    close = {
        s.name: {
            "seconds": close_t[s.name],
            "sessions_per_s": len(to_close) / close_t[s.name],
            "freed_nodes": close_nodes[s.name],
            "freed_tokens": close_tokens[s.name],
            "call_us": call_stats(close_calls[s.name]),
        }
        for s in sides
    }
    close["sessions"] = len(to_close)
    close["ratio"] = close["radixtop"]["sessions_per_s"] / close["SGLang"]["sessions_per_s"]
    close["mismatched_closes"] = close_mismatch

    # ----- evict(N) in a loop on what is left -----
    ev_t = {s.name: 0.0 for s in sides}
    ev_tok = {s.name: 0 for s in sides}
    calls = 0
    ev_calls: dict[str, list[float]] = {s.name: [] for s in sides}
    with GCPaused():
        for k in range(cfg.evict_calls):
            if rt.cache.evictable_size() < cfg.evict_tokens or sg.cache.evictable_size_ < cfg.evict_tokens:
                break
            order = (rt, sg) if k % 2 == 0 else (sg, rt)
            for side in order:
                dt, toks = side.evict(cfg.evict_tokens)
                ev_t[side.name] += dt
                ev_calls[side.name].append(dt)
                ev_tok[side.name] += toks
                side.take_free()
            calls += 1
    evict = {
        s.name: {
            "seconds": ev_t[s.name],
            "tokens": ev_tok[s.name],
            "tokens_per_s": ev_tok[s.name] / ev_t[s.name] if ev_t[s.name] else None,
            "us_per_call": ev_t[s.name] / calls * 1e6 if calls else None,
            "call_us": call_stats(ev_calls[s.name]),
        }
        for s in sides
    }
    evict["calls"] = calls
    evict["num_tokens"] = cfg.evict_tokens
    evict["ratio"] = (
        evict["radixtop"]["tokens_per_s"] / evict["SGLang"]["tokens_per_s"] if calls else None
    )
    out = {
        "requests": len(plan),
        "sessions": len(sids),
        "input_tokens": input_tokens,
        "hit_tokens": hits,
        "capacity": capacity,
        "tree_tokens": {"radixtop": rt_size[0], "SGLang": sg_size[0]},
        "tree_nodes": {"radixtop": rt_size[1], "SGLang": sg_size[1]},
        "prefix_mismatches": mismatches,
        "trace_wall_s": t_trace,
        "ops": ops,
        "close": close,
        "evict": evict,
    }
    del rt, sg, sides, tokens
    gc.collect()
    return out


def throughput(cfg: BenchConfig, sgl) -> dict[str, Any]:
    runs = []
    for rep in range(cfg.repeats):
        log(f"throughput repeat {rep + 1}/{cfg.repeats}")
        runs.append(throughput_once(cfg, sgl, rep))
    summary: dict[str, Any] = {}
    for op in ("match_prefix", "insert", "lock"):
        summary[op] = {
            "radixtop_ops_per_s": median([r["ops"][op]["radixtop"]["ops_per_s"] for r in runs]),
            "sglang_ops_per_s": median([r["ops"][op]["SGLang"]["ops_per_s"] for r in runs]),
            "ratio": median([r["ops"][op]["ratio"] for r in runs]),
            "chunk_ratio_median": median([x for r in runs for x in [r["ops"][op]["chunk_ratio_median"]]]),
            "chunk_ratio_min": min(r["ops"][op]["chunk_ratio_min"] for r in runs),
            "chunk_ratio_max": max(r["ops"][op]["chunk_ratio_max"] for r in runs),
        }
    summary["close"] = {
        "radixtop_sessions_per_s": median([r["close"]["radixtop"]["sessions_per_s"] for r in runs]),
        "sglang_sessions_per_s": median([r["close"]["SGLang"]["sessions_per_s"] for r in runs]),
        "ratio": median([r["close"]["ratio"] for r in runs]),
    }
    summary["evict"] = {
        "radixtop_tokens_per_s": median([r["evict"]["radixtop"]["tokens_per_s"] for r in runs if r["evict"]["calls"]]),
        "sglang_tokens_per_s": median([r["evict"]["SGLang"]["tokens_per_s"] for r in runs if r["evict"]["calls"]]),
        "ratio": median([r["evict"]["ratio"] for r in runs if r["evict"]["calls"]]),
    }
    return {"runs": runs, "summary": summary}


# ----------------------------------------------------------------------------------------------
# section 2: close / evict cost against tree size
# ----------------------------------------------------------------------------------------------

PREFIX_LEN = 16
BRANCHES_PER_PREFIX = 1000
CHAIN_BASE = 5_000_000  # first token of measured chains (outside the filler's ranges)
PREFIX_BASE = 1_000_000


@dataclass
class ScaleTree:
    side: Any
    nodes: int
    sessions: list[str]  # measured sessions (8 tagged nodes each), oldest first
    victims: int  # evict victim chains (oldest in LRU order)
    build_s: float


def scale_layout(cfg: BenchConfig, target_nodes: int, reps: int) -> tuple[int, int, int]:
    """(victim chains, measured sessions, filler branches) so the tree has about target_nodes."""
    chain_nodes = 2 * reps * cfg.session_turns
    filler = max(0, target_nodes - chain_nodes)
    prefixes = max(1, -(-filler // (BRANCHES_PER_PREFIX + 1)))
    branches = max(0, filler - prefixes)
    return reps, reps, branches


def build_scale_tree(
    cfg: BenchConfig, kind: str, target_nodes: int, reps: int, sgl=None, budget_s: float | None = None
) -> ScaleTree | None:
    """A tree of about ``target_nodes`` nodes, built with the cache's public insert (plus the session
    tagging ``cache_finished_req`` does):

    * ``reps`` evict-victim chains (8 nodes x 256 tokens, no session), built first: LRU-oldest;
    * ``reps`` measured sessions (8 turns of 256 tokens, each turn's node tagged), built next;
    * filler: prefixes of 16 tokens, each with up to 1000 branches of 2-4 tokens (one leaf each),
      tagged 8 branches per session, built last (newest). Returns None when the build passes
      ``budget_s``.
    """
    n_victims, n_sessions, n_branches = scale_layout(cfg, target_nodes, reps)
    turns, turn_tokens = cfg.session_turns, cfg.turn_tokens
    chain_len = turns * turn_tokens
    rng = np.random.default_rng(99)
    n_prefixes = -(-n_branches // BRANCHES_PER_PREFIX) if n_branches else 0
    branch_lens = rng.integers(2, 5, n_branches)
    total = (n_victims + n_sessions) * chain_len + n_prefixes * PREFIX_LEN + int(branch_lens.sum())
    if kind == "radixtop":
        side = RtSide(total)
        slots_all = side.alloc.alloc(total)
    else:
        side = SglSide(sgl, total)
        slots_all = side.alloc.alloc(total)
    cache = side.cache
    cursor = 0
    t0 = pc()

    def chain(c: int, sid: str | None) -> None:
        nonlocal cursor
        toks = [CHAIN_BASE + c] + rng.integers(0, 32000, chain_len - 1).tolist()
        slots = slots_all[cursor : cursor + chain_len]
        cursor += chain_len
        if kind == "radixtop":
            for t in range(1, turns + 1):
                r = cache.insert(toks[: t * turn_tokens], slots[: t * turn_tokens])
                if sid is not None:
                    cache._tag_session_leaf(sid, r.last_node)
        else:
            arr = array("q", toks)
            req = types.SimpleNamespace(session_id=sid)
            for t in range(1, turns + 1):
                r = cache.insert(
                    sgl.InsertParams(key=sgl.RadixKey(arr[: t * turn_tokens]), value=slots[: t * turn_tokens])
                )
                if sid is not None:
                    cache._tag_session_leaf(req, None, node=r.last_device_node)

    sessions = []
    with GCPaused():
        for c in range(n_victims):
            chain(c, None)
        for c in range(n_sessions):
            sid = f"m{c}"
            chain(n_victims + c, sid)
            sessions.append(sid)
        b = 0
        for p in range(n_prefixes):
            prefix = [PREFIX_BASE + p] + rng.integers(0, 32000, PREFIX_LEN - 1).tolist()
            p_slots = slots_all[cursor : cursor + PREFIX_LEN]
            cursor += PREFIX_LEN
            if kind == "radixtop":
                cache.insert(prefix, p_slots)
            else:
                cache.insert(sgl.InsertParams(key=sgl.RadixKey(array("q", prefix)), value=p_slots))
            nb = min(BRANCHES_PER_PREFIX, n_branches - b)
            tails = rng.integers(0, 32000, (nb, 4)).tolist()
            for j in range(nb):
                blen = int(branch_lens[b])
                branch = [j] + tails[j][: blen - 1]
                b_slots = slots_all[cursor : cursor + blen]
                cursor += blen
                sid = f"f{b // cfg.session_turns}"
                if kind == "radixtop":
                    r = cache.insert(prefix + branch, np.concatenate((p_slots, b_slots)))
                    cache._tag_session_leaf(sid, r.last_node)
                else:
                    req = side.reqs.get(sid)
                    if req is None:
                        req = side.reqs[sid] = types.SimpleNamespace(session_id=sid)
                    r = cache.insert(
                        sgl.InsertParams(
                            key=sgl.RadixKey(array("q", prefix + branch)),
                            value=side.torch.cat((p_slots, b_slots)),
                        )
                    )
                    cache._tag_session_leaf(req, None, node=r.last_device_node)
                b += 1
            if budget_s is not None and pc() - t0 > budget_s:
                return None
    assert cursor == total, (cursor, total)
    build_s = pc() - t0
    tokens, nodes = side.sizes()
    assert tokens == total, (kind, tokens, total)
    return ScaleTree(side, nodes, sessions, n_victims, build_s)


def measure_scaling(trees: dict[str, ScaleTree], reps_close: dict[str, int], reps_evict: dict[str, int],
                    evict_tokens: int) -> dict[str, Any]:
    """Alternate between the trees (order flips each round) so noise hits them alike."""
    labels = list(trees)
    res: dict[str, Any] = {lab: {"close_us": [], "close_nodes": [], "close_tokens": [],
                                 "evict_us": [], "evict_tokens": []} for lab in labels}
    rounds = max(max(reps_close.values()), max(reps_evict.values()))
    with GCPaused():
        for k in range(rounds):
            order = labels if k % 2 == 0 else labels[::-1]
            for lab in order:
                tree = trees[lab]
                if k < reps_close[lab]:
                    dt, nodes, toks = tree.side.close(tree.sessions[k])
                    tree.side.take_free()
                    res[lab]["close_us"].append(dt * 1e6)
                    res[lab]["close_nodes"].append(nodes)
                    res[lab]["close_tokens"].append(toks)
            for lab in order:
                tree = trees[lab]
                if k < reps_evict[lab]:
                    dt, toks = tree.side.evict(evict_tokens)
                    tree.side.take_free()
                    res[lab]["evict_us"].append(dt * 1e6)
                    res[lab]["evict_tokens"].append(toks)
    for lab in labels:
        r = res[lab]
        r["close_us_median"] = median(r["close_us"])
        r["evict_us_median"] = median(r["evict_us"])
        r["nodes"] = trees[lab].nodes
        r["build_s"] = trees[lab].build_s
    return res


def scaling(cfg: BenchConfig, sgl) -> dict[str, Any]:
    out: dict[str, Any] = {"small_target": cfg.scale_small, "large_target": cfg.scale_large,
                           "session_nodes": cfg.session_turns,
                           "session_tokens": cfg.session_turns * cfg.turn_tokens,
                           "evict_tokens": cfg.session_turns * cfg.turn_tokens}
    ev = cfg.session_turns * cfg.turn_tokens

    # radixtop: both trees alive, measured alternately
    log(f"scaling: building radixtop trees of ~{cfg.scale_small} and ~{cfg.scale_large} nodes")
    small = build_scale_tree(cfg, "radixtop", cfg.scale_small, cfg.scale_reps)
    large = build_scale_tree(cfg, "radixtop", cfg.scale_large, cfg.scale_reps)
    log(f"  built in {small.build_s:.1f}s / {large.build_s:.1f}s ({small.nodes} / {large.nodes} nodes; "
        f"RSS {rss_mib():.0f} MiB)")
    reps = {"small": cfg.scale_reps, "large": cfg.scale_reps}
    rt = measure_scaling({"small": small, "large": large}, reps, reps, ev)
    rt["close_ratio"] = rt["large"]["close_us_median"] / rt["small"]["close_us_median"]
    rt["evict_ratio"] = rt["large"]["evict_us_median"] / rt["small"]["evict_us_median"]
    out["radixtop"] = rt
    del small, large
    gc.collect()

    # SGLang: the small tree always; the large one when it builds within the budget
    log(f"scaling: building SGLang tree of ~{cfg.scale_small} nodes")
    s_small = build_scale_tree(cfg, "SGLang", cfg.scale_small, cfg.sgl_scale_reps_small, sgl=sgl)
    log(f"scaling: building SGLang tree of ~{cfg.scale_large} nodes (budget {cfg.sgl_large_budget_s:.0f}s)")
    reps_l = max(cfg.sgl_scale_reps_large_close, cfg.sgl_scale_reps_large_evict)
    s_large = build_scale_tree(cfg, "SGLang", cfg.scale_large, reps_l, sgl=sgl, budget_s=cfg.sgl_large_budget_s)
    trees = {"small": s_small}
    rc = {"small": cfg.sgl_scale_reps_small}
    re_ = {"small": cfg.sgl_scale_reps_small}
    if s_large is not None:
        log(f"  built in {s_small.build_s:.1f}s / {s_large.build_s:.1f}s ({s_small.nodes} / {s_large.nodes} nodes; "
            f"RSS {rss_mib():.0f} MiB)")
        trees["large"] = s_large
        rc["large"] = cfg.sgl_scale_reps_large_close
        re_["large"] = cfg.sgl_scale_reps_large_evict
    else:
        log("  SGLang large tree skipped: its build passed the budget")
        gc.collect()
    sg = measure_scaling(trees, rc, re_, ev)
    if s_large is not None:
        sg["close_ratio"] = sg["large"]["close_us_median"] / sg["small"]["close_us_median"]
        sg["evict_ratio"] = sg["large"]["evict_us_median"] / sg["small"]["evict_us_median"]
    else:
        sg["large"] = None
        sg["large_skipped"] = f"build passed {cfg.sgl_large_budget_s:.0f}s"
    out["SGLang"] = sg
    del trees, s_small, s_large
    gc.collect()
    return out


# ----------------------------------------------------------------------------------------------
# context: one allocator free (each close / evict frees one slot array per node)
# ----------------------------------------------------------------------------------------------


def allocator_free(cfg: BenchConfig, sgl, calls: int = 2000) -> dict[str, Any]:
    """Median microseconds of one ``free`` of a node's slots (``turn_tokens`` of them) on each side's
    allocator, alternating sides; the freed slots are taken back after each call (untimed)."""
    n = cfg.turn_tokens
    rt, sg = RtSide(n * calls), SglSide(sgl, n * calls)
    rt_slots, sg_slots = rt.alloc.alloc(n * calls), sg.alloc.alloc(n * calls)
    times: dict[str, list[float]] = {"radixtop": [], "SGLang": []}
    with GCPaused():
        for k in range(calls):
            for side, slots in ((rt, rt_slots), (sg, sg_slots)) if k % 2 == 0 else ((sg, sg_slots), (rt, rt_slots)):
                chunk = slots[k * n : (k + 1) * n]
                t0 = pc()
                side.alloc.free(chunk)
                t1 = pc()
                side.take_free()
                times[side.name].append((t1 - t0) * 1e6)
    return {"slots_per_free": n, "calls": calls,
            "radixtop_us": median(times["radixtop"]), "sglang_us": median(times["SGLang"])}


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------


def fmt_num(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.1f}"


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def report(cfg: BenchConfig, res: dict[str, Any]) -> str:
    tp = res["throughput"]["summary"]
    run0 = res["throughput"]["runs"][0]
    lines = []
    lines.append(
        f"### Throughput: {run0['requests']:,} requests, {run0['sessions']:,} sessions, "
        f"{run0['input_tokens'] / run0['requests']:.0f} input tokens/request on average, "
        f"{run0['hit_tokens'] / run0['input_tokens']:.1%} cache hit; tree of "
        f"{run0['tree_nodes']['radixtop']:,} nodes / {run0['tree_tokens']['radixtop']:,} tokens "
        f"(median of {cfg.repeats} repeat{'s' if cfg.repeats > 1 else ''})"
    )
    lines.append("")
    lines.append("| operation | unit | radixtop | SGLang 0.5.16 | radixtop/SGLang | chunk ratios (min..max) | goal | met |")
    lines.append("|---|---|---:|---:|---:|---:|---|---|")
    for op, label in (("match_prefix", "match_prefix"), ("insert", "insert"), ("lock", "inc+dec_lock_ref")):
        s = tp[op]
        goal = ">= 1x (2x)" if op != "lock" else "-"
        met = verdict(s["ratio"] >= 1.0) if op != "lock" else "-"
        if op != "lock" and s["ratio"] >= 2.0:
            met = "yes (2x)"
        lines.append(
            f"| {label} | ops/s | {fmt_num(s['radixtop_ops_per_s'])} | {fmt_num(s['sglang_ops_per_s'])} | "
            f"{fmt_ratio(s['ratio'])} | {s['chunk_ratio_min']:.2f}..{s['chunk_ratio_max']:.2f} | {goal} | {met} |"
        )
    c = tp["close"]
    lines.append(
        f"| close ({run0['close']['sessions']:,} sessions) | sessions/s | {fmt_num(c['radixtop_sessions_per_s'])} | "
        f"{fmt_num(c['sglang_sessions_per_s'])} | {fmt_ratio(c['ratio'])} | - | - | - |"
    )
    e = tp["evict"]
    lines.append(
        f"| evict({cfg.evict_tokens}) x {run0['evict']['calls']:,} calls | tokens/s | {fmt_num(e['radixtop_tokens_per_s'])} | "
        f"{fmt_num(e['sglang_tokens_per_s'])} | {fmt_ratio(e['ratio'])} | - | - | - |"
    )
    sc = res["scaling"]
    rt, sg = sc["radixtop"], sc["SGLang"]
    ns, nl = fmt_nodes(rt["small"]["nodes"]), fmt_nodes(rt["large"]["nodes"])
    lines.append("")
    lines.append(
        f"### Scaling: one close (session of {sc['session_nodes']} tagged nodes, {sc['session_tokens']} tokens) "
        f"and one evict({sc['evict_tokens']}) (8 nodes), on a small and a large tree (median microseconds)"
    )
    lines.append("")
    lines.append("| operation | cache | tree (small / large nodes) | small tree (us) | large tree (us) | large/small | goal | met |")
    lines.append("|---|---|---|---:|---:|---:|---|---|")
    for op, key in (("close", "close"), ("evict", "evict")):
        r = rt[f"{key}_ratio"]
        lines.append(
            f"| {op} | radixtop | {ns} / {nl} | {rt['small'][f'{key}_us_median']:.1f} | "
            f"{rt['large'][f'{key}_us_median']:.1f} | {fmt_ratio(r)} | <= 1.5x | {verdict(r <= 1.5)} |"
        )
        if sg.get("large"):
            r2 = sg[f"{key}_ratio"]
            lines.append(
                f"| {op} | SGLang 0.5.16 | {fmt_nodes(sg['small']['nodes'])} / {fmt_nodes(sg['large']['nodes'])} | "
                f"{sg['small'][f'{key}_us_median']:.1f} | {sg['large'][f'{key}_us_median']:.1f} | {fmt_ratio(r2)} | - | - |"
            )
        else:
            lines.append(
                f"| {op} | SGLang 0.5.16 | {fmt_nodes(sg['small']['nodes'])} / skipped | "
                f"{sg['small'][f'{key}_us_median']:.1f} | skipped ({sg.get('large_skipped')}) | n/a | - | - |"
            )
    af = res.get("allocator_free")
    if af:
        lines.append("")
        lines.append(f"### Context: one allocator free of {af['slots_per_free']} slots (a close or evict frees one per node)")
        lines.append("")
        lines.append("| operation | unit | radixtop | SGLang 0.5.16 | radixtop/SGLang (speed) |")
        lines.append("|---|---|---:|---:|---:|")
        lines.append(
            f"| allocator.free({af['slots_per_free']} slots) | us/call | {af['radixtop_us']:.1f} | {af['sglang_us']:.1f} | "
            f"{fmt_ratio(af['sglang_us'] / af['radixtop_us'])} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run (< 60 s)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "cache.json", help="JSON results path")
    ap.add_argument("--repeats", type=int, help="throughput repeats (default: 3 full, 1 quick)")
    ap.add_argument("--requests", type=int, help="requests in the throughput trace")
    args = ap.parse_args(argv)

    cfg = quick_config() if args.quick else full_config()
    if args.repeats is not None:
        cfg = BenchConfig(**{**asdict(cfg), "trace": cfg.trace, "repeats": args.repeats})
    if args.requests is not None:
        cfg = BenchConfig(**{**asdict(cfg), "trace": TraceConfig(**{**asdict(cfg.trace), "requests": args.requests})})

    t_all = pc()
    log(f"mode {cfg.mode}: importing sglang (start-up, not measured)")
    t_imp = pc()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from _sglang_import import import_sglang

        sgl = import_sglang()
    import torch

    torch.set_num_threads(1)
    log(f"  sglang {sgl.version} imported in {pc() - t_imp:.1f}s (torchvision stand-in: {sgl.stub})")

    results: dict[str, Any] = {
        "mode": cfg.mode,
        "config": asdict(cfg),
        "environment": environment(
            torch=torch.__version__,
            torch_threads=torch.get_num_threads(),
            sglang=sgl.version,
            gc="disabled (after collect + freeze) during every timed phase, both sides",
            timer="time.perf_counter around each cache call",
        ),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    results["throughput"] = throughput(cfg, sgl)
    results["scaling"] = scaling(cfg, sgl)
    results["allocator_free"] = allocator_free(cfg, sgl)
    results["wall_s"] = pc() - t_all
    finish(args.out, results, report(cfg, results),
           f"_{cfg.mode} run, {results['wall_s']:.0f} s wall (sglang import included); JSON: {args.out}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
