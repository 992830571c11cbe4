"""Engine throughput under a flood of tokenless reads: 0, 1, 4 and 16 readers looping on a heavy
``/v1/read`` (32 reads each) against a `radixtop serve` child running the demo workload flat out.

For each reader count it reports the engine's prompt tokens per second (from its own counter, over
the window) as a ratio to the run with no readers, what the readers got (answers, 429s with
Retry-After, other errors), and how long ``/healthz`` and an authorised ``evict 1`` took meanwhile.
The runs alternate reader counts round by round, so drift on a shared machine hits them alike.

    .venv/bin/python benchmarks/bench_read_flood.py                 # about 4 minutes
    .venv/bin/python benchmarks/bench_read_flood.py --window 4 --rounds 1 --readers 0 4   # smoke
    .venv/bin/python benchmarks/bench_read_flood.py --beside        # the reads in radixtop's process beside
                                                                    # the engine (`radixtop serve --beside`)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import log, ms_stats  # noqa: E402

HEAVY = json.dumps([
    {"op": "sessions", "limit": 1000}, {"op": "subtree", "node_id": "root", "depth": 6, "limit": 100},
    {"op": "children", "node_id": "root", "limit": 1000}, {"op": "stats"},
] * 8)  # 32 reads


def start_server(port: int, token: str, capacity: int, sessions: int, beside: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--port", str(port), "--capacity",
           str(capacity), "--sessions", str(sessions), "--arrival-rate", "100000", "--max-running", "64",
           *(["--beside"] if beside else ["--in-process"])]
    proc = subprocess.Popen(cmd, env={**os.environ, "RADIXTOP_TOKEN": token}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if get(port, "/healthz")[0] == 200:
                return proc
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("radixtop serve did not start")
        time.sleep(0.2)


def get(port: int, path: str, method: str = "GET", token: str | None = None, timeout: float = 30.0,
        body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def prompt_tokens(port: int, token: str) -> int:
    """The engine's own counter, read with the server's token (as the operator's dashboard reads:
    a tokenless flood does not hold it up)."""
    deadline = time.monotonic() + 30
    while True:
        status, body = get(port, "/v1/stats", token=token)
        if status == 200:
            return json.loads(body)["prompt_tokens"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"/v1/stats answered {status} for 30 s: {body[:300]!r}")
        time.sleep(0.05)


def reader(port: int, stop: threading.Event, tally: dict) -> None:
    path = "/v1/read?reads=" + quote(HEAVY)
    conn = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", path)
            reply = conn.getresponse()
            reply.read()
            key = "ok" if reply.status == 200 else "429" if reply.status == 429 else f"http {reply.status}"
            if reply.status == 429:
                time.sleep(min(float(reply.getheader("Retry-After") or 1), 0.05))  # a hostile reader barely waits
        except (OSError, http.client.HTTPException) as exc:
            key = type(exc).__name__
            conn = None
        tally[key] = tally.get(key, 0) + 1


def probe(port: int, token: str, stop: threading.Event, health: list, evicts: list) -> None:
    k = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            status = get(port, "/healthz", timeout=10)[0]
        except OSError:
            status = 0
        health.append((time.perf_counter() - t0, status))
        if k % 4 == 0:
            t0 = time.perf_counter()
            try:
                status = get(port, "/v1/evict", "POST", token, timeout=10, body=b'{"tokens": 1}')[0]
            except OSError:
                status = 0
            evicts.append((time.perf_counter() - t0, status))
        k += 1
        stop.wait(0.5)


def window(port: int, token: str, readers: int, seconds: float) -> dict:
    stop = threading.Event()
    tallies = [{} for _ in range(readers)]
    health: list = []
    evicts: list = []
    threads = [threading.Thread(target=reader, args=(port, stop, t), daemon=True) for t in tallies]
    threads.append(threading.Thread(target=probe, args=(port, token, stop, health, evicts), daemon=True))
    for t in threads:
        t.start()
    time.sleep(min(2.0, seconds / 4))  # the flood under way
    t0, p0 = time.monotonic(), prompt_tokens(port, token)
    time.sleep(seconds)
    t1, p1 = time.monotonic(), prompt_tokens(port, token)
    stop.set()
    for t in threads:
        t.join(35)
    tally: dict = {}
    for t in tallies:
        for k, v in t.items():
            tally[k] = tally.get(k, 0) + v
    return {"readers": readers, "prompt_tok_s": (p1 - p0) / (t1 - t0), "reads": tally,
            "healthz_ms": ms_stats([d for d, _ in health], 99), "healthz_bad": sum(s != 200 for _, s in health),
            "evict_ms": ms_stats([d for d, _ in evicts], 99), "evict_bad": sum(s != 200 for _, s in evicts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readers", type=int, nargs="+", default=[0, 1, 4, 16])
    ap.add_argument("--window", type=float, default=12.0, help="seconds measured per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--capacity", type=int, default=65536)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--beside", action="store_true", help="serve --beside: the engine alone in its process")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(__file__).parent / "results" / f"read_flood{'_beside' if args.beside else ''}.json"
    token, port = secrets.token_urlsafe(24), 18000 + os.getpid() % 1000
    proc = start_server(port, token, args.capacity, args.sessions, args.beside)
    log(f"radixtop serve{' --beside' if args.beside else ''} (the reads {'beside the engine' if args.beside else 'in its process'})")
    runs: list[dict] = []
    try:
        time.sleep(5)  # the cache full, evicting: the steady state
        for r in range(args.rounds):
            for n in args.readers:
                run = window(port, token, n, args.window)
                run["round"] = r
                runs.append(run)
                log(f"round {r} readers {n:2d}: {run['prompt_tok_s']:,.0f} prompt tok/s, reads {run['reads']}, "
                    f"healthz max {run['healthz_ms']['max']:.0f} ms ({run['healthz_bad']} bad), "
                    f"evict max {(run['evict_ms'] or {'max': 0})['max']:.0f} ms ({run['evict_bad']} bad)")
                time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(10)
    base = [r["prompt_tok_s"] for r in runs if r["readers"] == 0]
    baseline = sum(base) / len(base) if base else None
    print("| readers | prompt tok/s | vs none | reads answered | 429 | other errors | healthz p99 / max ms | "
          "evict p99 / max ms |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.readers:
        mine = [r for r in runs if r["readers"] == n]
        tok = sum(r["prompt_tok_s"] for r in mine) / len(mine)
        ok = sum(r["reads"].get("ok", 0) for r in mine)
        limited = sum(r["reads"].get("429", 0) for r in mine)
        other = sum(v for r in mine for k, v in r["reads"].items() if k not in ("ok", "429"))
        h = max(r["healthz_ms"]["p99"] for r in mine), max(r["healthz_ms"]["max"] for r in mine)
        e = [r["evict_ms"] for r in mine if r["evict_ms"]]
        ev = (max(x["p99"] for x in e), max(x["max"] for x in e)) if e else (0, 0)
        ratio = f"{tok / baseline:.2f}" if baseline else "-"
        print(f"| {n} | {tok:,.0f} | {ratio} | {ok:,} | {limited:,} | {other:,} | {h[0]:.0f} / {h[1]:.0f} | "
              f"{ev[0]:.0f} / {ev[1]:.0f} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in runs:
        for key in ("healthz_ms", "evict_ms"):
            if r[key]:
                r[key].pop("samples", None)
    out.write_text(json.dumps({"window_s": args.window, "rounds": args.rounds, "beside": args.beside, "runs": runs},
                              indent=1))


if __name__ == "__main__":
    main()
