"""`radixtop replay`: the JSON document, the summary, and clear errors for bad traces."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app

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
