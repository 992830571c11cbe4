"""How long radixtop holds SGLang's scheduler thread when its tree lives beside it (issue 27, the
Python cores): SGLang 0.5.16's real ``RadixCache`` with sessions, grown as ``bench_sglang_holds.py``
grows it (1M nodes, 50k sessions), the probe's recorder on it and radixtop's own process beside
(``python -m radixtop.adapters.sglang.beside``, started as the plugin starts it), with the
dashboard's ``Poller`` reading that process's admin API at its default refresh.

    .venv/bin/python benchmarks/bench_beside_holds.py --sizes 1000000 --window-s 40

A scheduler thread serves requests (a session's next turn or a prompt on a system prompt, as in
``bench_sglang_holds.py``) and runs ``BesideProcess.step()`` after each, where the plugin's hook
runs it: that step (the records taken, encoded and sent; radixtop's calls answered) is radixtop's
hold of the scheduler thread, timed; its share is of the scheduler's whole time. The records
themselves are appended inside SGLang's own calls (``records.ChangeRecorder``): that cost is in the
requests' time, and measured apart (``--hooks``: the same requests on the same tree with the
recorder's hooks and without, alternating, side by side). Also printed: the steps that send the
whole tree (radixtop's process started, or started again, on a grown tree: walked a slice a step
while requests go on), their longest hold and their share of the scheduler's time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from time import perf_counter as pc
from time import thread_time

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_sglang_holds as holds_bench  # noqa: E402
from _common import environment, fmt_nodes, log, rss_mib  # noqa: E402

GOAL_LONGEST_MS = 2.0
GOAL_SHARE = 0.005


def node_counter(tree):
    """Nodes made so far (SGLang's own id counter): nothing of radixtop's installed while growing."""
    cls = type(tree.cache.root_node)
    start = cls.counter
    return lambda: cls.counter - start


def walk_count(root) -> int:
    n, stack = 0, [root]
    while stack:
        node = stack.pop()
        n += 1
        stack.extend(node.children.values())
    return n - 1


def start_beside(cache, controller):
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.adapters.http.server.run import bind
    from radixtop.adapters.sglang.probe import BesideProcess, CoreOps
    from radixtop.adapters.sglang.records import recorder_for

    listening = bind("127.0.0.1", 0)
    listening.listen(128)
    port = listening.getsockname()[1]
    token = "a-bench-token-of-enough-characters"
    ops = CoreOps(cache, "sglang (bench)", None, model="bench")
    import dataclasses

    info = {"name": "sglang (bench)", "dp_rank": 0, "bytes_per_token": ops.bpt, "capacity_tokens": int(ops.allocator.size),
            "tree": "unified" if hasattr(cache, "tree_core") else "radix", "page_size": 1, "sessions": True, "geometry": dataclasses.asdict(ops.geometry)}
    recorder = recorder_for(cache, controller)
    started = pc()
    beside = BesideProcess(cache, listening, "127.0.0.1", info, {**os.environ, "RADIXTOP_TOKEN": token, "RADIXTOP_TIMEOUT": "120"},
                           sglang=ops, recorder=recorder)
    snapshot_s = pc() - started
    return beside, RadixtopClient(f"http://127.0.0.1:{port}", token=token, timeout=120), token, snapshot_s


def measure(tree, grown, window_s: float) -> dict:
    history = grown["history"]
    controller = None
    if not tree.unified:
        from sglang.srt.managers.io_struct import OpenSessionReqInput
        from sglang.srt.session.session_controller import SessionController
  # (0.5.23's sessions open through the cache's tracker, as each request comes)
        controller = SessionController(tree.cache)
        for sid in history:
            controller.open(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id=sid))
    beside, client, token, snapshot_s = start_beside(tree.cache, controller)
    log(f"  radixtop's process started in one hold of {snapshot_s * 1e3:.1f} ms (the whole tree's first slice in it)")
    rng = random.Random(3)
    stop = threading.Event()
    rows: list[tuple[float, float, float]] = []  # (hold, hold CPU, the step's whole time)
    walk_rows: list[tuple[float, float, float]] = []  # (the same, while the whole tree is on its way)
    phase = {"name": "catch-up"}

    def scheduler() -> None:
        while not stop.is_set():
            started = pc()
            time.sleep(holds_bench.STEP_DEVICE_S)
            holds_bench.serve_one(tree, rng, grown)
            walking = beside.probe.busy
            c0, t0 = thread_time(), pc()
            beside.step()
            t1 = pc()
            if phase["name"] == "window":
                rows.append((t1 - t0, thread_time() - c0, t1 - started))
            elif walking:
                walk_rows.append((t1 - t0, thread_time() - c0, t1 - started))

    import gc

    collections: list[tuple[int, float, float]] = []  # (generation, start, seconds): where a long hold went
    began: dict[str, float] = {}

    def collecting(phase_name: str, info: dict) -> None:
        if phase_name == "start":
            began["t"] = pc()
        elif "t" in began:
            collections.append((info["generation"], began["t"], pc() - began.pop("t")))

    gc.callbacks.append(collecting)
    thread = threading.Thread(target=scheduler, name="scheduler", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 600
        while True:  # radixtop's process applies the whole tree before it answers
            try:
                st = client.stats()
                break
            except Exception:
                assert time.monotonic() < deadline, "radixtop's process did not come up"
                time.sleep(0.5)
        log(f"  radixtop beside answers: {st.node_count} nodes, {st.open_sessions} open sessions "
            f"({time.monotonic() - deadline + 600:.0f} s after its start)")
        while beside.probe.busy:
            assert time.monotonic() < deadline, "the whole tree did not come"
            time.sleep(0.1)
        ws = sorted(h for h, _, _ in walk_rows)
        worst = sorted(range(len(walk_rows)), key=lambda i: -walk_rows[i][0])[:3]
        full = [c for c in collections if c[0] == 2]
        log("  the whole tree's longest steps: " + ", ".join(f"#{i + 1} of {len(walk_rows)}: {walk_rows[i][0] * 1e3:.1f} ms"
                                                            for i in worst)
            + f"; the process's full garbage collections meanwhile: {len(full)}, longest "
            f"{max((c[2] for c in full), default=0) * 1e3:.0f} ms")
        walk = {"walk_steps": len(walk_rows), "walk_s": sum(s for _, _, s in walk_rows),
                "walk_longest_ms": ws[-1] * 1e3, "walk_longest_cpu_ms": max(c for _, c, _ in walk_rows) * 1e3,
                "walk_p99_ms": ws[int(0.99 * (len(ws) - 1))] * 1e3,
                "walk_share": sum(ws) / sum(s for _, _, s in walk_rows)}
        log(f"  the whole tree sent over {walk['walk_steps']:,} steps ({walk['walk_s']:.1f} s of them): longest hold "
            f"{walk['walk_longest_ms']:.2f} ms (CPU {walk['walk_longest_cpu_ms']:.2f}), p99 {walk['walk_p99_ms']:.2f}, "
            f"share {walk['walk_share']:.1%}")
        phase["name"] = "window"
        # the dashboard in a process of its own, as it runs (its JSON work never takes this
        # process's GIL, so the holds timed here are the scheduler's own)
        import subprocess

        reader = subprocess.run(
            [sys.executable, __file__, "--reader", client.url, "--window-s", str(window_s)],
            env={**os.environ, "RADIXTOP_TOKEN": token}, capture_output=True, text=True, timeout=window_s + 300)
        if reader.returncode != 0:
            raise RuntimeError(f"the dashboard's reader failed: {reader.stderr[-2000:]}")
        polls, poll_ms = json.loads(reader.stdout.strip().splitlines()[-1])
        rss_mb = rss_mib(beside.child.pid)
    finally:
        gc.callbacks.remove(collecting)
        stop.set()
        thread.join(30)
        beside.close()
        client.release()
    hs = sorted(h for h, _, _ in rows)
    return {"snapshot_s": snapshot_s, **walk, "polls": polls, "poll_ms": poll_ms, "beside_rss_mb": rss_mb,
            "steps": len(rows), "longest_ms": hs[-1] * 1e3, "p99_ms": hs[int(0.99 * (len(hs) - 1))] * 1e3,
            "median_ms": statistics.median(hs) * 1e3, "longest_cpu_ms": max(c for _, c, _ in rows) * 1e3,
            "median_cpu_ms": statistics.median(c for _, c, _ in rows) * 1e3,
            "share_cpu": sum(c for _, c, _ in rows) / sum(s for _, _, s in rows),
            "share": sum(hs) / sum(s for _, _, s in rows), "seconds": sum(s for _, _, s in rows)}


def read_as_the_dashboard(url: str, window_s: float) -> None:
    """The dashboard's ``Poller`` at its default refresh against ``url`` for ``window_s`` (this
    process is the dashboard's): prints [polls, mean ms a poll]."""
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.inspector.poller import SESSIONS_LOADED, Poller, PollRequest, SessionsQuery
    from radixtop.inspector.tree_ops import Toggle

    client = RadixtopClient(url, token=os.environ["RADIXTOP_TOKEN"], timeout=120)
    poller = Poller(client)
    sessions = SessionsQuery(limit=SESSIONS_LOADED)
    first = poller.collect(PollRequest(sessions=sessions))
    top = first.tree.rows[0] if first.tree and first.tree.rows else None
    if top is not None and top.node is not None and top.node.num_children:
        poller.tree_op(Toggle(top.node))
    poll_s: list[float] = []
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        t = time.monotonic()
        request = PollRequest(selected_node=top.node.id if top and top.node else None, sessions=sessions)
        poller.collect(request)
        poll_s.append(time.monotonic() - t)
        time.sleep(request.interval)
    print(json.dumps([len(poll_s), statistics.mean(poll_s) * 1e3]))


def hooks_cost(tree, grown, requests: int, rounds: int) -> dict:
    """The recorder's hooks inside SGLang's own calls: the same kind of requests on the same tree,
    in rounds alternating with the hooks on (a fresh recorder) and off (SGLang's methods back), on
    the thread's CPU clock."""
    from radixtop.adapters.owned.records import RECORDER
    from radixtop.adapters.sglang.records import recorder_for

    cache = tree.cache
    hooked = [o for o in (cache, getattr(cache, "tree_core", None), (getattr(cache, "components", None) or {}).get(0),
                          getattr(cache, "session_refs", None)) if o is not None]
    own = [(o, dict(vars(o))) for o in hooked]  # (the replayer's own wrappers among them)
    rng = random.Random(5)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
            recorder = recorder_for(cache) if name == "on" else None
            c0 = thread_time()
            for _ in range(requests):
                holds_bench.serve_one(tree, rng, grown)
                if recorder is not None:
                    recorder.take()  # (once a request, as the probe does once a loop)
            times[name].append((thread_time() - c0) / requests)
            if recorder is not None:  # (the recorder's wrappers off again, nothing else touched)
                for obj, before in own:
                    for key, value in list(vars(obj).items()):
                        if callable(value) and hasattr(value, "__wrapped__") and before.get(key) is not value:
                            if key in before:
                                setattr(obj, key, before[key])
                            else:
                                delattr(obj, key)
                delattr(cache, RECORDER)
    off, on = statistics.median(times["off"]) * 1e6, statistics.median(times["on"]) * 1e6
    return {"off_us": off, "on_us": on, "ratio": on / off}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--hooks", action="store_true", help="also the recorder's hooks' cost per request")
    parser.add_argument("--unified", action="store_true", help="0.5.23's UnifiedRadixCache (Python core; .venv-sglang23)")
    parser.add_argument("--out", type=Path, help="(default: benchmarks/results/beside_holds[_unified].json)")
    parser.add_argument("--reader", help=argparse.SUPPRESS)  # (the dashboard's process: its URL)
    args = parser.parse_args(argv)
    if args.reader:
        read_as_the_dashboard(args.reader, args.window_s)
        return 0
    holds_bench._counter = node_counter  # (grow without radixtop's in-process index on the tree)
    rows = []
    for size in args.sizes:
        log(f"{fmt_nodes(size)} nodes: growing a real SGLang {'UnifiedRadixCache' if args.unified else 'RadixCache'} "
            "(sessions on)")
        tree = holds_bench.Tree(args.unified, size * 40 + 100_000)
        grown = holds_bench.grow(tree, size)
        nodes = walk_count(tree.cache.root_node)
        log(f"  {nodes:,} nodes, {grown['sessions']:,} sessions in {grown['build_s']:.0f} s")
        row = {"nodes": nodes, "sessions": grown["sessions"], **measure(tree, grown, args.window_s)}
        if args.hooks:
            row["hooks"] = hooks_cost(tree, grown, 300, 6)
            log(f"  the recorder's hooks: {row['hooks']['off_us']:.0f} us of CPU a request without, "
                f"{row['hooks']['on_us']:.0f} with ({row['hooks']['ratio']:.2f}x)")
        rows.append(row)
        log(f"  {row['steps']:,} steps: longest hold {row['longest_ms']:.2f} ms (CPU {row['longest_cpu_ms']:.2f}), "
            f"p99 {row['p99_ms']:.2f}, median {row['median_ms']:.3f} (CPU {row['median_cpu_ms']:.3f}); "
            f"share {row['share']:.3%} (CPU {row['share_cpu']:.3%}); "
            f"{row['polls']} polls of {row['poll_ms']:.0f} ms; radixtop's process resident "
            f"{row['beside_rss_mb']:,.0f} MiB")
        del tree, grown
        gc.unfreeze()
        gc.collect()
    print("| tree | seconds | steps | longest hold (ms) | p99 (ms) | share | goal | met |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        met = r["longest_ms"] <= GOAL_LONGEST_MS and r["share"] <= GOAL_SHARE
        print(f"| {fmt_nodes(r['nodes'])} nodes, {r['sessions']:,} sessions | {r['seconds']:.0f} | {r['steps']:,} | "
              f"{r['longest_ms']:.2f} | {r['p99_ms']:.2f} | {r['share']:.2%} | <= {GOAL_LONGEST_MS:g} ms, "
              f"<= {GOAL_SHARE:.1%} | {'yes' if met else 'NO'} |")
    out = args.out or REPO / "benchmarks" / "results" / f"beside_holds{'_unified' if args.unified else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
