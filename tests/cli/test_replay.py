"""`radixtop replay`: the JSON document, the summary, and clear errors for bad traces."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from radixtop.cli.main import app
from radixtop.gpu_backend.traces.ops import MAX_LINE_BYTES, TraceError, read_lines
from tests.support import REPO

runner = CliRunner()

TRACE = "\n".join([
    '{"op":"request","input":[1,2,3,4],"output":[5,6],"session":"a"}',
    '# comments and blank lines are skipped',
    '',
    '{"op":"begin","id":"r1","input":[1,2,3,9],"session":"b"}',
    '{"op":"close","session":"a"}',
    '{"op":"register","session":"a"}',
    '{"op":"finish","id":"r1","output":[10]}',
    '{"op":"evict","tokens":1}',
]) + "\n"


def write(tmp_path, text: str):
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    return str(path)


def test_replay_json_is_exactly_one_document(tmp_path):
    result = runner.invoke(app, ["replay", write(tmp_path, TRACE), "--capacity", "64", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # one document, nothing else on stdout
    assert doc["results"] == [
        {"op": "request", "hit": 0},
        {"op": "begin", "hit": 3},
        # The begin split [1..6] at 3 and locks [1,2,3]: a's close frees only [4,5,6].
        {"op": "close", "freed_nodes": 1, "freed_tokens": 3},
        {"op": "register"},
        {"op": "finish"},
        {"op": "evict", "evicted_tokens": 2},
    ]
    assert doc["tree"] == [{"path": [1, 2, 3], "tokens": 3, "lock_ref": 0, "holders": []}]
    assert doc["stats"] == {"total_size": 3, "evictable_size": 3, "protected_size": 0, "available_size": 61}
    assert doc["timing"]["ops_s"] >= 0


def test_replay_summary_and_policies(tmp_path):
    path = write(tmp_path, TRACE)
    result = runner.invoke(app, ["replay", path, "--capacity", "64"])
    assert result.exit_code == 0 and "evicted" in result.stdout and "2 tokens" in result.stdout
    deref = runner.invoke(app, ["replay", path, "--close-policy", "deref", "--page-size", "2", "--json"])
    assert deref.exit_code == 0, deref.output
    assert json.loads(deref.stdout)["results"][2] == {"op": "close", "freed_nodes": 0, "freed_tokens": 0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"op":"teleport"}', "line 1: unknown op 'teleport'"),
        ('{"op":"begin","input":[1]}', "line 1: missing field 'id'"),
        ('{"op":"request","output":[1]}', "line 1: missing field 'input'"),
        ('{"op":"finish","id":"ghost","output":[1]}', "line 1: request 'ghost' is not running"),
        ('{"op":"request","input":[1],"output":[2]}\n{"op":"evict","tokens":-1}', "line 2: field 'tokens'"),
        ('{"op":"request","input":["a"],"output":[]}', "line 1: field 'input' must be a list of integer"),
        ('{"op":"close"}', "line 1: missing field 'session'"),
        ('not json', "line 1: not valid JSON"),
        ('[1,2]', "line 1: an op must be a JSON object"),
        ('{"op":"begin","id":"x","input":[1]}\n{"op":"begin","id":"x","input":[2]}', "line 2: request 'x' is already running"),
        ('{"op":"request","input":[1,2,3,4,5,6,7,8,9],"output":[]}', "line 1: out of KV slots"),
    ],
)
def test_bad_traces_stop_with_the_line_and_no_traceback(tmp_path, text, message):
    result = runner.invoke(app, ["replay", write(tmp_path, text + "\n"), "--capacity", "8", "--json"])
    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_replay_usage_errors(tmp_path):
    missing = runner.invoke(app, ["replay", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "cannot read trace" in missing.stderr
    bad = runner.invoke(app, ["replay", write(tmp_path, TRACE), "--eviction-policy", "random"])
    assert bad.exit_code == 2 and "unknown eviction policy 'random'" in bad.stderr
    pages = runner.invoke(app, ["replay", write(tmp_path, TRACE), "--capacity", "9", "--page-size", "2"])
    assert pages.exit_code == 2 and "not a multiple" in pages.stderr


def test_demo_view_runs_records_and_its_trace_replays(tmp_path):
    record = tmp_path / "demo.jsonl"
    result = runner.invoke(app, ["demo", "--duration", "1", "--capacity", "4096", "--model", "tiny",
                                 "--device", "cpu", "--sessions", "8", "--record", str(record)])
    assert result.exit_code == 0, result.output
    assert "radixtop demo · tiny on cpu" in result.stdout and "sessions by bytes" in result.stdout
    lines = record.read_text().splitlines()
    assert any('"op":"finish"' in line for line in lines)
    replayed = runner.invoke(app, ["replay", str(record), "--capacity", "4096", "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert len(json.loads(replayed.stdout)["results"]) == len(lines)


def test_abort_op_gives_back_a_running_requests_slots(tmp_path):
    text = '{"op":"begin","id":"r1","input":[1,2,3]}\n{"op":"abort","id":"r1"}\n{"op":"abort","id":"r1"}\n'
    result = runner.invoke(app, ["replay", write(tmp_path, text), "--capacity", "8", "--json"])
    assert result.exit_code == 1 and "line 3: request 'r1' is not running" in result.stderr
    ok = runner.invoke(app, ["replay", write(tmp_path, "\n".join(text.splitlines()[:2])), "--capacity", "8", "--json"])
    doc = json.loads(ok.stdout)
    assert doc["results"][1] == {"op": "abort"} and doc["stats"]["available_size"] == 8


# ----- malformed traces: each stops at its line, with one clear line on stderr -----

OK = b'{"op":"request","input":[1,2],"output":[3],"session":"a"}\n'
MALFORMED = {
    "binary_garbage": (bytes(range(256)) * 4, "line 1: not valid JSON"),
    "invalid_utf8": (OK + b'{"op":"close","session":"\xff\xfe"}\n', "line 2: not UTF-8 text (byte 0xff at column 26)"),
    "utf16": ('{"op":"close","session":"a"}\n'.encode("utf-16"), "line 1: not UTF-8 text (byte 0xff at column 1)"),
    "latin1_session": (OK + '{"op":"close","session":"caf\u00e9"}\n'.encode("latin-1"), "line 2: not UTF-8 text"),
    "truncated_last_line": (OK + b'{"op":"request","input":[1,2', "line 2: not valid JSON"),
    "nul_byte": (OK + b'{"op":"close","session":"a"}\x00\n', "line 2: not valid JSON"),
    "byte_order_mark": (b"\xef\xbb\xbf" + OK, "line 1: not valid JSON"),
    "json_array_of_ops": (b"[" + OK.strip() + b"]\n", "line 1: an op must be a JSON object"),
    "json_string": (b'"request"\n', "line 1: an op must be a JSON object"),
    "json_null": (OK + b"null\n", "line 2: an op must be a JSON object"),
    "deeply_nested": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1: not valid JSON (nested too deeply)"),
    "number_of_5000_digits": (b'{"op":"evict","tokens":' + b"9" * 5000 + b"}\n",
                              "line 1: not valid JSON (a number too long"),
    "token_id_over_int64": (b'{"op":"request","input":[9223372036854775808],"output":[]}\n',
                            "line 1: field 'input' has a token id over 2**63-1"),
    "huge_output_token": (OK + b'{"op":"request","input":[1],"output":[1e30]}\n',
                          "line 2: field 'output' must be a list of integer token ids"),
    "evict_over_int64": (b'{"op":"evict","tokens":100000000000000000000}\n',
                         "line 1: field 'tokens' must be a non-negative"),
    "evict_infinity": (b'{"op":"evict","tokens":Infinity}\n', "line 1: field 'tokens' must be a non-negative"),
    "evict_negative": (OK + OK + b'{"op":"evict","tokens":-3}\n', "line 3: field 'tokens' must be a non-negative"),
    "negative_token_id": (b'{"op":"begin","id":"r","input":[1,-2]}\n', "line 1: field 'input' has a negative token id"),
    "nan_token_id": (b'{"op":"request","input":[NaN],"output":[]}\n', "line 1: field 'input' must be a list of"),
    "bool_token_id": (b'{"op":"request","input":[true],"output":[]}\n', "line 1: field 'input' must be a list of"),
    "input_a_string": (b'{"op":"request","input":"1,2","output":[]}\n', "line 1: field 'input' must be a list of"),
    "input_null": (b'{"op":"begin","id":"r","input":null}\n', "line 1: field 'input' must be a list of integer"),
    "op_missing": (b'{"input":[1],"output":[2]}\n', "line 1: unknown op None"),
    "op_not_a_string": (b'{"op":["request"],"input":[1],"output":[2]}\n', "line 1: unknown op ['request']"),
    "op_in_capitals": (b'{"op":"REQUEST","input":[1],"output":[2]}\n', "line 1: unknown op 'REQUEST'"),
    "output_missing": (b'{"op":"finish","id":"r"}\n', "line 1: missing field 'output'"),
    "id_a_number": (b'{"op":"begin","id":7,"input":[1]}\n', "line 1: missing field 'id' (a non-empty string)"),
    "id_empty": (b'{"op":"abort","id":""}\n', "line 1: missing field 'id' (a non-empty string)"),
    "session_a_number": (b'{"op":"request","input":[1],"output":[2],"session":5}\n', "line 1: field 'session' must be"),
    "session_empty": (b'{"op":"close","session":""}\n', "line 1: field 'session' must be a non-empty string"),
    "register_null_session": (b'{"op":"register","session":null}\n', "line 1: field 'session' must be a non-empty"),
    "finish_before_its_begin": (b'{"op":"finish","id":"r","output":[2]}\n{"op":"begin","id":"r","input":[1]}\n',
                                "line 1: request 'r' is not running"),
    "abort_before_its_begin": (OK + b'{"op":"abort","id":"r"}\n{"op":"begin","id":"r","input":[1]}\n',
                               "line 2: request 'r' is not running"),
    "id_reused_while_running": (b'{"op":"begin","id":"r","input":[1]}\n{"op":"finish","id":"r","output":[2]}\n'
                                b'{"op":"begin","id":"r","input":[1]}\n{"op":"begin","id":"r","input":[3]}\n',
                                "line 4: request 'r' is already running"),  # reused after its finish is fine
    "finished_twice": (b'{"op":"begin","id":"r","input":[1]}\n{"op":"finish","id":"r","output":[2]}\n'
                       b'{"op":"finish","id":"r","output":[2]}\n', "line 3: request 'r' is not running"),
    "line_numbers_count_comments_and_blanks": (b"# a comment\n\n   \n" + OK + b"{oops}\n", "line 5: not valid JSON"),
    "carriage_return_line_ends": (OK.rstrip() + b"\r" + OK.rstrip() + b"\r{oops}\r", "line 3: not valid JSON"),
    "crlf_line_ends": (OK.rstrip() + b"\r\n{oops}\r\n", "line 2: not valid JSON"),
}
MALFORMED_COUNT = {"cases": 0}


def check_refused(result, message: str) -> None:
    """Exit 1, nothing on stdout, and exactly one line on stderr that names the line; no
    exception other than the exit itself (CliRunner would hide a traceback's text)."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("radixtop: ") and "Traceback" not in result.output
    MALFORMED_COUNT["cases"] += 1


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_traces_stop_at_their_line(tmp_path, name):
    content, message = MALFORMED[name]
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(content)
    check_refused(runner.invoke(app, ["replay", str(path), "--capacity", "64", "--json"]), f"{path}: {message}")
    summary = runner.invoke(app, ["replay", str(path), "--capacity", "64"])  # the same without --json
    assert summary.exit_code == 1 and message in summary.stderr and summary.stdout == ""


def test_malformed_trace_on_stdin_names_its_line():
    content, message = MALFORMED["invalid_utf8"]
    check_refused(runner.invoke(app, ["replay", "-", "--json"], input=content), f"-: {message}")


def test_a_50_mb_line_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.write(OK)
        f.write(b'{"op":"request","output":[],"input":[')
        f.write(b"1," * (25 * 2**20))
        f.write(b"1]}\n")
    assert path.stat().st_size > 50 * 2**20 > MAX_LINE_BYTES
    check_refused(runner.invoke(app, ["replay", str(path), "--json"]),
                  f"line 2: longer than {MAX_LINE_BYTES:,} bytes (one op is one line: is this a trace?)")


def test_read_lines_splits_as_text_files_do_and_bounds_each_line():
    for data in (b"a\nb\n", b"a\r\nb", b"a\rb\r\n\r\nc", b"a\r\r\n", b"a\r", b"a\r\r", b"", b"\n", b"x" * 10 + b"\n"):
        as_text = [line.rstrip("\n") for line in io.TextIOWrapper(io.BytesIO(data), newline=None)]
        assert [line.decode() for line in read_lines(io.BytesIO(data), limit=10)] == as_text, data
    with pytest.raises(TraceError, match="line 2: longer than 10 bytes"):
        list(read_lines(io.BytesIO(b"x" * 10 + b"\n" + b"y" * 11), limit=10))


def test_an_empty_trace_is_an_empty_cache(tmp_path):
    for name, content in (("empty", b""), ("blank", b"\n\n  \n"), ("comments", b"# nothing yet\n")):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content)
        result = runner.invoke(app, ["replay", str(path), "--capacity", "64", "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["results"] == [] and doc["tree"] == [] and doc["stats"]["available_size"] == 64
        summary = runner.invoke(app, ["replay", str(path), "--capacity", "64"])
        assert summary.exit_code == 0 and "none" in summary.stdout


def test_a_directory_or_unreadable_path_is_a_usage_error(tmp_path):
    for path, why in ((tmp_path, "Is a directory"), (tmp_path / "missing.jsonl", "No such file")):
        result = runner.invoke(app, ["replay", str(path), "--json"])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
        assert result.stderr.startswith(f"radixtop: cannot read trace {path}: {why}")
        assert result.stderr.count("\n") == 1
        MALFORMED_COUNT["cases"] += 1


@pytest.mark.parametrize("name", ["invalid_utf8", "number_of_5000_digits", "deeply_nested", "token_id_over_int64"])
def test_serve_refuses_the_same_traces_at_start(tmp_path, name):
    """`radixtop serve --trace` reads traces the same way, and stops before it listens."""
    content, message = MALFORMED[name]
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(content)
    with socket.socket() as taken:  # a trace wrongly accepted ends at the bind, not in a server
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = runner.invoke(app, ["serve", "--trace", str(path), "--model", "tiny", "--capacity", "64",
                                     "--device", "cpu", "--port", str(taken.getsockname()[1])],
                               env={"RADIXTOP_TOKEN": "t"})
    check_refused(result, f"{path}: {message}")


def test_a_real_process_prints_one_line_and_no_traceback(tmp_path):
    """Outside CliRunner: the real interpreter's recursion limit and stderr."""
    for name in ("deeply_nested", "invalid_utf8"):
        content, message = MALFORMED[name]
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content)
        done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "replay", str(path), "--json"], capture_output=True,
                              text=True, timeout=120, cwd=REPO)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.startswith(f"radixtop: {path}: {message}")
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        MALFORMED_COUNT["cases"] += 1


# ----- memory follows what a trace uses, not --capacity; the trace is read as it is applied -----

ADDRESS_SPACE = 3 * 2**30
"""RLIMIT_AS for a replay child: a fresh `radixtop replay` maps about 1 GiB (torch included).
Before the allocator kept free ranges, a 2e9-token pool wanted 15.8 GB (one int64 and one bool a
slot) and a 1e9-token page 23.6 GB; under this limit they fail at once instead of filling the box."""


def replay_child(*args: str, stdin=None, **kwargs) -> subprocess.Popen:
    """`radixtop replay ARGS` in a real process whose address space is bounded."""
    import resource

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    return subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "replay", *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=bound, **kwargs)


@pytest.mark.parametrize(("capacity", "page_size"), [(2_000_000_000, 1), (10**12, 1), (10**12, 4096)])
def test_a_huge_pool_costs_only_what_the_trace_uses(tmp_path, capacity, page_size):
    request = {"op": "request", "input": list(range(1, 4098)), "output": [1], "session": "a"}
    path = write(tmp_path, json.dumps(request) + "\n")
    child = replay_child(path, "--capacity", str(capacity), "--page-size", str(page_size), "--json")
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    cached = 4098 // page_size * page_size  # whole pages stay in the tree; the tail is freed
    assert json.loads(out)["stats"]["available_size"] == capacity - cached


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capacity", "1000000000", "--page-size", "1000000000"], "page_size 1000000000 must be 1 to 65,536"),
        (["--capacity", str(2**63)], "slot indices are int64"),
        (["--capacity", str(10**18), "--model", "llama-3-70b"], "bytes do not fit in 64 bits"),
    ],
)
def test_a_pool_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, args, message):
    child = replay_child(write(tmp_path, TRACE), *args, "--json")
    out, err = child.communicate(timeout=120)
    assert child.returncode == 2 and out == "", err
    assert err.startswith("radixtop: ") and message in err and err.count("\n") == 1, err


def test_replay_applies_each_op_as_it_is_read():
    """The first bad op stops the replay before another line is read, so a bad start of a huge
    trace is told at once and memory never follows the trace's size."""
    from radixtop.gpu_backend.traces.ops import replay

    read = []

    def lines():
        for line in ('{"op":"request","input":[1],"output":[2]}', '{"op":"finish","id":"ghost","output":[1]}'):
            read.append(line)
            yield line
        raise AssertionError("read past the bad line")

    with pytest.raises(TraceError, match="line 2: request 'ghost' is not running"):
        replay(lines(), capacity=64)
    assert len(read) == 2


def test_a_bad_first_line_is_told_before_the_rest_arrives():
    """On stdin that stays open (a trace still being written, or a huge one), the error comes at
    once rather than after the whole trace was read."""
    child = replay_child("-", "--json", stdin=subprocess.PIPE)
    try:
        child.stdin.write('{"op":"finish","id":"ghost","output":[1]}\n' + TRACE)
        child.stdin.flush()
        child.wait(timeout=60)  # stdin is still open: only a streaming replay ends now
        assert child.returncode == 1
        err = child.stderr.read()
        assert err == "radixtop: -: line 1: request 'ghost' is not running\n"
    finally:
        child.kill()
        child.communicate()


@pytest.fixture(scope="module", autouse=True)
def report():
    """One JSON line: how many malformed traces were refused (also to $RADIXTOP_SECURITY_REPORT)."""
    yield
    line = json.dumps({"module": "test_cli_replay", "malformed_kinds": len(MALFORMED),
                       "refusals_checked": MALFORMED_COUNT["cases"]}, separators=(",", ":"))
    print("\n" + line)
    if path := os.environ.get("RADIXTOP_SECURITY_REPORT"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def test_replay_says_which_model_its_bytes_assume(tmp_path):
    """Its figures were for `tiny` (16 MiB a pool) beside the demo's 8 GiB, and it never said so:
    it now assumes the demo's model and names it; --model picks another."""
    path = write(tmp_path, TRACE)
    result = runner.invoke(app, ["replay", path, "--capacity", "64"])
    assert result.exit_code == 0, result.output
    assert "llama-3-8b (128.0 KiB/token)" in result.stdout
    result = runner.invoke(app, ["replay", path, "--capacity", "64", "--model", "tiny"])
    assert result.exit_code == 0 and "tiny (256 B/token)" in result.stdout, result.stdout


def test_compare_refuses_more_settings_than_a_table_can_show(tmp_path):
    """36,000 combinations ran and printed an unreadable table: a cap, said in one line."""
    capacities = ",".join(str(64 + i) for i in range(40))
    result = runner.invoke(app, ["replay", write(tmp_path, TRACE), "--compare", "--capacity", capacities,
                                 "--eviction-policy", "lru,lfu"])
    assert result.exit_code == 2, result.output
    assert "80 settings" in result.output and "at most" in result.output and result.output.count("\n") == 1
    ok = runner.invoke(app, ["replay", write(tmp_path, TRACE), "--compare", "--capacity", "64,128",
                             "--eviction-policy", "lru,lfu"])
    assert ok.exit_code == 0, ok.output
