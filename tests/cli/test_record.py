"""``radixtop record`` and ``radixtop diff`` (issue 29's flight recorder on disk) against a real
admin API server: what the engine did while it recorded is in the file, once each; a server that
goes down and comes back as a new one is a gap, and the recording goes on; ``serve --record``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server, wait_for_serve

TOKEN = "record-test-token"


def run(url: str, *args: str):
    return CliRunner().invoke(app, list(args), env={"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN})


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def of(kind: str, recorded: list[dict]) -> list[dict]:
    return [line[kind] for line in recorded if kind in line]


@contextmanager
def recording_while(engine, path, act):
    """``radixtop record PATH --for 3s`` against a real API server over ``engine`` while ``act``
    runs beside it: the server's URL and the command's result, the server still up."""
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        worker = threading.Thread(target=act)
        worker.start()
        result = run(url, "record", str(path), "--for", "3s", "--every", "1s")
        worker.join()
        assert result.exit_code == 0, result.output
        yield url, result


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


def test_a_recording_holds_each_removal_and_request_made_while_it_ran_once(engine, tmp_path):
    path = tmp_path / "r.jsonl"
    done: dict = {}

    done["history"] = engine.call(lambda s: s.cache.history)

    def act() -> None:
        time.sleep(1.0)
        done["close"] = engine.call(lambda s: s.close_session("a"))
        done["evict"] = engine.call(lambda s: s.evict_asked(1 << 20, "the test"))
        engine.call(lambda s: s.request("t1", [1, 2, 3, 4, 60], [61], "b"))

    with recording_while(engine, path, act) as (url, result):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # (prompts' token ids)
        again = run(url, "record", str(path), "--for", "1s")
        assert again.exit_code == 2 and "never overwritten" in again.output
        engine.call(lambda s: setattr(s.cache, "history", None))  # (a target that keeps none)
        none = run(url, "record", str(tmp_path / "none.jsonl"), "--for", "1s")
        assert none.exit_code == 1 and "keeps no history" in none.output and not (tmp_path / "none.jsonl").exists()
        engine.call(lambda s: setattr(s.cache, "history", done["history"]))
    recorded = lines(path)
    assert recorded[0]["recording"] == 2 and recorded[0]["capacity_tokens"] == 256 and "end" in recorded[-1]
    removed = of("removed", recorded)
    assert [r["seq"] for r in removed] == list(range(removed[0]["seq"], removed[0]["seq"] + len(removed)))
    by_cause: dict[str, int] = {}
    for r in removed:
        by_cause[r["cause"]] = by_cause.get(r["cause"], 0) + len(r["tokens"])
    # (the close of "gone" before the recording started is not in it: from now on, by default)
    assert by_cause == {"closed": done["close"].freed_tokens, "evict_action": done["evict"].num_tokens_evicted}
    assert {r["session_id"] for r in removed if r["cause"] == "closed"} == {"a"}
    # the engine's ops while it ran, in order: what a replay of the recording applies
    served = of("served", recorded)
    assert [(e["op"], e["session_id"], e["request_id"], e["tokens"], e["asked_tokens"]) for e in served] == [
        ("close", "a", None, None, 0), ("evict", None, None, None, 1 << 20),
        ("begin", "b", "t1", [1, 2, 3, 4, 60], 0), ("finish", "b", "t1", [61], 0)]
    assert (served[2]["prompt_tokens"], served[2]["cached_tokens"]) == (5, 4)
    assert [e["seq"] for e in served] == list(range(served[0]["seq"], served[0]["seq"] + 4))
    assert len(of("moment", recorded)) >= 3 and not of("gap", recorded)
    assert f"recorded {len(removed)} removals" in result.output and "the time asked for is up" in result.output

    # diff: the figures from the first moment to the last, and what left in between, by cause and session
    d = json.loads(run(url, "diff", str(path), "--json").stdout)
    assert d["left"]["by_cause"] == {cause: {"nodes": sum(1 for r in removed if r["cause"] == cause), "tokens": n}
                                     for cause, n in by_cause.items()}
    assert d["figures"]["evicted_tokens"]["change"] == done["evict"].num_tokens_evicted
    assert {row["id"]: row["by_cause"] for row in d["left"]["by_session"]}["a"]["closed"] == done["close"].freed_tokens
    text = run(url, "diff", str(path)).stdout
    assert f"left the tree: {sum(by_cause.values()):,} tokens" in text and "session a:" in text
    assert "available_tokens: " in text and "B)" not in next(line for line in text.splitlines() if "prompt_tokens" in line)


def test_kept_starts_with_what_the_history_already_holds_and_a_bound_that_dropped_some_is_a_gap(engine, tmp_path):
    engine.call(lambda s: setattr(s.cache.history, "most_bytes", 0))  # keeps none: the next close drops all
    engine.call(lambda s: s.close_session("b"))
    engine.call(lambda s: setattr(s.cache.history, "most_bytes", 1 << 20))
    engine.call(lambda s: s.evict_asked(1, "the test"))
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        path = tmp_path / "kept.jsonl"
        assert run(url, "record", str(path), "--for", "0s", "--kept").exit_code == 0
    recorded = lines(path)
    # the closes of "gone" and "b" were dropped by the bound before the recording read them
    assert [(r["cause"], r["seq"]) for r in of("removed", recorded)] == [("evict_action", 3)]
    (gap,) = of("gap", recorded)
    assert "dropped by the target's history bounds" in gap["reason"]


def test_a_target_that_goes_down_and_comes_back_new_is_a_gap_and_the_recording_goes_on(tmp_path):
    port = free_port()
    path = tmp_path / "restart.jsonl"
    first, second = build_engine(), build_engine()
    up = threading.Event()
    try:
        def restart() -> None:
            with running_server(create_app(BundledAdapter(first), TOKEN, AuditLog(None)), port=port):
                up.set()
                time.sleep(1.5)
                first.call(lambda s: s.close_session("a"))
                time.sleep(1.0)
            time.sleep(1.5)  # down
            with running_server(create_app(BundledAdapter(second), TOKEN, AuditLog(None)), port=port):
                time.sleep(1.0)
                second.call(lambda s: s.close_session("b"))
                time.sleep(2.0)

        server = threading.Thread(target=restart)
        server.start()
        assert up.wait(10)
        result = run(f"http://127.0.0.1:{port}", "record", str(path), "--for", "6s", "--every", "1s", "--timeout", "1")
        server.join()
    finally:
        first.stop()
        second.stop()
    assert result.exit_code == 0, result.output
    recorded = lines(path)
    reasons = [g["reason"] for g in of("gap", recorded)]
    assert reasons[0].startswith("the target is down") and "the target is back" in reasons
    assert any("started again (a restart)" in r for r in reasons), reasons
    # both servers' closes are there; the second's whole history, numbered from 1 again (its setup
    # closed "gone": the first's, from before the recording began, is not)
    closes = [(r["session_id"], r["seq"]) for r in of("removed", recorded) if r["cause"] == "closed"]
    assert [sid for sid, _ in closes] == ["a", "gone", "b"] and closes[1][1] == 1
    assert "gap" in result.output


def test_diff_of_two_recordings_and_a_file_that_is_not_one(engine, tmp_path):
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        assert run(url, "record", str(a), "--for", "0s").exit_code == 0
        engine.call(lambda s: s.close_session("b"))
        assert run(url, "record", str(b), "--for", "0s", "--kept").exit_code == 0
        d = json.loads(run(url, "diff", str(a), str(b), "--json").stdout)
        # from a's end to b's: b's close (b keeps "gone"'s too, from before a: not in between)
        assert d["left"]["by_cause"] == {"closed": {"nodes": 1, "tokens": 3}} and [g["reason"] for g in d["gaps"]] == [
            "between the two recordings nothing was recorded"]
        assert d["figures"]["open_sessions"]["change"] == -1
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"recording": 1}\n{"moment": {"at": "x"}}\n')
        out = run(url, "diff", str(bad))
        assert out.exit_code == 1 and "line 2" in out.output and "\n" not in out.output.strip()
        assert run(url, "diff", str(a), "--from", "1h").exit_code == 1
        assert run(url, "diff", str(a), "--from", "soon").exit_code == 2
        assert run(url, "diff", str(tmp_path / "none.jsonl")).exit_code == 1


def served_and_recorded(path, args: list[str], needles: list[str]) -> list[dict]:
    """``radixtop serve --record path`` (the demo, ``args`` more) as a real process, ended by SIGTERM
    once the recording holds each of ``needles``; the recording's lines."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixtop.cli.main", "serve", "--port", str(port), "--record",
                             str(path), "--arrival-rate", "40", "--sessions", "30", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_serve(proc, f"http://127.0.0.1:{port}", "serve --record")
        deadline = time.monotonic() + 90
        while not path.exists() or not all(needle in path.read_text() for needle in needles):
            assert time.monotonic() < deadline and proc.poll() is None, "nothing recorded"
            time.sleep(0.2)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    recorded = lines(path)
    assert recorded and "end" in recorded[-1], out
    return recorded


def test_serve_record_writes_its_own_history_while_it_serves(tmp_path):
    path = tmp_path / "serve.jsonl"
    recorded = served_and_recorded(path, [], ['"served"'])
    assert recorded[0]["recording"] == 2 and "end" in recorded[-1]
    assert of("served", recorded) and of("moment", recorded)
    exists = subprocess.run([sys.executable, "-m", "radixtop.cli.main", "serve", "--port", str(free_port()),
                             "--record", str(path)], capture_output=True, text=True, timeout=60)
    assert exists.returncode == 2 and "never overwritten" in exists.stderr


def test_serve_beside_records_from_radixtops_process_while_the_engine_serves(tmp_path):
    """``serve --beside --record``: the history is kept in radixtop's process beside the engine
    (from the engine's records); the recording reads it there over the admin API, as ``radixtop
    record`` would: removals (the demo's closes), moments, the engine's requests with their tokens
    (told beside as ``OP`` records: what a replay of it needs), and its end on SIGTERM."""
    path = tmp_path / "beside.jsonl"
    recorded = served_and_recorded(path, ["--beside", "--never-closed", "0"],
                                   ['"removed"', '"moment"', '"op":"finish"'])
    assert recorded[0]["recording"] == 2 and "end" in recorded[-1]
    assert of("removed", recorded) and of("moment", recorded)
    served = of("served", recorded)
    begins = [e for e in served if e["op"] == "begin"]
    assert begins and all(e.get("reuse", 0) + len(e["tokens"]) == e["prompt_tokens"] and e["request_id"] for e in begins)
    assert {e["op"] for e in served} >= {"begin", "finish", "close"}


def test_a_sessions_turn_is_written_as_what_it_reuses_of_its_last_and_read_back_whole(engine, tmp_path):
    """A multi-turn session's prompt grows with each turn (its last prompt, the answer, a new
    message): the recording writes each turn as the tokens it reuses of the session's last turn
    (``reuse``) and the new ones, not the whole prompt again; read back (``diff``, ``replay``), each
    prompt is whole, as the engine saw it."""
    from radixtop.cli.recording import RecordingError, read_recording

    path = tmp_path / "turns.jsonl"
    prompts: list[list[int]] = []

    def talk() -> None:
        time.sleep(1.0)
        context: list[int] = []
        for turn in range(5):
            prompt = context + [100 + 20 * turn + k for k in range(20)]
            prompts.append(prompt)
            engine.call(lambda s, prompt=prompt, turn=turn: s.request(f"m{turn}", prompt, [90 + turn, 91], "m"))
            context = prompt + [90 + turn, 91]

    with recording_while(engine, path, talk):
        pass
    recorded = lines(path)
    assert recorded[0]["recording"] == 2
    begins = [e for e in of("served", recorded) if e["op"] == "begin" and e["session_id"] == "m"]
    assert [e.get("reuse", 0) for e in begins] == [0] + [len(p) + 2 for p in prompts[:-1]]
    assert [len(e["tokens"]) for e in begins] == [20] * 5  # (what each turn added, not its whole prompt)
    read = [e for e in read_recording(path).served if e.op == "begin" and e.session_id == "m"]
    assert [list(e.tokens) for e in read] == prompts
    assert [e.prompt_tokens for e in read] == [len(p) for p in prompts]
    # a turn the file does not hold (a line taken out): the turns reusing it have no tokens known,
    # the rest is read; a reuse that is not one: the line named
    text = path.read_text().splitlines()
    first = next(n for n, line in enumerate(text) if '"request_id":"m0"' in line and '"op":"begin"' in line)
    (cut := tmp_path / "cut.jsonl").write_text("\n".join(line for n, line in enumerate(text) if n != first) + "\n")
    assert [e.tokens for e in read_recording(cut).served if e.op == "begin" and e.session_id == "m"] == [None] * 4
    second = next(n for n, line in enumerate(text) if '"request_id":"m1"' in line and '"op":"begin"' in line)
    for bad in ('"reuse":-1', '"reuse":true', '"reuse":"22"'):
        (broken := tmp_path / "broken.jsonl").write_text("\n".join(
            line.replace('"reuse":22', bad) if n == second else line for n, line in enumerate(text)) + "\n")
        with pytest.raises(RecordingError) as refused:
            read_recording(broken)
        assert f"line {second + 1}: a reuse of" in str(refused.value) and "\n" not in str(refused.value)
