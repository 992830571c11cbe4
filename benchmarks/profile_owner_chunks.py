"""Where the longest chunks of radixtop's passes go, on a real SGLang tree: each chunk of the
sessions' orders made at the first read (the attach), of a page of a kept order, of one ranked at
its read, and of each read of a dashboard's poll, timed on its own thread's CPU clock, named by the
lines it ran between.

    .venv/bin/python benchmarks/profile_owner_chunks.py --nodes 1000000            # 0.5.16
    .venv-sglang23/bin/python benchmarks/profile_owner_chunks.py --unified --nodes 1000000

The tree is grown as ``bench_sglang_holds.py`` grows it (~5% of nodes tagged by sessions), each call
of the index's hooks (inside SGLang's insert, split and delete; the ledger's upkeep with them)
timed meanwhile. No other thread runs: each chunk's time is its own work, not a wait for the GIL. A companion to the
holds bench, which measures holds as the scheduler sees them; this one says which code to shorten.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections import defaultdict
from pathlib import Path
from time import perf_counter as pc
from time import thread_time
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import log  # noqa: E402
from bench_sglang_holds import Tree, grow  # noqa: E402  (puts the repository on sys.path)


def innermost(gen: Any) -> tuple[str, int]:
    """The generator a ``yield from`` chain is suspended in, and its line."""
    name, line = "?", 0
    while gen is not None and getattr(gen, "gi_frame", None) is not None:
        name, line = gen.__qualname__, gen.gi_frame.f_lineno
        gen = gen.gi_yieldfrom
    return name, line


def profile(work: Any, label: str, top: int) -> Any:
    """Run ``work`` (a pass) to its end a chunk at a time; log the longest chunks and the per-place totals."""
    rows: list[tuple[float, float, str]] = []
    by_place: dict[str, list[float]] = defaultdict(list)
    where = f"{label} start"
    gc.disable()
    try:
        while True:
            c0, t0 = thread_time(), pc()
            try:
                next(work)
            except StopIteration as done:
                result = done.value
                break
            finally:
                cpu, wall = thread_time() - c0, pc() - t0
                name, line = innermost(work)
                place = f"{where} -> {name}:{line}"
                rows.append((cpu, wall, place))
                by_place[place].append(cpu)
                where = f"{name}:{line}"
    finally:
        gc.enable()
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    log(f"{label}: {len(rows)} chunks, {total:.2f} s CPU; longest chunks (CPU ms, wall ms, from -> to):")
    for cpu, wall, place in rows[:top]:
        log(f"  {cpu * 1e3:6.2f} {wall * 1e3:6.2f}  {place}")
    log(f"{label}: by place (chunks, longest CPU ms, total CPU ms):")
    for place, cpus in sorted(by_place.items(), key=lambda kv: -max(kv[1]))[:top]:
        log(f"  {len(cpus):6d} {max(cpus) * 1e3:6.2f} {sum(cpus) * 1e3:8.1f}  {place}")
    return result


def time_index_hooks(tree: Tree) -> dict[str, list[tuple[float, float]]]:
    """Time each call of the index's hooks on SGLang's tree (they run inside SGLang's own insert,
    split and delete, on its scheduler thread) from now on."""
    from radixtop.adapters.sglang.index import INDEX, install

    index = getattr(tree.cache, INDEX, None) or install(tree.cache)
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for name in ("split", "added", "removed"):
        hook = getattr(index, name)

        def timed(*args: Any, _hook: Any = hook, _spent: list[tuple[float, float]] = calls[name]) -> Any:
            c0, t0 = thread_time(), pc()
            try:
                return _hook(*args)
            finally:
                _spent.append((thread_time() - c0, pc() - t0))

        setattr(index, name, timed)
    return calls


def report_hooks(calls: dict[str, list[tuple[float, float]]], label: str) -> None:
    """Per hook: calls, CPU seconds, calls over 1 ms of CPU, the longest (CPU ms, wall ms)."""
    for name, spent in sorted(calls.items()):
        if spent:
            longest = sorted(spent)[-3:]
            log(f"{label}: index.{name}: {len(spent):,} calls, {sum(c for c, _ in spent):.2f} s CPU, over 1 ms: "
                f"{sum(1 for c, _ in spent if c > 1e-3)}, longest (CPU ms, wall ms): "
                f"{[(round(c * 1e3, 2), round(w * 1e3, 2)) for c, w in longest]}")


def time_poll_reads(adapter: Any, top: int, repeats: int = 20) -> None:
    """Each read of a dashboard's poll (its ``read_many`` batch: stats, changes, sessions, the
    selected node, pages of children), as the plugin runs it on the owner, chunk by chunk."""
    from radixtop.adapters.model import ROOT_ID
    from radixtop.adapters.owned.reads import finished
    from radixtop.gpu_backend.owner.slices import run_to_end
    from radixtop.inspector.poller import SESSIONS_LOADED

    root_page = finished(run_to_end(adapter._read_pass((), "children", (ROOT_ID, 0, 100, "bytes"))))
    first = root_page.children[0].id if root_page.children else ROOT_ID
    reads = [("stats", ()), ("changes", (0,)), ("sessions", ("exclusive_bytes", 0, SESSIONS_LOADED, "", False)),
             ("node", (first, 0, 256)), ("children", (ROOT_ID, 0, 100, "bytes")),
             ("children", (first, 0, 100, "bytes"))]
    for op, op_args in reads:
        cpus: list[float] = []
        for _ in range(repeats):
            chunks = adapter._read_pass((), op, op_args)
            while True:
                c0 = thread_time()
                try:
                    next(chunks)
                except StopIteration:
                    cpus.append(thread_time() - c0)
                    break
                cpus.append(thread_time() - c0)
        cpus.sort()
        log(f"poll read {op}{op_args}: {len(cpus)} chunks in {repeats} reads, median {cpus[len(cpus) // 2] * 1e3:.2f} ms, "
            f"longest {cpus[-1] * 1e3:.2f} ms CPU")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unified", action="store_true", help="0.5.23 UnifiedRadixCache (Python core)")
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)

    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
    from radixtop.gpu_backend.owner.queue import OwnerQueue

    tree = Tree(args.unified, capacity=args.nodes * 40)
    hooks = time_index_hooks(tree)
    grown = grow(tree, args.nodes)
    log(f"grew {grown['nodes']:,} nodes, {grown['sessions']:,} sessions in {grown['build_s']:.0f} s")
    report_hooks(hooks, "the index's hooks while the tree grew (GC off)")
    history = grown["history"]
    adapter = SGLangInProcessAdapter(tree.cache, OwnerQueue("profile"), model="profile", open_sessions=lambda: history,
                            timeout=60.0)
    orders = adapter._orders
    if orders is None:
        raise SystemExit("this tree keeps no session figures (no sessions, or the hooks did not install)")
    adapter._known_now()
    profile(orders.page_pass("exclusive_bytes", 0, 100), "first page of a kept order (the attach: it is made)",
            args.top)
    profile(orders.page_pass("exclusive_bytes", 0, 100), "next page of the kept order", args.top)
    profile(orders.page_pass("fair_share_bytes", 0, 100), "a page ranked at its read (fair share)", args.top)
    time_poll_reads(adapter, args.top)
    adapter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
