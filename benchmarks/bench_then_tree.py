"""The tree at a past moment, node by node (``CacheAdapter.then_children``: ``tree --at``, ``v`` in
the dashboard's timeline): what a page costs on a busy bundled engine, and what it holds the owner.

A bundled ``Scheduler`` serves prompts over 50 shared heads (5,000 sessions) until its history
holds ``--changes`` changes, the moment asked for at half of them (or half-way from the history's reach, where
its bounds dropped more: the reach moves on as the requests go on). Then, three rounds: the root's page of children then (its first read folds
every change since the moment and reads the paths to every boundary; later ones only what changed
since the last, after 20 more requests), and a page of the root's largest child. Each owner-thread
slice of those reads is timed: the longest is what the engine waits for at most.

    .venv/bin/python benchmarks/bench_then_tree.py               # 400k changes, about 1 minute
    .venv/bin/python benchmarks/bench_then_tree.py --quick       # 40k changes
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import environment, finish, log  # noqa: E402

from radixtop.adapters.bundled.adapter import BundledAdapter  # noqa: E402
from radixtop.adapters.bundled.child_order import ChildOrders  # noqa: E402
from radixtop.gpu_backend.kv_geometry import get_geometry  # noqa: E402
from radixtop.gpu_backend.scheduler import Scheduler  # noqa: E402

pc = time.perf_counter


def owner_timed(s: Scheduler, slices: list[float]) -> BundledAdapter:
    """The bundled adapter over ``s``, its owner calls run here, each slice of a pass timed."""
    adapter = BundledAdapter.__new__(BundledAdapter)
    adapter.name, adapter.tokenizer, adapter.read_only, adapter._child_orders = "bundled", None, False, ChildOrders()
    adapter._init_owner_reads()

    def call(fn, *args, **kwargs):
        began = pc()
        try:
            return fn(s)
        finally:
            slices.append(pc() - began)

    def call_pass(make):
        work = make(s)
        while True:
            began = pc()
            try:
                next(work)
            except StopIteration as done:
                slices.append(pc() - began)
                return done.value
            slices.append(pc() - began)

    adapter._call, adapter._call_pass = call, call_pass
    return adapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=400_000)
    parser.add_argument("--capacity", type=int, default=20_000_000, help="the pool's tokens")
    parser.add_argument("--quick", action="store_true", help="40k changes")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "then_tree.json")
    args = parser.parse_args()
    changes = 40_000 if args.quick else args.changes
    rng = random.Random(1)
    s = Scheduler(get_geometry("tiny"), args.capacity, device="cpu", write_kv=False)
    heads = [[rng.randrange(1000) for _ in range(64)] for _ in range(50)]
    served = [0]

    def request() -> None:
        prompt = rng.choice(heads) + [rng.randrange(1000) for _ in range(rng.randrange(20, 200))]
        s.request(f"s{served[0] % 5000}", prompt, [1, 2, 3], None)
        served[0] += 1

    history = s.cache.history
    while history.stored_count < changes // 2:
        request()
    at = time.time()
    time.sleep(0.01)
    while history.stored_count < changes:
        request()
    reach = history.then_reaches_back_to()
    if at < reach:  # (the history's bounds dropped the first half: half-way from its reach, which moves on)
        at = reach + (time.time() - reach) / 2
    log(f"{served[0]:,} requests, {history.stored_count:,} changes ({history.removed_count:,} removals), "
        f"{len(s.cache.nodes):,} nodes; the moment {time.time() - at:.1f}s ago")
    slices: list[float] = []
    adapter = owner_timed(s, slices)
    rounds = []
    for k in range(3):
        slices.clear()
        began = pc()
        page = adapter.then_children(at, 0, 0, 100)
        root_ms = (pc() - began) * 1e3
        began = pc()
        adapter.then_children(at, page.children[0].id, 0, 100)
        child_ms = (pc() - began) * 1e3
        kept = adapter._then_trees.kept[at]
        rounds.append({"root_ms": root_ms, "child_ms": child_ms, "owner_ms": sum(slices) * 1e3,
                       "longest_slice_ms": max(slices) * 1e3, "owner_slices": len(slices),
                       "boundaries": len(kept.deltas), "left": len(kept.left), "new": len(kept.new)})
        log(f"  round {k + 1}{' (the first read)' if k == 0 else ' (after 20 requests)'}: the root's page "
            f"{root_ms:.0f} ms, a child's {child_ms:.0f} ms; the owner thread {sum(slices) * 1e3:.1f} ms in "
            f"{len(slices)} slices, the longest {max(slices) * 1e3:.2f} ms; {len(kept.deltas):,} boundaries, "
            f"{len(kept.left):,} nodes left and {len(kept.new):,} stored since")
        for _ in range(20):
            request()
    table = "\n".join([
        f"the tree then over {history.stored_count:,} changes, {len(s.cache.nodes):,} nodes now:",
        "",
        "| round | the root's page (ms) | a child's page (ms) | owner thread (ms) | its longest slice (ms) | "
        "boundaries | left since | stored since |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {k + 1}{' (first read)' if k == 0 else ''} | {r['root_ms']:.0f} | {r['child_ms']:.0f} | "
          f"{r['owner_ms']:.1f} | {r['longest_slice_ms']:.2f} | {r['boundaries']:,} | {r['left']:,} | {r['new']:,} |"
          for k, r in enumerate(rounds)),
    ])
    finish(args.out, {"environment": environment(), "changes": history.stored_count, "nodes": len(s.cache.nodes),
                      "requests": served[0], "rounds": rounds}, table,
           "(a read after changes folds only them; the first folds every change since the moment)")


if __name__ == "__main__":
    main()
