"""Replay speed on Mooncake's conversation trace: radixtop's bundled cache against SGLang 0.5.16's
RadixCache on the same ops, side by side in one process.

Run from the repository root, with the trace (kvcache-ai/Mooncake,
``FAST25-release/traces/conversation_trace.jsonl``, 12,031 requests, 3 MB) at ``--trace``:

    .venv/bin/python benchmarks/bench_replay.py --trace conversation_trace.jsonl           # full
    .venv/bin/python benchmarks/bench_replay.py --trace conversation_trace.jsonl --quick   # < 1 min

The trace becomes radixtop ops once (``gpu_backend.traces.formats``: each hash id a fixed run of
tokens, a ``request`` op per request, a ``close`` after each inferred session's last request); the
full run keeps the trace's real lengths (``--scale 1``: 145M prompt tokens), ``--quick`` takes the
first 2,000 requests at scale 8. Each op goes to both sides in turn (which side goes first
alternates every 500 ops, so a noisy neighbour slows both):

* radixtop: ``trace.Replayer.apply`` on a ``Scheduler`` (device ``meta``: the pool's geometry,
  no tensor), i.e. what ``radixtop replay`` does per op;
* SGLang: the differential tests' ``SGLangReplayer.apply`` (``tests/on_sglang/ref/replay_sglang.py``):
  SGLang's own ``RadixCache`` with ``enable_session_radix_cache=True``, ``TokenToKVPoolAllocator``,
  ``MHATokenToKVPool`` (1 layer, 1 head, head_dim 1) and ``ReqToTokenPool``, driven as its scheduler
  does (``match_prefix``, ``inc_lock_ref``, ``alloc_token_slots``, ``cache_finished_req``,
  ``release_radix_session``).

Only ``apply`` is timed, between two ``perf_counter`` reads. Each side gets its native input, built
outside the timed span: radixtop a ``list[int]``, SGLang an ``array('q')`` (conservative for
radixtop). Both run the LRU policy on a counter clock (SGLang's ``time`` in its radix-cache module is
the tests' ``TickClock``), so evictions happen in the same order, and the hit of every request is
compared: the ``hits agree`` column. The cyclic GC is off while ops run (collected between chunks,
untimed), for both. Writes ``benchmarks/results/replay.json``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
from array import array
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import environment, finish, log  # noqa: E402

from radixtop.gpu_backend.kv_geometry import get_geometry  # noqa: E402
from radixtop.gpu_backend.scheduler import Scheduler  # noqa: E402
from radixtop.gpu_backend.traces.formats import read_mooncake, timed_ops
from radixtop.gpu_backend.traces.ops import Replayer

pc = time.perf_counter
CHUNK = 500


def sglang_side(capacity: int, longest: int):
    from tests.on_sglang.ref.replay_sglang import SGLangReplayer, TickClock, import_sglang

    sgl = import_sglang()
    sgl.radix_cache_module.time = TickClock()  # deterministic stamps (never restored: one run a process)
    replayer = SGLangReplayer(sgl, capacity, eviction_policy="lru", max_running=4, max_context_len=longest)
    return sgl, replayer


def run(trace_path: Path, requests: int | None, scale: int, capacity: int) -> dict[str, Any]:
    lines = trace_path.read_bytes().splitlines()
    if requests is not None:
        lines = lines[:requests]
    t0 = pc()
    trace = read_mooncake(lines)
    read_s = pc() - t0
    longest = max(-(-r.input_length // scale) + -(-r.output_length // scale) for r in trace.requests) + 1
    log(f"{len(trace.requests):,} requests, {trace.sessions:,} sessions, read in {read_s:.2f} s; "
        f"scale {scale}, capacity {capacity:,} tokens; importing sglang...")
    sgl, sgl_replayer = sglang_side(capacity, longest)
    version = getattr(sys.modules.get("sglang"), "__version__", "unknown")
    counter = itertools.count(1)
    scheduler = Scheduler(get_geometry("tiny"), capacity, device="meta", eviction_policy="lru",
                          clock=lambda: float(next(counter)))
    rt_replayer = Replayer(scheduler)
    side_s = {"radixtop": 0.0, "sglang": 0.0}
    ops = tokens = mismatches = 0
    convert_s = 0.0
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        t0 = pc()
        stream = timed_ops(trace, scale)
        while True:
            t_conv = pc()
            timed = next(stream, None)
            if timed is None:
                break
            op = timed.op
            doc = {"op": op.op, **op.fields}
            for key in ("input", "output"):
                if key in doc:
                    doc[key] = array("q", doc[key])
            convert_s += pc() - t_conv
            first_rt = (ops // CHUNK) % 2 == 0
            for side in (("radixtop", "sglang") if first_rt else ("sglang", "radixtop")):
                if side == "radixtop":
                    start = pc()
                    rt_result = rt_replayer.apply(op)
                    side_s["radixtop"] += pc() - start
                else:
                    start = pc()
                    sgl_result = sgl_replayer.apply(op.line_no, doc)
                    side_s["sglang"] += pc() - start
            if rt_result.get("hit") != sgl_result.get("hit"):
                mismatches += 1
            ops += 1
            tokens += len(op.fields.get("input", ())) + len(op.fields.get("output", ()))
            rt_replayer.results.clear()
            sgl_replayer.results.clear()
            if ops % CHUNK == 0:
                gc.collect()
                if ops % (CHUNK * 10) == 0:
                    log(f"{ops:,} ops; radixtop {side_s['radixtop']:.1f} s, sglang {side_s['sglang']:.1f} s")
        total_s = pc() - t0
    finally:
        gc.enable()
        gc.unfreeze()
    return {
        "trace": str(trace_path.name), "requests": len(trace.requests), "sessions": trace.sessions,
        "scale": scale, "capacity": capacity, "ops": ops, "tokens": tokens, "read_s": read_s,
        "convert_s": convert_s, "wall_s": total_s, "sglang_version": version,
        "radixtop_s": side_s["radixtop"], "sglang_s": side_s["sglang"], "hit_mismatches": mismatches,
        "cached_tokens": scheduler.cached_tokens, "prompt_tokens": scheduler.prompt_tokens,
        "evicted_tokens": scheduler.evicted_tokens,
    }


def report(r: dict[str, Any]) -> str:
    rows = ["| side | seconds applying ops | ops/s | tokens/s |", "|---|---:|---:|---:|"]
    for side in ("radixtop", "sglang"):
        s = r[f"{side}_s"]
        rows.append(f"| {side if side == 'radixtop' else 'SGLang ' + r['sglang_version']} | {s:.2f} | "
                    f"{r['ops'] / s:,.0f} | {r['tokens'] / s:,.0f} |")
    ratio = r["sglang_s"] / r["radixtop_s"]
    hit = r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0
    return "\n".join([
        f"Mooncake {r['trace']}: {r['requests']:,} requests, {r['sessions']:,} sessions, scale {r['scale']}, "
        f"capacity {r['capacity']:,} tokens; {r['ops']:,} ops, {r['tokens']:,} tokens "
        f"(hit rate {hit:.1%}, {r['evicted_tokens']:,} tokens evicted)",
        "",
        *rows,
        "",
        f"radixtop / SGLang speed: **{ratio:.2f}x**; hits agree on every op: "
        f"{'yes' if r['hit_mismatches'] == 0 else 'NO (' + str(r['hit_mismatches']) + ' differ)'}; "
        f"turning the trace into ops (untimed above): {r['convert_s']:.1f} s",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="Mooncake's conversation_trace.jsonl")
    ap.add_argument("--quick", action="store_true", help="the first 2,000 requests at scale 8")
    ap.add_argument("--scale", type=int, default=None, help="default 1 (full), 8 (quick)")
    ap.add_argument("--capacity", type=int, default=None,
                    help="pool tokens; default 2,097,152 (full), 131,072 (quick): both evict")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "replay.json")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        print(f"bench_replay: no trace at {args.trace}; get it with: curl -LO https://raw.githubusercontent.com/"
              "kvcache-ai/Mooncake/main/FAST25-release/traces/conversation_trace.jsonl", file=sys.stderr)
        return 2
    scale = args.scale or (8 if args.quick else 1)
    capacity = args.capacity or (131_072 if args.quick else 2_097_152)
    result = run(args.trace, 2000 if args.quick else None, scale, capacity)
    result["mode"] = "quick" if args.quick else "full"
    results = {"environment": environment(timing="perf_counter around each apply; GC off while ops run"),
               "replay": result}
    finish(args.out, results, report(result),
           "radixtop / SGLang speed is SGLang's seconds over radixtop's (above 1: radixtop is faster).")
    return 0 if result["hit_mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
