"""`radixtop replay/serve/demo` of public traces (--format, --scale, --compare, --speed), run as a
user runs them: `radixtop ...` in a subprocess, on the excerpts in tests/data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from radixtop.adapters.http.client import RadixtopClient
from tests.support import REPO
from tests.support.live_server import free_port

DATA = REPO / "tests" / "data"
MOONCAKE = str(DATA / "mooncake_conversation_excerpt.jsonl")
TESTER = str(DATA / "kv_cache_tester")


def radixtop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command in a subprocess, on a terminal 200 columns wide (tables unwrapped)."""
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env={**os.environ, "COLUMNS": "200"})


def test_replay_mooncake_json_has_the_trace_one_run_and_a_result_per_op():
    done = radixtop("replay", "--format", "mooncake", MOONCAKE, "--scale", "8", "--capacity", "1m", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    last = max(json.loads(line)["timestamp"] for line in open(MOONCAKE))
    assert doc["trace"] == {"format": "mooncake", "requests": 37, "sessions": 26, "duration_s": last / 1000,
                            "block_size": 512, "scale": 8, "block_tokens": 64}
    (run,) = doc["runs"]
    assert run["settings"]["capacity"] == 2**20 and run["requests"] == 37 and run["refused"] == 0
    assert len(run["results"]) == run["ops"] == 37 + 26  # a request each, a close per session
    assert [r["op"] for r in run["results"]].count("close") == 26
    assert run["cached_tokens"] == sum(r.get("hit", 0) for r in run["results"]) > 0
    assert len(run["sessions"]) == 26 and run["sessions"]["m23"]["requests"] == 5
    assert 0 < run["hit_rate"] < 1 and run["evicted_tokens"] == 0


def test_compare_prints_every_setting_side_by_side_and_per_session():
    done = radixtop("replay", "--format", "kv-cache-tester", TESTER, "--scale", "8", "--compare",
                    "--capacity", "8k,64k", "--policy", "lru,lfu", "--json")
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [(r["settings"]["capacity"], r["settings"]["eviction_policy"]) for r in runs] == [
        (8192, "lru"), (8192, "lfu"), (65536, "lru"), (65536, "lfu")]
    assert all(r["evicted_tokens"] > 0 for r in runs[:2]) and all(r["evicted_tokens"] == 0 for r in runs[2:])
    assert runs[0]["cached_tokens"] < runs[2]["cached_tokens"]
    assert all(set(r["sessions"]) == {"trace_0277", "trace_0291", "trace_0291/agent_001",
                                      "trace_0291/agent_002"} for r in runs)
    assert "results" not in runs[0]
    text = radixtop("replay", "--format", "kv-cache-tester", TESTER, "--scale", "8", "--compare",
                    "--capacity", "8k,64k", "--close-policy", "free,deref", "--sessions", "2")
    assert text.returncode == 0, text.stderr
    out = text.stdout
    for label in ("lru · 8k · free", "lru · 8k · deref", "lru · 64k · free", "lru · 64k · deref"):
        assert label in out
    assert "cache hit rate" in out and "lost to eviction" in out and "peak memory" in out
    assert "the 2 of 4 with the most prompt tokens" in out and "trace_0291/agent_001" in out


def test_compare_works_on_radixtop_traces_too(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"op":"request","input":[1,2,3,4],"output":[5],"session":"a"}\n'
                    '{"op":"request","input":[9,9,9,9],"output":[5],"session":"b"}\n'
                    '{"op":"request","input":[1,2,3,4,5,6],"output":[7],"session":"a"}\n')
    done = radixtop("replay", str(path), "--compare", "--capacity", "8,64", "--json")
    assert done.returncode == 0, done.stderr
    small, big = json.loads(done.stdout)["runs"]
    assert big["cached_tokens"] == 5 and small["cached_tokens"] == 0 and small["evicted_tokens"] > 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--format", "mooncake", "GOOD", "--scale", "3"], 2, "radixtop: --scale 3 does not divide the trace's "
                                                              "512-token blocks"),
        (["--format", "mooncake", "BAD"], 1, "radixtop: BAD: line 2: missing field 'hash_ids'"),
        (["--format", "kv-cache-tester", "BAD"], 1, "radixtop: BAD: not valid JSON (Extra data; a "
                                                   "kv-cache-tester trace is one JSON document)"),
        (["--format", "kv-cache-tester", "LIST"], 1, "radixtop: LIST: not a kv-cache-tester trace"),
        (["--format", "vllm", "BAD"], 2, "radixtop: unknown --format 'vllm'; use radixtop, mooncake, kv-cache-tester"),
        (["--format", "mooncake", "BAD", "--capacity", "8k,16k"], 2, "radixtop: several capacities or policies "
                                                                     "need --compare"),
        (["--format", "mooncake", "BAD", "--capacity", "lots"], 2, "radixtop: capacity 'lots' is not a positive"),
        (["--format", "mooncake", "MISSING"], 2, "radixtop: cannot read trace MISSING: No such file"),
    ],
)
def test_bad_traces_and_options_are_one_line_and_an_exit_code(tmp_path, args, code, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
                   '{"timestamp": 1, "input_length": 600, "output_length": 1}\n')
    missing = tmp_path / "missing.jsonl"
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    paths = {"BAD": str(bad), "MISSING": str(missing), "GOOD": MOONCAKE, "LIST": str(listed)}
    args = [paths.get(a, a) for a in args]
    for name, path in paths.items():
        message = message.replace(name, path)
    done = radixtop("replay", *args)
    assert done.returncode == code and done.stdout == ""
    assert done.stderr.startswith(message), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_serve_plays_a_trace_in_real_time():
    """`radixtop serve --trace --format --speed`: the cache fills as the trace's time passes, and
    the sessions close as their conversations end."""
    port = free_port()
    token = "a-test-token-of-enough-characters"
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", TESTER, "--format",
         "kv-cache-tester", "--scale", "8", "--speed", "100", "--model", "tiny", "--capacity", "65536",
         "--device", "meta", "--port", str(port)],
        env={**os.environ, "RADIXTOP_TOKEN": token}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    client = RadixtopClient(f"http://127.0.0.1:{port}", token=token, timeout=5)
    try:
        deadline = time.monotonic() + 90
        seen = []
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                stats = client.stats()
            except Exception:  # not listening yet
                stats = None
            if stats is not None:
                seen.append((time.monotonic(), stats.prompt_tokens, stats.closes))
                if stats.closes == 4:
                    break
            assert time.monotonic() < deadline, seen[-3:]
            time.sleep(0.2)
        started = next(t for t, prompt, _ in seen if prompt > 0)
        # trace_0291's sub-agents start 1148 s in: about 11.5 s at x100, not at once.
        assert seen[-1][0] - started > 8
        assert any(0 < prompt < seen[-1][1] for _, prompt, _ in seen)  # it grew while we watched
        assert client.stats().total_tokens == 0  # every session closed: the free policy freed it all
        assert "kv_cache_tester" in client.stats().target
    finally:
        client.release()
        proc.terminate()
        proc.wait(10)


def test_serve_says_at_start_how_many_of_a_traces_requests_can_never_fit_the_pool():
    """Mooncake's requests run to 87k tokens; on a pool of 40,000 those over it would each be
    refused as they come, one line at a time: serve says so once before it plays."""
    over = sum(1 for line in open(MOONCAKE) if json.loads(line)["input_length"] > 40_000)
    assert 0 < over < 37
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", MOONCAKE, "--format", "mooncake",
         "--speed", "1", "--model", "tiny", "--capacity", "40000", "--device", "meta", "--port", str(port)],
        env={**os.environ, "RADIXTOP_TOKEN": "a-test-token-of-enough-characters"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, cwd=REPO)
    client = RadixtopClient(f"http://127.0.0.1:{port}", timeout=5)
    try:
        deadline = time.monotonic() + 60
        while True:  # listening: the note, if any, came before
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                client.stats()
                break
            except Exception:
                time.sleep(0.2)
    finally:
        client.release()
        proc.terminate()
        proc.wait(10)
    first = proc.stderr.read().splitlines(keepends=True)[0]
    assert first == (f"radixtop: {over} of the trace's 37 requests need more KV slots than the pool has (40,000; "
                     "the largest needs 87,169): they will never start. --capacity sets the pool; --scale shrinks "
                     "the trace's blocks\n")


def test_demo_plays_a_trace_and_says_how_far_it_is():
    done = radixtop("demo", "--trace", MOONCAKE, "--format", "mooncake", "--scale", "8", "--speed", "50",
                    "--duration", "2", "--device", "meta", "--model", "tiny")
    assert done.returncode == 0, done.stderr
    assert "trace at" in done.stdout and "(x50)" in done.stdout
    refused = radixtop("demo", "--format", "mooncake", "--duration", "1")
    assert refused.returncode == 2 and refused.stderr == "radixtop: --format and --scale go with --trace\n"


def test_the_dashboards_embedded_engine_plays_a_trace(tmp_path):
    """`radixtop tui --trace ...` starts its embedded engine as `serve --trace ...` (demo_server's
    trace_args); a trace that cannot be read stops it at start with the one-line reason."""
    from radixtop.cli.embedded import demo_server

    args = ("--trace", MOONCAKE, "--format", "mooncake", "--scale", "8", "--speed", "200.0")
    with demo_server("embedded demo · tiny · excerpt", "tiny", 65536, 4, 0, 0.0, trace_args=args) as child:
        client = RadixtopClient(child.url, token=child.token, timeout=5)
        try:
            deadline = time.monotonic() + 60
            while client.stats().closes < 26:  # 453 s of trace at x200: about 2.3 s
                assert time.monotonic() < deadline, client.stats()
                time.sleep(0.2)
            stats = client.stats()
            assert stats.prompt_tokens > stats.cached_tokens > 0 and stats.target.endswith("excerpt")
        finally:
            client.release()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(RuntimeError, match="bad.jsonl: line 1: missing field 'input_length'"):
        with demo_server("x", "tiny", 4096, 4, 0, 0.0, trace_args=("--trace", str(bad), "--format", "mooncake"),
                         max_restarts=0):
            pass
    refused = radixtop("tui", "--trace", MOONCAKE, "--url", "http://127.0.0.1:9")
    assert refused.returncode == 2 and "--trace plays on the embedded engine" in refused.stderr


def test_serve_at_speed_zero_applies_the_whole_trace_before_it_listens():
    port = free_port()
    token = "a-test-token-of-enough-characters"
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", MOONCAKE, "--format", "mooncake",
         "--scale", "8", "--speed", "0", "--model", "tiny", "--capacity", "6144", "--device", "meta",
         "--port", str(port)],
        env={**os.environ, "RADIXTOP_TOKEN": token}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    client = RadixtopClient(f"http://127.0.0.1:{port}", token=token, timeout=5)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                stats = client.stats()
                break
            except Exception:  # not listening yet
                assert time.monotonic() < deadline
                time.sleep(0.2)
        # The first answer already has all of it: 26 sessions closed, and the 87,169-token request
        # (10,897 at scale 8) refused by a 6,144-token pool instead of stopping the server.
        assert stats.closes == 26 and stats.evicted_tokens > 0 and stats.prompt_tokens > 0
    finally:
        client.release()
        proc.terminate()
        proc.wait(10)


def test_a_session_id_with_markup_and_a_terminal_code_is_shown_as_written(tmp_path):
    """Session ids come from the trace file: a table of them is plain text (a MarkupError and a
    traceback before)."""
    trace = json.loads((DATA / "kv_cache_tester" / "trace_0277.json").read_text())
    trace["id"] = "[/]evil\x1b[2J"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(trace))
    done = radixtop("replay", "--format", "kv-cache-tester", str(path), "--scale", "8", "--compare",
                    "--capacity", "64k")
    assert done.returncode == 0, done.stderr
    assert "[/]evil?[2J" in done.stdout and "\x1b" not in done.stdout


HOSTILE_LENGTHS = [
    # One 94-byte Mooncake line asked for a 50M-token prompt (2.6 GB built), 3e9 a MemoryError.
    ("mooncake", '{"timestamp": 0, "input_length": 50000000, "output_length": 1, "hash_ids": [1]}\n',
     "line 1: input_length 50,000,000 is more than its 1 hash_ids blocks of 512 tokens (and a partial block) "
     "hold"),
    ("mooncake", '{"timestamp": 0, "input_length": 3000000000, "output_length": 1, "hash_ids": [1]}\n',
     "line 1: input_length 3,000,000,000 is more than"),
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 3000000000, "hash_ids": [1]}\n',
     "line 1: output_length 3,000,000,000 is over radixtop's maximum of 2,097,152 tokens a request"),
    ("mooncake", '{"timestamp": 0, "input_length": 5000000, "output_length": 1, "hash_ids": '
     + json.dumps(list(range(10_000))) + '}\n',
     "line 1: input_length 5,000,000 is over radixtop's maximum of 2,097,152 tokens a request"),
    ("kv-cache-tester", '{"block_size": 64, "requests": [{"t": 0, "in": 40000000, "out": 1, "hash_ids": [1]}]}',
     "requests[0]: in 40,000,000 is more than its 1 hash_ids blocks of 64 tokens (and a partial block) hold"),
    ("kv-cache-tester", '{"block_size": 64, "requests": [{"t": 0, "in": 1, "out": 90000000000, "hash_ids": [1]}]}',
     "requests[0]: out 90,000,000,000 is over radixtop's maximum of 2,097,152 tokens a request"),
]


@pytest.mark.parametrize("fmt, text, message", HOSTILE_LENGTHS,
                         ids=["mooncake-50M", "mooncake-3e9", "mooncake-output", "mooncake-over-max", "tester-in",
                              "tester-out"])
@pytest.mark.parametrize("command", ["replay", "serve"])
def test_a_hostile_length_is_one_line_before_anything_is_built(tmp_path, fmt, text, message, command):
    """A length no block list backs, or over a sane maximum, is refused in one line as the trace
    is read, by `replay` and by `serve --trace` (which stops before it listens); the child's
    address space is bounded, so building the tokens would fail the test with a MemoryError."""
    import resource

    path = tmp_path / ("trace.jsonl" if fmt == "mooncake" else "trace.json")
    path.write_text(text)
    args = ["replay", "--format", fmt, str(path)] if command == "replay" else \
        ["serve", "--trace", str(path), "--format", fmt, "--port", "1", "--model", "tiny", "--device", "meta"]

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "RADIXTOP_TOKEN": "x" * 24},
                          preexec_fn=bound)
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr == f"radixtop: {path}: {message}" + done.stderr.split(message, 1)[-1], done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
