"""What keeping every session's figures with the tree costs the bundled cache, and what a read of
them costs, at 1M nodes and 50k sessions: the same tree built twice in one process, with the
ledger (``gpu_backend.ledger``) and without it, then the same ops on both, side by side.

    .venv/bin/python benchmarks/bench_ledger.py           # 1M nodes, 50k sessions (~6 min)
    .venv/bin/python benchmarks/bench_ledger.py --quick   # 100k nodes, 5k sessions

Both trees come from ``_common.build_tree`` (the same seed: the same nodes and ids), on a
``Scheduler`` over a ``meta`` pool. Then rounds of ops go to both in turn (which one goes first
alternates every round, so a noisy neighbour slows both), each op timed between two
``perf_counter`` reads, the cyclic GC off (collected between rounds, untimed):

* ``begin``: a session's next turn matched and locked (``Scheduler.begin``: match_prefix,
  inc_lock_ref, alloc; a split where the turn diverges inside a node);
* ``finish``: its insert, the session's tag and the unlock (``Scheduler.finish``);
* ``evict``: 256 tokens evicted (``Scheduler.evict``: LRU leaves, their holders dropped);
* ``close``: an open session closed (``Scheduler.close_session``: its holds dropped, its
  exclusive nodes freed).

The ratio of each op's total time with the ledger to without is the upkeep's cost (goal: at most
1.25x). The fair-share and locked orders (``ledger.paths.PathSums``) are read once before the
rounds, so their upkeep runs in every op with the ledger, as with a dashboard sorted by them.
Then, on the tree with the ledger, reads as an operator's dashboard makes them after each round
of changes: the top 50 sessions by exclusive bytes (``SessionOrders.page_pass``), by fair share
and by locked tokens (each pass's longest step timed), one session's row, and every kept figure
and the first 50 of each order either way checked against a from-scratch attribution at the end.
Writes ``benchmarks/results/ledger.json``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import TreeConfig, build_tree, environment, finish, log, ms_stats, rss_mib, stepped  # noqa: E402

from radixtop.gpu_backend.owner.slices import run_to_end  # noqa: E402

pc = time.perf_counter
OPS = ("begin", "finish", "evict", "close")

FULL = TreeConfig(label="1M", target_nodes=1_000_000, sessions=50_000, closed_sessions=100, running_requests=16,
                  extra_capacity=4_000_000)
QUICK = replace(FULL, label="100k", target_nodes=100_000, sessions=5_000, extra_capacity=400_000)


def run_round(s, rng: random.Random, sids: list[str], histories: dict[str, list[int]], times: dict[str, list[float]],
              turns: int, evicts: int, closes: int, round_no: int, closed: set[str]) -> None:
    """One round of ops on ``s``; ``rng`` seeded the same for both trees, so both get the same ops."""
    for k in range(turns):
        sid = sids[rng.randrange(len(sids))]
        if sid in closed:
            continue
        history = histories[sid]
        # mostly a next turn; sometimes a regenerated answer (diverges inside the last node: a split)
        cut = len(history) - rng.randint(1, 8) if rng.random() < 0.2 and len(history) > 16 else len(history)
        prompt = history[:cut] + [rng.randrange(1, 128_000) for _ in range(rng.randint(8, 64))]
        output = [rng.randrange(1, 128_000) for _ in range(rng.randint(8, 64))]
        rid = f"b{round_no}-{k}"
        t0 = pc()
        s.begin(rid, prompt, sid)
        t1 = pc()
        s.finish(rid, output)
        t2 = pc()
        times["begin"].append(t1 - t0)
        times["finish"].append(t2 - t1)
        histories[sid] = prompt + output
    for _ in range(evicts):
        t0 = pc()
        s.evict(256)
        times["evict"].append(pc() - t0)
    for _ in range(closes):
        sid = sids[rng.randrange(len(sids))]
        if sid in closed:
            continue
        t0 = pc()
        s.close_session(sid)
        times["close"].append(pc() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--closes", type=int, default=20, help="sessions closed a round (more: a steadier close ratio)")
    ap.add_argument("--no-path-orders", action="store_true",
                    help="never read the fair-share and locked orders (their upkeep then never runs)")
    ap.add_argument("--no-marks", action="store_true",
                    help="the ledger tells the history no marks (each session's figures before they move: the "
                         "sessions' memory at a past moment): what the marks cost, against a run with them")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "ledger.json")
    args = ap.parse_args()
    cfg = QUICK if args.quick else FULL
    built = {}
    for kept in (True, False):
        log(f"building {cfg.label} ({cfg.sessions:,} sessions), ledger {'on' if kept else 'off'} ...")
        built[kept] = build_tree(replace(cfg, ledger=kept), with_facts=False)
        log(f"  {built[kept].scheduler.cache.node_count():,} nodes in {built[kept].build_s:.0f} s; rss {rss_mib():,.0f} MiB")
    on, off = built[True].scheduler, built[False].scheduler
    if args.no_marks:
        on.cache.ledger.journal = None
    marks_before = on.cache.history.marked_count if on.cache.history is not None else 0
    assert on.cache.node_count() == off.cache.node_count()
    sids = sorted(sid for sid in on.session_activity if not on.cache.is_session_closed(sid))
    # each session's history: its tagged path's tokens (the same on both trees)
    histories = {sid: on.cache.path_tokens(max(on.cache._session_leaves[sid], key=lambda n: n.id))
                 for sid in sids if on.cache._session_leaves.get(sid)}
    sids = sorted(histories)
    times: dict[bool, dict[str, list[float]]] = {k: {op: [] for op in OPS} for k in built}
    histories_of = {k: {sid: list(h) for sid, h in histories.items()} for k in built}
    closed: dict[bool, set[str]] = {k: set() for k in built}
    reads: dict[str, list[float]] = {"top50_exclusive": [], "session_row": [], "top50_fair_share": [],
                                     "top50_locked": []}
    steps: dict[str, list[float]] = {"top50_fair_share": [], "top50_locked": []}
    gc.collect()
    gc.disable()
    # the path orders made once before the rounds (so their upkeep runs in every round's ops)
    path_orders = () if args.no_path_orders else ("fair_share_bytes", "locked_tokens")
    first = {order: stepped(on.orders.page_pass(order, 0, 50)) for order in path_orders}
    try:
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for kept in order:
                s = built[kept].scheduler
                before = {sid for sid in sids if s.cache.is_session_closed(sid)}
                run_round(s, random.Random(1000 + r), sids, histories_of[kept], times[kept],
                          turns=400, evicts=50, closes=args.closes, round_no=r, closed=closed[kept])
                closed[kept] |= {sid for sid in sids if s.cache.is_session_closed(sid)} - before
            t0 = pc()
            rows, total, _, _ = run_to_end(on.orders.page_pass("exclusive_bytes", 0, 50))
            reads["top50_exclusive"].append(pc() - t0)
            t0 = pc()
            on.orders.row(rows[0][0])
            reads["session_row"].append(pc() - t0)
            for name, order in (("top50_fair_share", "fair_share_bytes"), ("top50_locked", "locked_tokens")):
                if order not in path_orders:
                    continue
                t0 = pc()
                _, longest = stepped(on.orders.page_pass(order, 0, 50))
                reads[name].append(pc() - t0)
                steps[name].append(longest)
            gc.enable()
            gc.collect()
            gc.disable()
            log(f"round {r + 1}/{args.rounds}: {len(times[True]['begin'])} turns each; top session "
                f"{rows[0][0]} {rows[0][3] / 2**20:.1f} MiB exclusive of {total:,} listed")
    finally:
        gc.enable()
    # the kept figures against the from-scratch attribution, once, at the end
    from radixtop.adapters.owned.attribution import attribute

    cache = on.cache
    t0 = pc()
    want = attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids, on.session_activity,
                     on.session_activity, on.orders.bpt, True)
    oracle_s = pc() - t0
    wrong = [sid for sid, row in want.sessions.items() if on.orders.row(sid)[:7] != row[:7]]
    pages_wrong = [order for order in ("fair_share_bytes", "locked_tokens", "exclusive_bytes")
                   for reverse in (False, True)
                   if run_to_end(on.orders.page_pass(order, 0, 50, reverse=reverse))[:2]
                   != want.page(order, 0, 50, reverse=reverse)]
    # a page far down the fair-share order and a filtered one: walked on the tree, in steps
    far: dict[str, dict[str, Any]] = {}
    for name, offset, needle in (("offset 10,000", 10_000, ""), ('contains "u012"', 0, "u012")):
        (work, page), longest = stepped(on.orders.page_pass("fair_share_bytes", offset, 50, needle))
        far[name] = {"work_ms": work * 1e3, "longest_step_ms": longest * 1e3, "rows": len(page[0]),
                     "exact": page[:2] == want.page("fair_share_bytes", offset, 50, needle), "age_s": page[3]}
        if not far[name]["exact"]:
            pages_wrong.append(f"fair_share_bytes {name}")
    results: dict[str, Any] = {"environment": environment(), "tree": cfg.label, "nodes": cache.node_count(),
                               "sessions_listed": len(want.sessions), "rounds": args.rounds,
                               "oracle_pass_s": oracle_s, "marks": not args.no_marks,
                               "marks_told": (cache.history.marked_count if cache.history is not None else 0)
                               - marks_before, "rows_differing_from_oracle": len(wrong), "ops": {},
                               "reads": {k: ms_stats(v) for k, v in reads.items() if v},
                               "path_orders_read": list(path_orders),
                               "read_longest_step_ms": {k: max(v) * 1e3 for k, v in steps.items() if v},
                               "first_path_reads": {k: {"work_s": v[0][0], "longest_step_ms": v[1] * 1e3}
                                                    for k, v in first.items()},
                               "far_pages_fair_share": far,
                               "pages_differing_from_oracle": pages_wrong}
    lines = ["| op | n | without ledger: total ms | with ledger: total ms | ratio | median µs without / with | "
             "p99 µs without / with | longest ms without / with |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for op in OPS:
        a, b = sum(times[True][op]), sum(times[False][op])
        ratio = a / b if b else None
        w, o = ms_stats(times[True][op], 99), ms_stats(times[False][op], 99)
        results["ops"][op] = {"n": len(times[True][op]), "with_s": a, "without_s": b, "ratio": ratio,
                              "with_ms": w, "without_ms": o}
        lines.append(f"| {op} | {len(times[True][op]):,} | {b * 1e3:,.1f} | {a * 1e3:,.1f} | {ratio:.2f}x | "
                     f"{o['median'] * 1e3:.0f} / {w['median'] * 1e3:.0f} | {o['p99'] * 1e3:.0f} / {w['p99'] * 1e3:.0f} | "
                     f"{o['max']:.2f} / {w['max']:.2f} |")
    allw = sum(sum(v) for v in times[True].values())
    allo = sum(sum(v) for v in times[False].values())
    results["all_ops_ratio"] = allw / allo
    lines.append(f"| all | | {allo * 1e3:,.1f} | {allw * 1e3:,.1f} | {allw / allo:.2f}x | |")
    r50, row = results["reads"]["top50_exclusive"], results["reads"]["session_row"]
    lines += ["", "| read (with ledger, after each round) | median ms | max ms |", "|---|---:|---:|",
              f"| top 50 sessions by exclusive bytes | {r50['median']:.2f} | {r50['max']:.2f} |",
              f"| one session's row | {row['median']:.3f} | {row['max']:.3f} |",
              *(f"| top 50 sessions by {name[6:].replace('_', ' ')} (longest step {max(steps[name]) * 1e3:.2f} ms) | "
                f"{results['reads'][name]['median']:.2f} | {results['reads'][name]['max']:.2f} |"
                for name in steps if steps[name]),
              *(f"| its first read, {order} (made: work {v[0][0] * 1e3:,.0f} ms, longest step {v[1] * 1e3:.2f} ms) | | |"
                for order, v in first.items()),
              *(f"| 50 sessions by fair share, {name} (work {v['work_ms']:,.1f} ms, longest step "
                f"{v['longest_step_ms']:.2f} ms, age {v['age_s']:g} s, exact: {v['exact']}) | | |" for name, v in far.items()),
              f"| (the from-scratch attribution pass, for comparison) | {oracle_s * 1e3:,.0f} | |"]
    finish(args.out, results, "\n".join(lines),
           f"{cache.node_count():,} nodes, {len(want.sessions):,} sessions listed; kept rows differing from "
           f"the from-scratch attribution: {len(wrong)}; pages differing from its ranking: {pages_wrong or 'none'}")


if __name__ == "__main__":
    main()
