"""One walk of SGLang 0.5.23's Rust tree core for its locks (issue 27, item 2).

On the default core (``UnifiedRadixCache`` on the Rust TreeCore) radixtop cannot read lock counts
node by node. The production binding has ``walk_for_kv_canary(unlocked_only, swa_resident_only)``
(``sglang/srt/kv_canary/radix_cache_walker.py``): every FULL device slot the tree holds, or only
those of unlocked nodes. Walked twice, the difference is the slots that running requests lock.
This builds a real 0.5.23 ``UnifiedRadixCache`` on the Rust core over real CPU pools
(tests/on_sglang/ref/drive23.py's builder), inserts distinct token sequences until it holds about
100k and 1M nodes (page size 1: groups of 100 sequences share a 4-token prefix, each adds a 2-token
leaf), locks the paths of a few sequences as admitted requests do (``cache.lock`` on the matched
node), times each walk (wall and the thread's CPU, median and max of several repeats), and checks
that the two walks' difference is exactly the slots on the locked paths.

    .venv-sglang23/bin/python benchmarks/bench_rust_canary_walk.py --out benchmarks/results/rust_canary_walk.json
    .venv-sglang23/bin/python benchmarks/bench_rust_canary_walk.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import log  # noqa: E402

from tests.on_sglang.ref import drive23  # noqa: E402

PREFIX, LEAF, FANOUT = 4, 2, 100


def sequence(i: int) -> array:
    g = i // FANOUT
    return array("q", [7, 1 + (g >> 15), 1 + (g & 0x7FFF), 9, 1 + i % 30000, 1 + i // 30000])


def build(nodes: int):
    """A Rust-core cache holding about ``nodes`` nodes: ``n`` leaves under ``n / FANOUT`` prefixes."""
    sgl = drive23.import_sglang23()  # first: it stubs torchvision, which SGLang's imports need
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    n = nodes * FANOUT // (FANOUT + 1)
    capacity = n * LEAF + (n // FANOUT + 1) * PREFIX + PREFIX + LEAF
    cache, pools = drive23.build_unified_cache23(
        capacity, 1, enable_session_radix_cache=False, tree_core_backend="rust",
        geometry=drive23.KVGeometry(layer_num=1, head_num=1, head_dim=1))
    assert cache._tree_core_backend == "rust", "0.5.23's wheel ships the Rust TreeCore; it must load here"
    # Slots are handed out here, not by the allocator; an insert passes the cached prefix's own slots,
    # which the insert hands back to free as duplicates. They stay in the tree, so those frees are
    # counted and dropped (the allocator's free concatenates its whole free list: quadratic at 1M).
    torch = sgl.torch
    fresh = iter(range(capacity))
    shared: dict[tuple[int, ...], list[int]] = {}
    frees = 0
    free = pools.allocator.free

    def counted_free(indices):
        nonlocal frees
        frees += len(indices)

    pools.allocator.free = counted_free
    for i in range(n):
        tokens = sequence(i)
        slots: list[int] = []
        for cut in (2, PREFIX):
            head = tuple(tokens[:cut])
            if head not in shared:
                shared[head] = slots + [next(fresh) for _ in range(cut - len(slots))]
            slots = list(shared[head])
        slots += [next(fresh) for _ in range(len(tokens) - PREFIX)]
        cache.insert(InsertParams(key=sgl.RadixKey(tokens), value=torch.tensor(slots, dtype=torch.int64)))
    pools.allocator.free = free
    assert frees <= n * PREFIX, f"the inserts freed {frees} slots"
    return cache, pools, n


def match(cache, tokens):
    sgl = drive23.import_sglang23()
    return cache.match_prefix(sgl.MatchPrefixParams(key=sgl.RadixKey(tokens)))


def timed(fn, repeats: int):
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.thread_time()
        out = fn()
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    return out, walls, cpus


def ms(xs: list[float]) -> dict:
    return {"median_ms": round(statistics.median(xs) * 1e3, 3), "max_ms": round(max(xs) * 1e3, 3)}


def run(nodes: int, locks: int, repeats: int) -> dict:
    t = time.perf_counter()
    cache, pools, n = build(nodes)
    build_s = time.perf_counter() - t
    tree = cache.tree_core
    # Locks as admitted requests take them (PrefillAdder: cache.lock(req.last_node)), spread over the tree.
    locked_slots: set[int] = set()
    held = []
    for k in range(locks):
        tokens = sequence(k * (n // locks))
        m = match(cache, tokens)
        locked_slots.update(cache.path_device_indices(m.last_device_node).tolist())
        held.append(cache.lock(m.last_device_node))
    cached = cache.evictable_size() + cache.protected_size()
    assert cache.protected_size() == len(locked_slots), (cache.protected_size(), len(locked_slots))

    every, walls_all, cpus_all = timed(lambda: tree.walk_for_kv_canary(unlocked_only=False, swa_resident_only=False), repeats)
    unlocked, walls_un, cpus_un = timed(lambda: tree.walk_for_kv_canary(unlocked_only=True, swa_resident_only=False), repeats)
    all_set = set(every.slot_indices.tolist())
    unlocked_set = set(unlocked.slot_indices.tolist())
    assert len(all_set) == len(every.slot_indices) == cached, "the full walk is every cached slot, once"
    assert unlocked_set <= all_set
    diff = all_set - unlocked_set
    exact = diff == locked_slots
    assert exact, f"walk difference {len(diff)} slots != locked {len(locked_slots)}"
    for lock in held:
        cache.unlock(lock)
    return {"nodes_target": nodes, "sequences": n, "nodes_about": n + -(-n // FANOUT), "build_s_note": "includes importing SGLang (about 8 s) on the first size", "cached_slots": cached,
            "locks": locks, "locked_slots": len(locked_slots), "difference_is_locked": exact,
            "build_s": round(build_s, 1), "repeats": repeats,
            "walk_all": {"wall": ms(walls_all), "cpu": ms(cpus_all)},
            "walk_unlocked": {"wall": ms(walls_un), "cpu": ms(cpus_un)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--locks", type=int, default=64, help="locked request paths (SGLang's running batch)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.repeats = [10_000], 3
    results = []
    for size in args.sizes:
        r = run(size, args.locks, args.repeats)
        log(json.dumps(r))
        results.append(r)
        a, u = r["walk_all"], r["walk_unlocked"]
        both = a["wall"]["median_ms"] + u["wall"]["median_ms"]
        print(f"Rust core, ~{r['nodes_about']:,} nodes, {r['cached_slots']:,} slots, {r['locks']} locked paths "
              f"({r['locked_slots']} slots): walk all {a['wall']['median_ms']} ms wall / {a['cpu']['median_ms']} ms CPU "
              f"(max {a['wall']['max_ms']}), unlocked only {u['wall']['median_ms']} / {u['cpu']['median_ms']} "
              f"(max {u['wall']['max_ms']}); both {both:.1f} ms; difference == locked slots: {r['difference_is_locked']}")
    summary = {"sglang": "0.5.23", "core": "rust", "page_size": 1, "results": results}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
