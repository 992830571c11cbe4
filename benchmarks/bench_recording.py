"""What a recording writes of a multi-turn workload (``radixtop record``: each op of the engine's
with its token ids, issue 29), with each session's turn written as what it reuses of its last turn
and the rest (recording 2, ``SessionTurns``) against each prompt written whole (recording 1).

Each public trace in ``tests/data`` (Mooncake's conversation excerpt, kv-cache-tester's two
files) is replayed on the bundled engine, its history telling every op with its tokens; the ops
are then written as the recorder writes them, both ways, and read back: every prompt whole again.

    .venv/bin/python benchmarks/bench_recording.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import environment, finish, log  # noqa: E402

from radixtop.adapters.owned.why import history_page, journal_read  # noqa: E402
from radixtop.cli.recording import SessionTurns  # noqa: E402
from radixtop.gpu_backend.history import MOST_SERVED_TOKENS  # noqa: E402
from radixtop.gpu_backend.kv_geometry import get_geometry  # noqa: E402
from radixtop.gpu_backend.scheduler import Scheduler  # noqa: E402
from radixtop.gpu_backend.traces.formats import load_trace, timed_ops  # noqa: E402
from radixtop.gpu_backend.traces.ops import Replayer, TraceError  # noqa: E402

TRACES = (("mooncake", REPO / "tests" / "data" / "mooncake_conversation_excerpt.jsonl", 8),
          ("kv-cache-tester", REPO / "tests" / "data" / "kv_cache_tester", 8))


def recorded_ops(path: Path, fmt: str, scale: int) -> list[dict]:
    """The trace replayed on the bundled engine: its history's ops, as a recording's lines hold them."""
    trace = load_trace(path, fmt)
    s = Scheduler(get_geometry("tiny"), 1 << 22, device="cpu", write_kv=False)
    replayer = Replayer(s)
    for timed in timed_ops(trace, scale):
        try:
            replayer.apply(timed.op)
        except TraceError:
            pass
    history = s.cache.history
    assert history.served_tokens < MOST_SERVED_TOKENS, "the history dropped some ops' tokens: a smaller --scale"
    ops: list[dict] = []
    while True:  # (as the recorder reads them: the journal's pages)
        page = history_page(journal_read(history, 1 << 62, ops[-1]["seq"] if ops else 0, 10_000))
        if not page.served:
            return ops
        ops.extend(e.to_dict() for e in page.served)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "recording.json")
    args = ap.parse_args()
    rows = []
    for name, path, scale in TRACES:
        ops = recorded_ops(path, "kv-cache-tester" if name == "kv-cache-tester" else name, scale)
        whole = sum(len(json.dumps({"served": op}, separators=(",", ":"))) + 1 for op in ops)
        writer, reader = SessionTurns(), SessionTurns()
        written = [writer.written(op) for op in ops]
        size = sum(len(json.dumps({"served": op}, separators=(",", ":"))) + 1 for op in written)
        back = [reader.read(json.loads(json.dumps(op))) for op in written]
        same = all(list(a.get("tokens") or []) == list(b.get("tokens") or []) for a, b in zip(ops, back))
        begins = [op for op in ops if op["op"] == "begin"]
        tokens_whole = sum(len(op["tokens"] or ()) for op in begins)
        tokens_written = sum(len(op["tokens"] or ()) for op in written if op["op"] == "begin")
        reused = sum(1 for op in written if "reuse" in op)
        rows.append({"trace": name, "ops": len(ops), "begins": len(begins), "reused": reused,
                     "prompt_tokens_whole": tokens_whole, "prompt_tokens_written": tokens_written,
                     "bytes_whole": whole, "bytes_written": size, "read_back_whole": same})
        log(f"{name}: {len(ops):,} ops, {len(begins):,} begins ({reused:,} written as a reuse): {whole:,} B whole, "
            f"{size:,} B written ({size / whole:.2f}x); prompts read back whole: {same}")
        if not same:
            raise SystemExit(f"{name}: a prompt read back differs from the one written")
    table = "\n".join([
        "| trace | ops | begins | written as a reuse | prompt tokens whole | written | bytes whole | written | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['trace']} | {r['ops']:,} | {r['begins']:,} | {r['reused']:,} | {r['prompt_tokens_whole']:,} | "
          f"{r['prompt_tokens_written']:,} | {r['bytes_whole']:,} | {r['bytes_written']:,} | "
          f"{r['bytes_written'] / r['bytes_whole']:.2f}x |" for r in rows)])
    finish(args.out, {"environment": environment(), "traces": rows}, table,
           "each prompt read back whole equals the one the engine saw (checked)")


if __name__ == "__main__":
    main()
