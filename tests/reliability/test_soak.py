"""Soak: the bundled engine under pool pressure, behind the real admin API, with concurrent clients.

The demo workload runs on a small real torch KV pool (eviction all the time) while readers page
the tree and the sessions and actors close, dry-run, evict and flush over HTTP. The workload
pauses now and then (commands still run), which is when closes see nothing else change between
their plan and their result. Every answer is checked as it comes; the whole pool is checked on
the owner thread during the run and after it; the audit journal must match what was sent.
``RADIXTOP_SOAK_S`` sets the duration; ``RADIXTOP_SOAK_REPORT`` names a file for the figures.
"""

from __future__ import annotations

import json
import os
import threading
import time

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.wire import audit_entry_from_dict
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.workload import WorkloadConfig
from tests.reliability.soak_helpers import (
    FLUSH_EVERY_S,
    ActionGate,
    Actor,
    Ledger,
    SessionReader,
    StatsSampler,
    TreeReader,
    audit_mismatches,
    pool_census,
)
from tests.support.live_server import running_server

SOAK_S = float(os.environ.get("RADIXTOP_SOAK_S", "45"))
"""Seconds the clients run (the whole test takes about 10 s more)."""
CAPACITY = 1536
"""Tokens in the pool: a small part of what the sessions would keep, so eviction never stops."""
WORKLOAD = WorkloadConfig(sessions=24, system_prompts=3, system_prompt_len=64, turn_input_len=(8, 32),
                          turn_output_len=(8, 32), turns=(2, 6), never_closed_share=0.25, max_running=6,
                          decode_steps=(1, 3), seed=11)
LIVE_S, PAUSED_S = 2.0, 1.0
"""The workload runs, then pauses (only the clients act), in turn."""
TOKEN = "soak-token"


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def run_phases(engine: Engine, stop: threading.Event, seconds: float, while_paused) -> int:
    """Alternate live and paused workload until ``seconds`` pass (or a check stops the soak),
    calling ``while_paused`` in each pause; returns how many paused windows there were. Leaves
    the workload paused."""
    deadline = time.monotonic() + seconds
    paused = 0
    while time.monotonic() < deadline and not stop.is_set() and engine.alive:
        engine.pause_workload(False)
        stop.wait(min(LIVE_S, max(0.0, deadline - time.monotonic())))
        engine.pause_workload(True)
        if time.monotonic() < deadline:
            paused += 1
            while_paused()
            stop.wait(min(PAUSED_S, max(0.0, deadline - time.monotonic())))
    engine.pause_workload(True)
    return paused


def read_audit(path) -> list:
    """The journal file as one entry per action: an authorised action is two lines, its intent
    (written before it ran) and its outcome, paired by id; an intent without an outcome counts as
    its action (it stays, flagged, in the journal)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    finished = {d.get("id") for d in lines if d.get("phase") == "outcome"}
    return [audit_entry_from_dict(d) for d in lines if not (d.get("phase") == "intent" and d.get("id") in finished)]


def test_soak_concurrent_clients_keep_the_pool_exact(tmp_path):
    scheduler = Scheduler(get_geometry("tiny"), CAPACITY, device="cpu")
    engine = Engine(scheduler, WORKLOAD, step_interval=0.005).start()
    audit_path = tmp_path / "audit.jsonl"
    audit = AuditLog(audit_path)
    adapter = BundledAdapter(engine, name="soak", timeout=60.0)
    ledger, stop, gate, last_flush = Ledger(), threading.Event(), ActionGate(engine), [0.0]
    try:
        with running_server(create_app(adapter, TOKEN, audit)) as url:
            # Warm up until the pool is full and evicting, so the clients start on pressure.
            wait_for(lambda: not engine.alive or (scheduler.evicted_tokens > 0 and engine.requests_finished >= 100))
            assert engine.alive, f"the engine thread died during the warm-up: {engine.error!r}"
            before = (engine.requests_finished, engine.requests_aborted, engine.steps, scheduler.evicted_tokens,
                      scheduler.closes)
            common = {"url": url, "token": TOKEN, "ledger": ledger, "stop": stop, "capacity": CAPACITY}
            workers = [
                TreeReader("tree-1", seed=1, **common),
                TreeReader("tree-2", seed=2, **common),
                SessionReader("sessions", seed=3, **common),
                StatsSampler("stats", seed=4, engine=engine, **common),
                Actor("actor-1", seed=5, gate=gate, last_flush=last_flush, engine=engine, **common),
                Actor("actor-2", seed=6, gate=gate, last_flush=last_flush, engine=engine, **common),
            ]
            prober = Actor("prober", seed=7, gate=gate, last_flush=last_flush, engine=engine, **common)
            for worker in workers:
                worker.start()
            started = time.monotonic()
            paused_windows = run_phases(engine, stop, SOAK_S, prober.probe)
            ran_s = time.monotonic() - started
            engine_died = None if engine.alive else engine.error
            stop.set()
            for worker in workers:
                worker.join(60)
            stuck = [w.name for w in workers if w.is_alive()]
            prober.http.close()
            prober.adapter.release()
            # After the run, workload paused: the pool as a whole, on the owner thread.
            nodes = open_sessions = None
            if engine.alive:
                try:
                    nodes = engine.call(pool_census, timeout=60.0)
                except AssertionError as exc:
                    ledger.fail(f"census after the run: {exc}")
                open_sessions = adapter.stats().open_sessions
            finished, aborted, steps, evicted, closes = (
                now - then for now, then in zip((engine.requests_finished, engine.requests_aborted, engine.steps,
                                                 scheduler.evicted_tokens, scheduler.closes), before))
    finally:
        stop.set()
        engine.stop()
        audit.close()

    counts = ledger.counts
    entries = read_audit(audit_path)
    report = {
        "soak_s": round(ran_s, 1),
        "paused_windows": paused_windows,
        "reads": counts["reads"],
        "reads_by_kind": {k.split(":", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("read:")},
        "actions": {
            "closes_freeing": counts["closes_freeing"],
            "closes_freeing_nothing": counts["closes_freeing_nothing"],
            "closes_already_closed": counts["closes_already_closed"],
            "closes_unknown_404": counts["close_refused_unknown"],
            "closes_forgotten_404": counts["close_refused_real"],
            "dry_runs": counts["dry_runs"],
            "dry_runs_unknown_404": counts["close_dry_run_refused_unknown"],
            "evicts": counts["evicts"],
            "flushes": counts["flushes"],
        },
        "quiet_closes_plan_eq_result": counts["quiet_closes"],
        "quiet_closes_freeing": counts["quiet_closes_freeing"],
        "alone_probes": counts["probes"],
        "exclusive_bytes_eq_dry_run_checked": counts["exclusive_checked"],
        "closes_plan_differs": counts["closes_plan_differs"],
        "freed_nodes_checked_gone": counts["freed_nodes_gone"],
        "tokens_freed": {"close": counts["tokens_freed_by_close"], "evict": counts["tokens_freed_by_evict"],
                         "flush": counts["tokens_freed_by_flush"]},
        "engine": {"requests_finished": finished, "requests_aborted": aborted, "steps": steps,
                   "evicted_tokens": evicted, "closes_all": closes, "nodes_at_end": nodes,
                   "open_sessions_at_end": open_sessions},
        "stats_samples_checked": counts["stats_checked"],
        "owner_thread_censuses": counts["owner_checks"] + (nodes is not None),
        "audit_entries": len(entries),
        "errors_by_code": dict(sorted(ledger.errors.items())),
        "failures": len(ledger.failures),
    }
    print(json.dumps(report))
    if os.environ.get("RADIXTOP_SOAK_REPORT"):
        with open(os.environ["RADIXTOP_SOAK_REPORT"], "w", encoding="utf-8") as f:
            f.write(json.dumps(report) + "\n")

    assert engine_died is None, f"the engine thread died: {engine_died!r}"
    assert not stuck, f"client threads did not stop: {stuck}"
    assert not ledger.failures, f"{len(ledger.failures)} failures, first ones:\n" + "\n".join(ledger.failures[:15])
    problems = audit_mismatches(entries, ledger.journal)
    assert not problems, "audit journal != actions sent:\n" + "\n".join(problems[:15])
    # The soak did what it is for (a run too short or too slow to exercise something fails).
    assert finished > 0 and evicted > 0, "the workload did not run under pressure"
    assert counts["stats_checked"] >= 50 and counts["owner_checks"] >= 5
    assert counts["closes_freeing"] and counts["closes_already_closed"] and counts["quiet_closes_freeing"]
    assert counts["exclusive_checked"]
    assert report["actions"]["closes_unknown_404"] and counts["dry_runs"] and counts["evicts"]
    assert counts["flushes"] or SOAK_S < 4 * FLUSH_EVERY_S
    assert counts["read:children"] and counts["read:node"] and counts["read:chain"]
    assert counts["read:sessions"] and counts["read:session"] and counts["read:changes"]
