"""SGLang's throughput under a flood of tokenless reads of radixtop's admin API (issue 27).

A real SGLang 0.5.23 server on its default tree core (Rust) with the plugin, started twice: radixtop
in the scheduler's process (``RADIXTOP_BESIDE=0``, the default) and in its own process beside it
(``RADIXTOP_BESIDE=1``). In each, ``--clients`` threads send ``/generate`` back to back while
``--readers`` threads loop on a heavy ``/v1/read`` (32 reads each, no token: loopback), in windows
alternating with windows of no readers (the readers in a process of their own, so that their
Python never takes the GIL of the threads that count SGLang's requests); it reports SGLang's completed requests per second with the
flood as a ratio to without it (median of the windows), and what the readers got.

    .venv-sglang23/bin/python benchmarks/bench_sglang_flood.py            # about 5 minutes
    .venv-sglang23/bin/python benchmarks/bench_sglang_flood.py --window 4 --rounds 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import log  # noqa: E402
from bench_read_flood import reader  # noqa: E402

from tests.on_sglang.server import launch  # noqa: E402

MODES = {
    "inproc": {"RADIXTOP_BESIDE": "0"},
    "beside": {"RADIXTOP_BESIDE": "1"},  # (its reads' CPU bounded: RADIXTOP_BESIDE_CPU's default)
    "beside-unbounded": {"RADIXTOP_BESIDE": "1", "RADIXTOP_BESIDE_CPU": "off"},
}
NAMES = {"inproc": "in the scheduler", "beside": "beside the scheduler",
         "beside-unbounded": "beside the scheduler, its reads' CPU unbounded"}


def client(server, stop: threading.Event, done: list, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            server.generate([rng.randrange(3, 1000) for _ in range(64)], max_new_tokens=8)
            done.append(time.monotonic())
        except Exception:  # (counted as not done)
            time.sleep(0.05)


def window(server, admin_port: int, readers: int, clients: int, seconds: float, readers_nice: int = 0) -> dict:
    """One window: ``clients`` threads of this process send /generate; ``readers`` threads in a
    process of their own flood the admin API (their work never takes this process's GIL, so the
    requests counted here are SGLang's, not slowed by the readers' own Python)."""
    stop = threading.Event()
    done: list[float] = []
    flood = None
    if readers:
        flood = subprocess.Popen([sys.executable, __file__, "--flood", str(admin_port), "--readers", str(readers)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 preexec_fn=(lambda: os.nice(readers_nice)) if readers_nice else None)
    threads = [threading.Thread(target=client, args=(server, stop, done, k), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # under way
    t0 = time.monotonic()
    time.sleep(seconds)
    t1 = time.monotonic()
    stop.set()
    tally: dict = {}
    if flood is not None:
        out, _ = flood.communicate("", timeout=120)  # (its stdin closed: it stops, then says what it got)
        tally = json.loads(out.strip().splitlines()[-1])
    for t in threads:
        t.join(60)
    return {"readers": readers, "req_s": sum(t0 <= d < t1 for d in done) / (t1 - t0), "reads": tally}


def flood_until_stdin_closes(admin_port: int, readers: int) -> None:
    """The readers' process: ``readers`` threads on a heavy tokenless /v1/read until stdin closes;
    prints what they got (a JSON object of counts)."""
    stop = threading.Event()
    tallies: list[dict] = [{} for _ in range(readers)]
    threads = [threading.Thread(target=reader, args=(admin_port, stop, t), daemon=True) for t in tallies]
    for t in threads:
        t.start()
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join(60)
    tally: dict = {}
    for t in tallies:
        for k, v in t.items():
            tally[k] = tally.get(k, 0) + v
    print(json.dumps(tally), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--window", type=float, default=12.0, help="seconds measured per window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="inproc,beside", help=f"of {', '.join(MODES)}")
    ap.add_argument("--readers-nice", type=int, default=0,
                    help="the readers' process's niceness (19: the flood's own CPU yields to SGLang, as a flood "
                         "from another machine would; what is left is radixtop's)")
    ap.add_argument("--cpu", help="RADIXTOP_BESIDE_CPU for the beside mode (its default: the plugin's)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--flood", type=int, help=argparse.SUPPRESS)  # (the readers' process: the admin port)
    args = ap.parse_args()
    if args.flood:
        flood_until_stdin_closes(args.flood, args.readers)
        return
    results: dict[str, list[dict]] = {}
    for mode in args.modes.split(","):
        srv = launch(Path(tempfile.mkdtemp(prefix=f"flood-{mode}-")), sessions=False, sleep_on_idle=True,
                     max_total_tokens=16384,
                     env={**MODES[mode], **({"RADIXTOP_BESIDE_CPU": args.cpu} if args.cpu and mode == "beside" else {})})
        try:
            admin_port = urlparse(srv.admin_url).port
            runs = results[mode] = []
            for r in range(args.rounds):
                for readers in ((0, args.readers) if r % 2 == 0 else (args.readers, 0)):
                    runs.append(window(srv, admin_port, readers, args.clients, args.window, args.readers_nice))
                    log(f"{mode} round {r} readers {readers}: {runs[-1]}")
        finally:
            srv.stop()
    print(f"SGLang 0.5.23 (Rust core), {args.clients} clients sending /generate, {args.readers} readers "
          f"(nice {args.readers_nice}) flooding "
          f"/v1/read (32 reads each), {args.rounds} x {args.window:g} s windows a side:")
    for mode, runs in results.items():
        base = statistics.median(w["req_s"] for w in runs if w["readers"] == 0)
        flood = statistics.median(w["req_s"] for w in runs if w["readers"])
        reads: dict = {}
        for w in runs:
            for k, v in w["reads"].items():
                reads[k] = reads.get(k, 0) + v
        print(f"  radixtop {NAMES[mode]}: "
              f"{base:.1f} req/s without readers, {flood:.1f} with: {flood / base:.1%} kept; reads {reads}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
