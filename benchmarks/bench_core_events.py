"""What the tree from the Rust core's own KV events costs SGLang's scheduler thread.

On SGLang 0.5.19+'s default Rust tree core the plugin builds the core with
``enable_kv_cache_events`` and takes the recorded events once a scheduler loop
(``adapters/sglang/events/core.py``); a thread of radixtop's applies them to its tree. This drives
a real 0.5.23 ``UnifiedRadixCache`` on the Rust core request by request, as its scheduler does
(tests/on_sglang/ref/drive23.py: match, lock, allocate, insert, unlock; evictions when the pool is
full), once as SGLang builds it and once as the plugin does (events recorded, ``take_events()``
after every request, radixtop's tree kept on its thread), in alternating blocks so drift on a
shared machine hits both alike. It reports the scheduler thread's time per request in each mode,
their ratio, and the longest ``take_events()``.

    .venv-sglang23/bin/python benchmarks/bench_core_events.py            # about a minute
    .venv-sglang23/bin/python benchmarks/bench_core_events.py --quick
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import log  # noqa: E402

from tests.on_sglang.ref import drive23  # noqa: E402


def build(sgl, capacity: int, events: bool):
    drive23._publish_server_args(sgl, 1, sessions=False)
    kv_pool, allocator, rtp = drive23._build_pools(sgl, capacity, 1, drive23.KVGeometry(), 16, 8192)
    cache = sgl.UnifiedRadixCache(sgl.CacheInitParams(
        disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=allocator, page_size=1,
        eviction_policy="lru", tree_components=(sgl.ComponentType.FULL,), enable_session_radix_cache=False,
        tree_core_backend="rust", enable_kv_cache_events=events))
    assert cache._tree_core_backend == "rust"
    return cache, drive23.Pools(kv_pool, allocator, rtp, 1, kind="unified", sessions=False)


def workload(seed: int, n: int) -> list[tuple[list[int], list[int]]]:
    """Chat-like prompts: a few system prompts, conversations that grow turn by turn."""
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 30000) for _ in range(200)] for _ in range(4)]
    talks: list[list[int]] = []
    out = []
    for _ in range(n):
        if not talks or rng.random() < 0.3:
            talks.append(list(rng.choice(systems)))
        talk = rng.choice(talks)
        talk.extend(rng.randrange(3, 30000) for _ in range(rng.randrange(20, 120)))
        out.append((list(talk), [rng.randrange(3, 30000) for _ in range(8)]))
        talk.extend(out[-1][1])
        if len(talk) > 3000:
            talks.remove(talk)
    return out


def run_block(sgl, capacity: int, requests, events: bool) -> dict:
    cache, pools = build(sgl, capacity, events)
    core = None
    if events:
        from radixtop.adapters.events.adapter import EventTreeAdapter
        from radixtop.adapters.sglang.events.core import CoreEvents

        core = CoreEvents(cache, EventTreeAdapter(name="bench"))
    takes: list[float] = []
    started = time.perf_counter()
    for tokens, output in requests:
        drive23.run_request(cache, pools, tokens, output)
        if core is not None:  # the plugin's hook, once a scheduler loop
            t = time.perf_counter()
            core.drain()
            takes.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    nodes = None
    if core is not None:
        tree = core.tree
        last = core._queued - 1
        tree.wait_for_seq(last, 60)
        nodes = tree.stats().node_count
        assert tree.stats().total_tokens == cache.evictable_size() + cache.protected_size(), "tree != cache"
        core.close()
    return {"s": elapsed, "per_request_us": elapsed / len(requests) * 1e6, "max_take_ms": max(takes) * 1e3 if takes else None,
            "nodes": nodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--capacity", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.requests, args.rounds = 300, 1
    sgl = drive23.import_sglang23()
    requests = workload(1, args.requests)
    results: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            results[mode].append(run_block(sgl, args.capacity, requests, mode == "on"))
            log(f"round {r} {mode}: {results[mode][-1]}")
    off = statistics.median(b["per_request_us"] for b in results["off"])
    on = statistics.median(b["per_request_us"] for b in results["on"])
    summary = {"requests": args.requests, "capacity": args.capacity, "rounds": args.rounds,
               "off_us_per_request": round(off, 1), "on_us_per_request": round(on, 1),
               "ratio_on_off": round(on / off, 3),
               "max_take_events_ms": round(max(b["max_take_ms"] for b in results["on"]), 3),
               "nodes": results["on"][-1]["nodes"], "blocks": results}
    print(f"SGLang {sgl.version if hasattr(sgl, 'version') else '0.5.23'} Rust core, {args.requests} requests x "
          f"{args.rounds} rounds: {off:,.0f} us/request as SGLang builds it, {on:,.0f} with radixtop's events "
          f"({on / off:.3f}x); longest take_events() {summary['max_take_events_ms']} ms; "
          f"tree {summary['nodes']} nodes, equal to SGLang's cached tokens")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
