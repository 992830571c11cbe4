"""What the tree from the Rust core's own KV events costs SGLang's scheduler thread, four ways.

On SGLang 0.5.19+'s default Rust tree core radixtop keeps its tree from the events the core
records. This drives a real 0.5.23 ``UnifiedRadixCache`` on the Rust core request by request, as
its scheduler does (tests/on_sglang/ref/drive23.py: match, lock, allocate, insert, unlock;
evictions when the pool is full), with the hook SGLang or radixtop runs once a loop, in
alternating blocks so drift on a shared machine hits all alike (``MODES``):

* ``off``: the core as SGLang builds it (no events);
* ``sglang``: SGLang's own KV-event publisher (``--kv-events-config``, ZMQ), a subscriber in
  another process;
* ``probe``: radixtop's probe (issue 27: take, encode, one non-blocking send), radixtop's tree in
  another process (``_beside.py``);
* ``inproc``: radixtop's tree on a thread of the scheduler's process (the plugin before the split).

It reports the scheduler thread's wall time and CPU per request in each mode, their ratios to
``off`` and ``sglang``, the longest hook, and checks every tree ends equal to SGLang's cached
tokens.

    .venv-sglang23/bin/python benchmarks/bench_core_events.py            # a few minutes
    .venv-sglang23/bin/python benchmarks/bench_core_events.py --quick
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import log  # noqa: E402

from tests.on_sglang.ref import drive23  # noqa: E402
from tests.support.live_server import free_ports  # noqa: E402

HERE = Path(__file__).resolve().parent


def build(capacity: int, events: bool):
    cache, pools = drive23.build_unified_cache23(capacity, enable_session_radix_cache=False, tree_core_backend="rust",
                                                 max_context_len=8192, enable_kv_cache_events=events)
    assert cache._tree_core_backend == "rust"
    return cache, pools


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


MODES = ("off", "sglang", "probe", "inproc")
"""off: the core as SGLang builds it, no events. sglang: events on, SGLang's own publisher each
loop (``SchedulerKvEventsPublisher.publish_kv_events``: take, batch, queue; its thread encodes and
sends on ZMQ), a subscriber in another process. probe: events on, radixtop's probe each loop
(take, encode, one non-blocking send), radixtop's tree in another process. inproc: events on,
radixtop's tree on a thread of the scheduler's process (the plugin before the split)."""


class Beside:
    """radixtop's side (or SGLang's subscriber) in a process of its own (``_beside.py``)."""

    def __init__(self, how: str, where: str, fds: tuple[int, ...] = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "_beside.py"), how, where], pass_fds=fds,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"

    def ask(self, line: str) -> int:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def run_block(capacity: int, requests, mode: str) -> dict:
    cache, pools = build(capacity, mode != "off")
    step, beside, last, finish = None, None, None, None
    if mode == "inproc":
        from radixtop.adapters.events.adapter import EventTreeAdapter
        from radixtop.adapters.sglang.events.core import CoreEvents

        core = CoreEvents(cache, EventTreeAdapter(name="bench"))
        step = core.drain

        def last() -> int:
            return core._queued - 1

        def finish() -> int:
            core.tree.wait_for_seq(last(), 60)
            tokens = core.tree.stats().total_tokens
            core.close()
            return tokens
    elif mode == "probe":
        from radixtop.adapters.sglang.probe import EventsProbe
        from radixtop.gpu_backend.owner.handover import ProbeEnd, pair

        probe_sock, mirror_sock = pair()
        beside = Beside("handover", str(mirror_sock.fileno()), (mirror_sock.fileno(),))
        mirror_sock.close()
        probe = EventsProbe(cache, ProbeEnd(probe_sock))
        step = probe.step

        def last() -> int:
            return probe.events_seq  # (the frames of requests given back are numbered too)

        def finish() -> int:
            assert probe.end.dropped == 0, f"{probe.end.dropped} frames dropped"
            while probe.end.flush():
                time.sleep(0.01)
            tokens = beside.ask(f"sync {last()}")
            probe.end.close()
            return tokens
    elif mode == "sglang":
        from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventBatch

        port = free_ports(1)
        publisher = EventPublisherFactory.create(json.dumps(
            {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": ""}), 0)
        beside = Beside("zmq", f"tcp://127.0.0.1:{port}")
        published = [-1]
        while beside.ask("seq x") < 0:  # the subscriber joined (ZMQ drops what comes before)
            publisher.publish(KVEventBatch(ts=time.time(), events=[]))
            published[0] += 1
            time.sleep(0.05)

        def step() -> None:  # SchedulerKvEventsPublisher.publish_kv_events, as SGLang has it
            events = cache.take_events()
            if events:
                publisher.publish(KVEventBatch(ts=time.time(), events=events))
                published[0] += 1

        def last() -> int:
            return published[0]

        def finish() -> int:
            tokens = beside.ask(f"sync {last()}")
            publisher.shutdown()
            return tokens
    takes: list[float] = []
    started = time.perf_counter()
    cpu = time.thread_time()
    for tokens, output in requests:
        drive23.run_request(cache, pools, tokens, output)
        if step is not None:  # the hook, once a scheduler loop
            t = time.perf_counter()
            step()
            takes.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    cpu = time.thread_time() - cpu
    tree_tokens = None
    try:
        if finish is not None:
            tree_tokens = finish()
            assert tree_tokens == cache.evictable_size() + cache.protected_size(), \
                f"{mode}: tree {tree_tokens} != cache {cache.evictable_size() + cache.protected_size()}"
    finally:
        if beside is not None:
            beside.close()
    return {"s": elapsed, "per_request_us": elapsed / len(requests) * 1e6,
            "cpu_per_request_us": cpu / len(requests) * 1e6,
            "max_step_ms": max(takes) * 1e3 if takes else None, "tree_tokens": tree_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--capacity", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.requests, args.rounds = 300, 1
    modes = [m for m in args.modes.split(",") if m]
    assert modes and set(modes) <= set(MODES), f"--modes: of {MODES}"
    drive23.import_sglang23()  # (fails here, with why, where 0.5.23 cannot load)
    requests = workload(1, args.requests)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            results[mode].append(run_block(args.capacity, requests, mode))
            log(f"round {r} {mode}: {results[mode][-1]}")
    med = {m: statistics.median(b["per_request_us"] for b in results[m]) for m in modes}
    cpu = {m: statistics.median(b["cpu_per_request_us"] for b in results[m]) for m in modes}
    summary = {"requests": args.requests, "capacity": args.capacity, "rounds": args.rounds,
               "us_per_request": {m: round(v, 1) for m, v in med.items()},
               "scheduler_cpu_us_per_request": {m: round(v, 1) for m, v in cpu.items()}, "blocks": results}
    print(f"SGLang 0.5.23 Rust core, {args.requests} requests x {args.rounds} rounds, "
          "the scheduler thread's time per request (median of rounds), wall / its own CPU:")
    for m in modes:
        ratios = "".join(f", {med[m] / med[o]:.3f}x of {o}" for o in ("off", "sglang") if o in med and o != m)
        longest = max((b["max_step_ms"] or 0) for b in results[m])
        print(f"  {m:7s} {med[m]:8,.0f} / {cpu[m]:8,.0f} us{ratios}; longest hook {longest:.2f} ms"
              + ("" if m == "off" else f"; the tree beside equals SGLang's cached tokens "
                 f"({results[m][-1]['tree_tokens']:,})"))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
