"""The flight recorder's cost (issue 29, ``gpu_backend.history``): per million changes, and on the
owner thread of a busy bundled engine.

1. **Per million removals**: ``CacheHistory.removed`` called 1,000,000 times with keys of
   ``--key-tokens`` tokens (a tuple each, as the bundled cache's keys), timed with the GC off at
   the default bounds (64 MiB: the oldest dropped as it goes); the memory each kept one holds
   (``tracemalloc``, all 1M kept), and one ``explain`` of a 4,096-token prompt over them.
2. **Per million stores** (``stored``: a node's id, its parent's, its tokens, when; a removal
   appends the same to the journal of changes): the time each and the memory each kept; and the
   tree at a past moment (``then``) over a full journal of changes (``MOST_STORES``, a tenth of
   them removals): the owner thread's part in slices (the longest one), and the rest off it.
3. **Per million marks** (``moving``: a session's figures before they move, what the sessions'
   memory at a past moment is told from): the time each, the memory each kept, and a read of the
   sessions' memory then over a full journal of marks (``MOST_MARKS``) and 50,000 sessions: the
   owner thread's part in slices (the longest one), and the rest off it.
4. **On the owner thread**: a generated multi-session trace on a tight pool (every allocation
   evicts) replayed on four bundled ``Scheduler``s side by side: one keeping its history, one
   not (``history=False``), one keeping it without its journal of changes (what ``then`` adds),
   one without the sessions' marks (what the sessions' memory then adds); in rotating chunks so a
   noisy neighbour slows all; the ratios of their ``apply`` time, and the removals the history took.

    .venv/bin/python benchmarks/bench_history.py            # about a minute
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
PROMPT, OUTPUT = 800, 200
"""A request's tokens in the reads at the bounds: its prompt, its output."""
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import environment, finish, log, stepped  # noqa: E402

from radixtop.gpu_backend.history import CacheHistory  # noqa: E402
from radixtop.gpu_backend.kv_geometry import get_geometry  # noqa: E402
from radixtop.gpu_backend.scheduler import Scheduler  # noqa: E402
from radixtop.gpu_backend.traces.ops import Replayer, read_trace  # noqa: E402
from tests.support.trace_gen import capacity_for, generate_trace  # noqa: E402

pc = time.perf_counter


def per_million(n: int, key_tokens: int) -> dict:
    rng = random.Random(1)
    keys = [tuple(rng.randrange(1, 50_000) for _ in range(key_tokens)) for _ in range(1024)]
    history = CacheHistory()
    gc.disable()
    started = pc()
    for i in range(n):
        history.removed(i + 1, i // 4, keys[i & 1023], None)
    took = pc() - started
    gc.enable()
    tracemalloc.start()
    kept = CacheHistory(most_bytes=1 << 40)  # (every one kept: what each costs)
    for i in range(n):
        kept.removed(i + 1, i // 4, keys[i & 1023], None)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    prompt = [t for k in keys[:512] for t in k][:4096]
    started = pc()
    kept.explain(prompt, [(0, 0)], 0)
    explain_s = pc() - started
    return {"removals": n, "key_tokens": key_tokens, "us_per_removal": took / n * 1e6, "seconds": took,
            "kept_at_default_bounds": len(history),
            "kept": len(kept), "kept_tokens": kept.tokens, "mib_kept": held / (1 << 20),
            "bytes_per_removal": held / max(1, len(kept)), "explain_ms": explain_s * 1e3}


def reads_at_the_bounds(n: int) -> dict:
    """The owner thread's part of the reads at full bounds (the removals at 64 MiB, the requests at
    ``MOST_SERVED``): a session's ``why`` (two list copies) and a page of the journal; and the
    whole session view, off the owner thread; and what a request told costs."""
    from radixtop.adapters.owned.why import journal_read, session_story, session_why_view
    from radixtop.gpu_backend.history import MOST_SERVED

    rng = random.Random(2)
    keys = [tuple(rng.randrange(1, 50_000) for _ in range(8)) for _ in range(1024)]
    history = CacheHistory()
    history.tells_requests()
    for i in range(n):
        history.removed(i + 1, i // 4, keys[i & 1023], (f"s{i % 5000}",))
    prompt, output = [rng.randrange(1, 150_000) for _ in range(PROMPT)], [rng.randrange(1, 150_000) for _ in range(OUTPUT)]
    gc.disable()
    started = pc()
    for i in range(n // 2):  # (the lists' copies alone: the engine's, not the history's)
        list(prompt), list(output), f"s{i % 5000}", f"r{i}"
    copies_us = (pc() - started) / (n // 2) * 1e6
    started = pc()
    for i in range(n // 2):  # a request: its begin (its prompt, as the engine tells it: its own list) and its finish
        history.served(f"s{i % 5000}", PROMPT, 700, f"r{i}", list(prompt))
        history.did("finish", f"s{i % 5000}", f"r{i}", list(output))
    told_us = (pc() - started) / (n // 2) * 1e6 - copies_us
    gc.enable()
    tracemalloc.start()
    served = CacheHistory()
    served.tells_requests()
    for i in range(MOST_SERVED // 2):  # (each its own list of its own ints, as a request's from JSON)
        served.served(f"s{i % 5000}", PROMPT, 700, f"r{i}", [t + 0 for t in prompt])
        served.did("finish", f"s{i % 5000}", f"r{i}", [t + 0 for t in output])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    best = {"story_copy_ms": 1e9, "story_slice_ms": 1e9, "story_view_ms": 1e9, "page_ms": 1e9}
    for _ in range(5):
        longest, story_pass = 0.0, session_story(history)
        started = pc()
        try:
            while True:  # each slice one hold of the owner thread
                began = pc()
                next(story_pass)
                longest = max(longest, pc() - began)
        except StopIteration as done:
            longest = max(longest, pc() - began)
            story = done.value
        copied = pc()
        best["story_slice_ms"] = min(best["story_slice_ms"], longest * 1e3)
        session_why_view("s7", *story)
        viewed = pc()
        journal_read(history, history.removed_count // 2, history.served_count // 2, 2000)
        paged = pc()
        best["story_copy_ms"] = min(best["story_copy_ms"], (copied - started) * 1e3)
        best["story_view_ms"] = min(best["story_view_ms"], (viewed - copied) * 1e3)
        best["page_ms"] = min(best["page_ms"], (paged - viewed) * 1e3)
    return {"kept_removals": len(history), "kept_ops": len(history._served), "us_per_request_told": told_us,
            "prompt_tokens": PROMPT, "output_tokens": OUTPUT, "kept_tokens": served.served_tokens,
            "mib_ops_kept": held / (1 << 20), **best}


def stores_and_then(n: int) -> dict:
    from radixtop.adapters.owned.why import then_pass, then_view
    from radixtop.gpu_backend.history import MOST_STORES, ROOT

    history = CacheHistory()
    gc.disable()
    started = pc()
    for i in range(n):
        history.stored(i + 1, ROOT if i < 64 else i // 4, 8)
    took = pc() - started
    gc.enable()
    tracemalloc.start()
    kept = CacheHistory()
    for i in range(min(n, MOST_STORES)):
        kept.stored(i + 1, ROOT if i < 64 else i // 4, 8)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # a full journal: stores, then a tenth of them removed, the leaves first
    rng = random.Random(3)
    keys = [tuple(rng.randrange(1, 50_000) for _ in range(8)) for _ in range(1024)]
    full = CacheHistory()
    stores = MOST_STORES * 9 // 10
    for i in range(stores // 2):
        full.stored(i + 1, ROOT if i < 64 else i // 4, 8)
    at = full.clock()  # (the moment asked for: half the stores before it; the removals all after)
    for i in range(stores // 2, stores):
        full.stored(i + 1, ROOT if i < 64 else i // 4, 8)
    for i in range(stores // 2, stores // 2 - MOST_STORES // 10, -1):  # (the deepest first: leaves then)
        full.removed(i, ROOT if i <= 64 else (i - 1) // 4, keys[i & 1023], None)
    best = {"then_owner_ms": 1e9, "then_slice_ms": 1e9, "then_view_ms": 1e9}
    for _ in range(3):
        (owner, read), longest = stepped(then_pass(full, at, lambda: 0))
        began = pc()
        view = then_view(read)
        best["then_view_ms"] = min(best["then_view_ms"], (pc() - began) * 1e3)
        best["then_owner_ms"] = min(best["then_owner_ms"], owner * 1e3)
        best["then_slice_ms"] = min(best["then_slice_ms"], longest * 1e3)
    return {"stores": n, "us_per_store": took / n * 1e6, "bytes_per_store_kept": held / min(n, MOST_STORES),
            "then_changes": full.stored_count, "then_left": view.left_nodes, "then_stored": view.stored_nodes, **best}


def marks_and_memory_then(n: int, sessions: int = 50_000) -> dict:
    """The sessions' memory at a past moment: what a mark told costs (``moving``: a session's
    figures before they move), the memory each kept, and a read of the sessions' memory then over a
    full journal of marks (``MOST_MARKS``) of ``sessions`` sessions with a ledger's maps of as many:
    the owner thread's part in slices (the longest one), and the rest off it."""
    from types import SimpleNamespace

    from radixtop.adapters.owned.why import memory_pass, memory_start, memory_then
    from radixtop.gpu_backend.history import MOST_MARKS

    sids = [f"s{i}" for i in range(sessions)]
    history = CacheHistory()
    history.tells_figures()
    gc.disable()
    started = pc()
    for i in range(n):
        history.moving(sids[i % sessions], 3, 100, 400)
    took = pc() - started
    gc.enable()
    tracemalloc.start()
    kept = CacheHistory()
    kept.tells_figures()
    for i in range(MOST_MARKS):
        kept.moving(sids[(i * 7) % sessions], 3, 100 + i, 400)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ledger = SimpleNamespace(journal=kept, resets=0, tags=dict.fromkeys(sids, 2), exclusive=dict.fromkeys(sids, 50),
                             path={sid: 300 for sid in sids})
    best = {"memory_owner_ms": 1e9, "memory_slice_ms": 1e9, "memory_view_ms": 1e9}
    for _ in range(3):
        (owner, read), longest = stepped(memory_pass(kept, ledger, memory_start(kept, kept.marks_since)))
        began = pc()
        figures = memory_then(read)
        best["memory_view_ms"] = min(best["memory_view_ms"], (pc() - began) * 1e3)
        best["memory_owner_ms"] = min(best["memory_owner_ms"], owner * 1e3)
        best["memory_slice_ms"] = min(best["memory_slice_ms"], longest * 1e3)
    return {"marks": n, "us_per_mark": took / n * 1e6, "bytes_per_mark_kept": held / MOST_MARKS,
            "memory_marks": kept.marked_count, "memory_sessions": len(figures), **best}


def on_the_owner(seeds: int, ops: int) -> dict:
    """Four schedulers side by side: without the history, with it but without its journal of
    changes (``_store`` stubbed: the removals and requests only), with it but without the
    sessions' marks (the ledger tells it none), and with all of it."""
    sides_of = ("without", "no_changes", "no_marks", "with")
    times = dict.fromkeys(sides_of, 0.0)
    removals = ops_done = marks = 0
    for seed in range(seeds):
        lines = generate_trace(seed, n_ops=ops, max_in_flight=8, vocab=2000)
        trace = list(read_trace(lines))
        cap = capacity_for(lines, "small")
        sides = {}
        for side in sides_of:
            s = Scheduler(get_geometry("tiny"), cap, device="cpu", write_kv=False, history=side != "without")
            if side == "no_changes":
                s.cache.history._store = lambda *a: None  # type: ignore[method-assign]
            if side == "no_marks":
                s.cache.ledger.journal = None
            sides[side] = Replayer(s)
        gc.disable()
        order = list(sides_of)
        for start in range(0, len(trace), 200):
            chunk = trace[start : start + 200]
            order = order[1:] + order[:1]  # (each first in turn)
            for side in order:
                replayer = sides[side]
                began = pc()
                for op in chunk:
                    replayer.apply(op)
                times[side] += pc() - began
            gc.collect()
        gc.enable()
        removals += sides["with"].scheduler.cache.history.removed_count
        marks += sides["with"].scheduler.cache.history.marked_count
        ops_done += len(trace)
    return {"ops": ops_done, "removals": removals, "with_s": times["with"], "without_s": times["without"],
            "no_changes_s": times["no_changes"], "ratio": times["with"] / times["without"],
            "changes_ratio": times["with"] / times["no_changes"], "marks": marks, "no_marks_s": times["no_marks"],
            "marks_ratio": times["with"] / times["no_marks"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--removals", type=int, default=1_000_000)
    ap.add_argument("--key-tokens", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "history.json")
    args = ap.parse_args()
    log(f"{args.removals:,} removals of {args.key_tokens}-token keys")
    micro = per_million(args.removals, args.key_tokens)
    log(f"  {micro['us_per_removal']:.2f} us a removal; {micro['mib_kept']:.1f} MiB for {micro['kept']:,} kept "
        f"({micro['bytes_per_removal']:.0f} B each); explain of a 4,096-token prompt {micro['explain_ms']:.2f} ms")
    reads = reads_at_the_bounds(args.removals)
    log(f"  a request told ({reads['prompt_tokens']}-token prompt, {reads['output_tokens']}-token output: its begin "
        f"and finish with their tokens) {reads['us_per_request_told']:.2f} us; {reads['mib_ops_kept']:.1f} MiB at the "
        f"ops' bounds ({reads['kept_tokens']:,} tokens kept); at the "
        f"bounds ({reads['kept_removals']:,} removals, {reads['kept_ops']:,} ops kept): a session's why "
        f"{reads['story_copy_ms']:.2f} ms on the owner thread in slices of at most {reads['story_slice_ms']:.2f} ms, "
        f"then {reads['story_view_ms']:.1f} ms off it; a page "
        f"of the journal {reads['page_ms']:.2f} ms")
    stores = stores_and_then(args.removals)
    log(f"  a store told {stores['us_per_store']:.2f} us, {stores['bytes_per_store_kept']:.0f} B kept; the tree then "
        f"over {stores['then_changes']:,} changes: {stores['then_owner_ms']:.2f} ms on the owner thread in slices of "
        f"at most {stores['then_slice_ms']:.2f} ms, then {stores['then_view_ms']:.0f} ms off it")
    marked = marks_and_memory_then(args.removals)
    log(f"  a mark told {marked['us_per_mark']:.2f} us, {marked['bytes_per_mark_kept']:.0f} B kept; the sessions' "
        f"memory then over {marked['memory_marks']:,} marks of {marked['memory_sessions']:,} sessions: "
        f"{marked['memory_owner_ms']:.2f} ms on the owner thread in slices of at most {marked['memory_slice_ms']:.2f} "
        f"ms, then {marked['memory_view_ms']:.0f} ms off it")
    rounds = []
    for r in range(args.rounds):
        one = on_the_owner(args.seeds, args.ops)
        log(f"  round {r + 1}: {one['ops']:,} ops, {one['removals']:,} removals: with {one['with_s']:.2f} s, "
            f"without {one['without_s']:.2f} s: {one['ratio']:.3f}x; the journal of changes "
            f"{one['changes_ratio']:.3f}x of the rest; the sessions' marks ({one['marks']:,}) "
            f"{one['marks_ratio']:.3f}x of the rest")
        rounds.append(one)
    ratio = statistics.median(r["ratio"] for r in rounds)
    table = "\n".join([
        "| per 1M removals | us each | MiB kept (B each) | explain, 4,096 tokens |",
        "|---|---:|---:|---:|",
        f"| {micro['key_tokens']}-token keys | {micro['us_per_removal']:.2f} | {micro['mib_kept']:.1f} "
        f"({micro['bytes_per_removal']:.0f}) | {micro['explain_ms']:.2f} ms |",
        "",
        f"| a request told, {reads['prompt_tokens']}+{reads['output_tokens']} tokens (us) | MiB at the ops' bounds | "
        "kept at the bounds | a session's why: owner thread (ms) | "
        "its longest slice (ms) | then off it (ms) | a journal page of 2,000 (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {reads['us_per_request_told']:.2f} | {reads['mib_ops_kept']:.1f} | "
        f"{reads['kept_removals']:,} removals, {reads['kept_ops']:,} ops | {reads['story_copy_ms']:.2f} | "
        f"{reads['story_slice_ms']:.2f} | {reads['story_view_ms']:.1f} | {reads['page_ms']:.2f} |",
        "",
        "| a store told (us) | B kept each | the tree then over a full journal: changes | owner thread (ms) | "
        "its longest slice (ms) | then off it (ms) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {stores['us_per_store']:.2f} | {stores['bytes_per_store_kept']:.0f} | {stores['then_changes']:,} "
        f"({stores['then_left']:,} left, {stores['then_stored']:,} stored since) | {stores['then_owner_ms']:.2f} | "
        f"{stores['then_slice_ms']:.2f} | {stores['then_view_ms']:.0f} |",
        "",
        "| a mark told (us) | B kept each | the sessions' memory then over a full journal: marks | owner thread (ms) | "
        "its longest slice (ms) | then off it (ms) |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {marked['us_per_mark']:.2f} | {marked['bytes_per_mark_kept']:.0f} | {marked['memory_marks']:,} "
        f"({marked['memory_sessions']:,} sessions) | {marked['memory_owner_ms']:.2f} | "
        f"{marked['memory_slice_ms']:.2f} | {marked['memory_view_ms']:.0f} |",
        "",
        "| owner thread, tight pool | ops | removals | with history (s) | without (s) | ratio | "
        "without its journal of changes (s) | the journal's share | marks | without the marks (s) | the marks' share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| round {i + 1} | {r['ops']:,} | {r['removals']:,} | {r['with_s']:.2f} | {r['without_s']:.2f} | "
          f"{r['ratio']:.3f}x | {r['no_changes_s']:.2f} | {r['changes_ratio']:.3f}x | {r['marks']:,} | "
          f"{r['no_marks_s']:.2f} | {r['marks_ratio']:.3f}x |" for i, r in enumerate(rounds)),
    ])
    finish(args.out, {"environment": environment(), "per_million": micro, "reads": reads, "stores": stores,
                      "marks": marked,
                      "rounds": rounds,
                      "median_ratio": ratio},
           table, f"median ratio with/without the history: {ratio:.3f}x")


if __name__ == "__main__":
    main()
