"""``radixtop replay --format recording``: a recording of a server's own traffic, replayed on a fresh
bundled cache (issue 29's what-if on real traffic). Against a real admin API server whose engine
serves a multi-turn workload on a tight pool: at the server's own pool and policy the replay gives
every request the very hit the server gave it; on a larger pool it loses less; what the recording
cannot replay is said, not guessed."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import OutOfSlotsError, Scheduler
from tests.support.live_server import running_server

TOKEN = "replay-recording-token"
CAPACITY = 256


def run(*args: str, url: str = ""):
    return CliRunner().invoke(app, list(args), env={"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN})


def said(result) -> str:
    """A command's output as one line (the console wraps at its width)."""
    return " ".join(result.output.split())


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def workload(engine: Engine, seed: int = 7) -> None:
    """Eight sessions' turns over one system prompt, two requests running at once, on a pool that
    cannot hold them all (evictions under pressure), with a close, an abort, an evict and a flush
    asked, and a session registered."""
    rng = random.Random(seed)
    system = list(range(1000, 1024))
    story = {f"s{k}": system + [2000 + k] for k in range(8)}
    running: list[tuple[str, str]] = []
    n = 0

    def finish(rid: str, sid: str) -> None:
        out = [rng.randrange(5000, 6000) for _ in range(4)]
        try:
            engine.call(lambda s: s.finish(rid, out))
        except OutOfSlotsError:
            engine.call(lambda s: s.abort(rid))
            return
        story[sid] = story[sid] + out + [rng.randrange(3000, 4000) for _ in range(3)]

    for turn in range(150):
        if turn == 20:
            engine.call(lambda s: s.close_session("s3"))
            story["s3"] = system + [2003]
        if turn == 30 and running:
            rid, _ = running.pop()
            engine.call(lambda s, rid=rid: s.abort(rid))
        if turn == 40:
            engine.call(lambda s: s.evict_asked(40, "the test"))
            engine.call(lambda s: s.register_session("s9"))
        if turn == 100:
            engine.call(lambda s: s.flush())
        sid = rng.choice(sorted(story))
        if any(sid == other for _, other in running):
            continue
        if len(story[sid]) > 120:  # (a conversation that outgrew the pool starts again)
            story[sid] = system + [2100 + turn]
        n += 1
        rid = f"q{n}"
        prompt = story[sid]
        try:
            engine.call(lambda s, rid=rid, prompt=prompt, sid=sid: s.begin(rid, prompt, sid))
        except OutOfSlotsError:
            continue
        running.append((rid, sid))
        if len(running) > 1:
            finish(*running.pop(0))
    for rid, sid in running:
        finish(rid, sid)


@pytest.fixture
def recorded(tmp_path):
    """A recording of ``workload`` served by a real admin API server: started on an empty engine
    before the first request, ended after the last."""
    engine = Engine(Scheduler(get_geometry("tiny"), CAPACITY, device="cpu"), None).start()
    path = tmp_path / "traffic.jsonl"
    try:
        with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
            done = threading.Event()

            def serve() -> None:
                time.sleep(1.0)  # (the recording starts first: it reads from now on)
                workload(engine)
                done.set()

            worker = threading.Thread(target=serve)
            worker.start()
            result = run("record", str(path), "--for", "20s", "--every", "1s", url=url)
            worker.join()
            assert done.is_set() and result.exit_code == 0, result.output
            assert "requests" in result.output
            evicted = engine.call(lambda s: s.evicted_tokens)
    finally:
        engine.stop()
    return path, evicted


def test_a_replay_at_the_servers_own_pool_gives_every_request_the_hit_it_was_served_with(recorded):
    path, evicted = recorded
    served = [line["served"] for line in lines(path) if "served" in line]
    begins = [e for e in served if e["op"] == "begin"]
    assert {e["op"] for e in served} >= {"begin", "finish", "abort", "close", "register", "evict", "flush"}
    assert len(begins) > 40 and evicted > 0  # (a pool too small: it evicted for room)

    result = run("replay", "--format", "recording", str(path), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (replayed,) = doc["runs"]
    assert replayed["settings"]["capacity"] == CAPACITY and replayed["settings"]["model"] == "tiny"
    assert [r["hit"] for r in replayed["results"] if r["op"] == "begin"] == [e["cached_tokens"] for e in begins]
    assert replayed["evicted_tokens"] == evicted
    served_figures = doc["trace"]["as_served"]
    assert served_figures["requests"] == len(begins) and served_figures["began_before"] == 0
    assert served_figures["cached_tokens"] == replayed["cached_tokens"] == sum(e["cached_tokens"] for e in begins)
    assert served_figures["tokens_at_start"] == 0 and served_figures["gaps"] == 0

    # what if the pool were larger: the same requests, fewer tokens lost
    text = run("replay", "--format", "recording", str(path), "--compare", "--capacity", f"{CAPACITY},4096")
    assert text.exit_code == 0, text.output
    assert "a recording of a server's own traffic" in said(text) and "lru · 4k" in text.output
    bigger = json.loads(run("replay", "--format", "recording", str(path), "--capacity", "4096", "--json").stdout)
    assert bigger["runs"][0]["cached_tokens"] > replayed["cached_tokens"]
    # lost: what a session's own previous turn had that the cache no longer held
    assert replayed["lost_tokens"] > bigger["runs"][0]["lost_tokens"]


def test_what_a_recording_cannot_replay_is_said(recorded, tmp_path):
    path, _ = recorded
    text = path.read_text().splitlines()
    served_at = [n for n, line in enumerate(text) if '"served"' in line]
    # a recording that began while a request ran: its finish is left out, and said so
    first_begin = next(n for n in served_at if '"op":"begin"' in text[n])
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(line for n, line in enumerate(text) if n != first_begin) + "\n")
    out = json.loads(run("replay", "--format", "recording", str(cut), "--json").stdout)
    assert out["trace"]["as_served"]["began_before"] == 1
    assert "1 requests that began before the recording" in said(run("replay", "--format", "recording", str(cut)))

    # requests from before its first moment (as --kept writes them): the tree then is not known
    first_moment = next(n for n, line in enumerate(text) if '"moment"' in line)
    kept = tmp_path / "kept.jsonl"
    kept.write_text("\n".join(line for n, line in enumerate(text) if n != first_moment) + "\n")
    assert json.loads(run("replay", "--format", "recording", str(kept), "--json").stdout)[
        "trace"]["as_served"]["tokens_at_start"] is None
    assert "the tree then is not known" in said(run("replay", "--format", "recording", str(kept)))

    # a gap (the target down, or restarted: its request ids may come again): the requests running
    # there are aborted at it, and the replay goes on
    gapped = tmp_path / "gap.jsonl"
    gap = '{"gap": {"at": %s, "reason": "the target is down"}}' % json.loads(text[first_begin])["served"]["at"]
    gapped.write_text("\n".join([*text[:first_begin + 1], gap, *text[first_begin + 1:]]) + "\n")
    out = run("replay", "--format", "recording", str(gapped), "--json")
    assert out.exit_code == 0, out.output
    served = json.loads(out.stdout)["trace"]["as_served"]
    assert served["gaps"] == 1 and served["cut_by_gaps"] == 1 and served["began_before"] == 1
    assert "1 requests running at a gap aborted there" in said(run("replay", "--format", "recording", str(gapped)))

    # a target that told no requests (radixtop beside SGLang): one line, not an empty replay
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join(line for line in text if '"served"' not in line) + "\n")
    none = run("replay", "--format", "recording", str(bare))
    assert none.exit_code == 2 and "no requests recorded" in none.output and "\n" not in none.output.strip()

    # a token id that is not one: the line named
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(line.replace('"tokens":[', '"tokens":[-1,', 1) if n == first_begin else line
                             for n, line in enumerate(text)) + "\n")
    refused = run("replay", "--format", "recording", str(bad))
    assert refused.exit_code == 2 and f"line {first_begin + 1}" in refused.output, refused.output
    assert run("replay", "--format", "recording", str(path), "--scale", "2").exit_code == 2
