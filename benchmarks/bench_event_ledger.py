"""What keeping every session's figures costs a tree kept from KV events (``BlockTree`` with its
``BlockLedger``), and what a sessions read costs with it against the attribution pass it replaced.

    .venv/bin/python benchmarks/bench_event_ledger.py           # 50k sessions, 400k events (~3 min)
    .venv/bin/python benchmarks/bench_event_ledger.py --quick   # 5k sessions, 40k events

The events are a server's under multi-turn chat at page size 16, as SGLang 0.5.19+ sends them
with ``session_id``: a session's first turn stores one of 20 system prompts (4 blocks, shared:
stored again by every session that starts with it) and its first message; each later turn stores
1-8 new blocks under its last; the cache evicts (``BlockRemoved``) a session's last block now and
then. The same events go to three trees in turn, 8 events a batch (the ledger settles at the end of
each): one with the ledger and the history (the flight recorder, issue 29: each block stored and
removed, and the sessions' marks), one with a ledger that does nothing (the history kept), and one
with the ledger and no history (which goes first turns per block of 10,000 events, so a noisy
neighbour slows all three); the ratios of their times are the ledger's upkeep and the history's. Then, on the tree with the ledger: a sessions
read as the dashboard makes it (the top 50 by exclusive bytes, ``EventTreeAdapter.sessions``)
against what the read did before (``BlockTree.attribute()`` over the whole tree, then a sort), and
every session's kept figures against that from-scratch attribution.
Writes ``benchmarks/results/event_ledger.json``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import environment, finish, log, ms_stats  # noqa: E402

import radixtop.adapters.events.block_tree as block_tree  # noqa: E402
from radixtop.adapters.events.adapter import EventTreeAdapter  # noqa: E402
from radixtop.adapters.events.figures import BlockLedger  # noqa: E402
from radixtop.adapters.events.wire import Batch, Event, Removed, Stored  # noqa: E402

pc = time.perf_counter
PAGE = 16
BLOCK = 10_000
PER_BATCH = 8


class NoLedger:
    """A ledger that keeps nothing: the tree as it was before the figures were kept."""

    def __init__(self, root: Any = None) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _nothing


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def make_events(sessions: int, count: int, seed: int = 0) -> list[Event]:
    rng = random.Random(seed)
    systems = [[((1 << 40) + p * 16 + b, tuple(range(p * 1000 + b * PAGE, p * 1000 + (b + 1) * PAGE)))
                for b in range(4)] for p in range(20)]  # (a block's hash is an int on the wire: a history names it)
    last: dict[str, list[Any]] = {}
    started: list[str] = []
    events: list[Event] = []
    serial = 0
    while len(events) < count:
        sid = f"session-{rng.randrange(sessions)}"
        chain = last.get(sid)
        if chain is None:
            blocks = rng.choice(systems)
            events.append(Stored(tuple(h for h, _ in blocks), None, sum((t for _, t in blocks), ()), PAGE, "GPU",
                                 session_id=sid))
            chain = last[sid] = [blocks[-1][0]]
            started.append(sid)
        hashes = []
        for _ in range(rng.randint(1, 8)):
            serial += 1
            hashes.append(serial)
        tokens = tuple(rng.randrange(50_000) for _ in range(PAGE * len(hashes)))
        events.append(Stored(tuple(hashes), chain[-1], tokens, PAGE, "GPU", session_id=sid))
        chain.extend(hashes)
        if rng.random() < 0.3:  # the cache evicts some session's newest block
            victim = last[rng.choice(started)]
            if len(victim) > 1:
                events.append(Removed((victim.pop(),)))
    return events


def adapter_with(ledger: type, history: bool = True) -> EventTreeAdapter:
    block_tree.BlockLedger = ledger  # the tree makes its ledger at each clear (the first in the adapter)
    try:
        return EventTreeAdapter(name="bench", bytes_per_token=2,
                                no_history=None if history else "the benchmark's tree without one")
    finally:
        block_tree.BlockLedger = BlockLedger


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sessions", type=int)
    ap.add_argument("--events", type=int)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "event_ledger.json")
    args = ap.parse_args()
    sessions = args.sessions or (5_000 if args.quick else 50_000)
    count = args.events or (40_000 if args.quick else 400_000)
    log(f"making {count} events of {sessions} sessions")
    events = make_events(sessions, count)
    with_ledger, without, unrecorded = adapter_with(BlockLedger), adapter_with(NoLedger), \
        adapter_with(BlockLedger, history=False)
    assert isinstance(without._tree.ledger, NoLedger) and isinstance(with_ledger._tree.ledger, BlockLedger)
    assert with_ledger._tree.history is not None and unrecorded._tree.history is None
    arms = [("with", with_ledger), ("without", without), ("no_history", unrecorded)]
    spent = {name: 0.0 for name, _ in arms}
    gc.disable()
    try:
        for k, start in enumerate(range(0, len(events), BLOCK)):
            batch = events[start : start + BLOCK]
            for name, adapter in arms[k % 3:] + arms[:k % 3]:
                t = pc()
                for i in range(0, len(batch), PER_BATCH):  # a scheduler step's events a batch
                    adapter.apply_batch(start + i, Batch(float(k), None, batch[i : i + PER_BATCH]))
                spent[name] += pc() - t
            gc.collect()
    finally:
        gc.enable()
    tree = with_ledger._tree
    ratio = spent["with"] / spent["without"]
    history_ratio = spent["with"] / spent["no_history"]
    history = tree.history
    log(f"{len(events)} events: {spent['without']:.1f} s without the ledger, {spent['with']:.1f} s with: "
        f"{ratio:.3f}x; {len(tree.nodes) - 1} nodes, {len(tree.holding)} sessions")
    log(f"the history: {spent['no_history']:.1f} s without it, {spent['with']:.1f} s with: {history_ratio:.3f}x "
        f"({history.stored_count:,} changes, {history.removed_count:,} removals, {history.marked_count:,} marks)")

    reads, passes = [], []
    for _ in range(5):
        t = pc()
        page = with_ledger.sessions(limit=50)
        reads.append(pc() - t)
        t = pc()
        att = tree.attribute()
        top = sorted(att.sessions.items(), key=lambda r: (-r[1].exclusive, r[0]))[:50]
        passes.append(pc() - t)
    assert [v.id for v in page.sessions] == [sid for sid, _ in top]
    tree.ledger.settle()
    wrong = [sid for sid, f in att.sessions.items()
             if tree.ledger.figures(sid) != (f.tagged_nodes, f.exclusive, f.path)
             or abs(tree.ledger.shares(sid, tree.ledger.held.get(sid, ()))[0] - f.fair) > 1e-6 * max(1.0, f.fair)]
    table = "\n".join([
        "| events | sessions | nodes | apply without the ledger (s) | with (s) | ratio | sessions read, top 50 (median ms) | "
        "its first read (ms) | attribution pass + sort it replaced (median ms) | sessions differing | "
        "apply without the history (s) | the history's ratio | changes, removals, marks kept |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(events):,} | {len(tree.holding):,} | {len(tree.nodes) - 1:,} | {spent['without']:.2f} | "
        f"{spent['with']:.2f} | {ratio:.3f}x | {ms_stats(reads[1:])['median']:.2f} | {reads[0] * 1e3:.1f} | "
        f"{ms_stats(passes)['median']:.1f} | {len(wrong)} | {spent['no_history']:.2f} | {history_ratio:.3f}x | "
        f"{history.stored_count:,}, {history.removed_count:,}, {history.marked_count:,} |"])
    finish(args.out, {
        "environment": environment(), "sessions": sessions, "events": len(events), "nodes": len(tree.nodes) - 1,
        "holding": len(tree.holding), "apply_s": spent, "ratio": ratio, "history_ratio": history_ratio,
        "read_ms": [r * 1e3 for r in reads], "attribution_pass_ms": [p * 1e3 for p in passes],
        "sessions_differing": len(wrong),
    }, table, "ratio: the tree's time to apply the events with the ledger over without it; the history's "
       "ratio: with the history (and the sessions' marks) over without it, the ledger in both.")
    if wrong:
        raise SystemExit(f"{len(wrong)} sessions' kept figures differ from the from-scratch attribution")


if __name__ == "__main__":
    main()
