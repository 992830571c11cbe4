"""The admin API through FastAPI's TestClient: status codes, auth, audit, metrics, export, schema."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
import warnings

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

with warnings.catch_warnings():  # newer starlette asks for httpx2 here; httpx still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from radixtop.adapters.base import MAX_MATCH_TOKENS
from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http import params as http_params
from radixtop.adapters.http.schemas import (
    AuditPageOut,
    CapabilitiesOut,
    ChangesOut,
    ChildrenPageOut,
    CloseOut,
    ClosePlanOut,
    EvictOut,
    FlushOut,
    HealthOut,
    MatchOut,
    NodeDetailOut,
    SessionDetailOut,
    SessionsPageOut,
    StatsOut,
)
from radixtop.adapters.http.server import (
    EXPORT_CHUNK_ROWS,
    MAX_BODY,
    PayloadTooLarge,
    create_app,
    is_loopback,
    parse_tokens,
    serve,
)
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.model import ROOT_ID
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from tests.support import REPO
from tests.support.engines import build_engine
from tests.support.live_server import free_port

TOKEN = "s3cret-api-token-for-tests"
LOOPBACK = "http://127.0.0.1"  # the Host a loopback server answers to (TestClient sends "testserver")
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


def make_client(adapter, audit: AuditLog | None = None) -> TestClient:
    return TestClient(create_app(adapter, TOKEN, audit or AuditLog(None)), base_url=LOOPBACK, raise_server_exceptions=False)


@pytest.fixture
def client(engine, audit):
    return make_client(BundledAdapter(engine), audit)


@pytest.fixture
def read_only_client(engine, audit):
    return make_client(BundledAdapter(engine, read_only=True), audit)


def error_code(response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert "Traceback" not in response.text
    return body["error"]["code"]


def prompt_node_id(client) -> int:
    return client.get("/v1/nodes/root/children").json()["children"][0]["id"]


# ----- 200s, each answer valid against its published schema -----


def test_reads_answer_with_their_schemas(client):
    node_id = prompt_node_id(client)
    for path, schema in (
        ("/v1/capabilities", CapabilitiesOut), ("/v1/stats", StatsOut), ("/v1/nodes/root", NodeDetailOut),
        (f"/v1/nodes/{node_id}?token_offset=1&token_limit=2", NodeDetailOut),
        ("/v1/nodes/0/children?order=tokens&limit=1", ChildrenPageOut),
        ("/v1/sessions?order=id&offset=1&limit=2", SessionsPageOut), ("/v1/sessions/a", SessionDetailOut),
        ("/v1/match?tokens=1,2,3,4,5,99", MatchOut), ("/v1/match?tokens=", MatchOut),
        ("/v1/changes?since=0", ChangesOut), ("/v1/audit", AuditPageOut), ("/healthz", HealthOut),
    ):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
        schema.model_validate(response.json())
    assert client.get("/v1/nodes/root").json()["node"]["id"] == ROOT_ID
    assert client.get(f"/v1/nodes/{node_id}?token_offset=1&token_limit=2").json()["token_ids"] == [2, 3]
    assert client.get("/v1/match?tokens=1,2,3,4,5,99").json()["matched_tokens"] == 5
    stats = client.get("/v1/stats").json()
    assert stats["available_bytes"] == stats["available_tokens"] * stats["bytes_per_token"]
    assert client.get("/healthz").json()["status"] == "ok"


def test_actions_answer_with_their_schemas(client):
    assert ClosePlanOut.model_validate(client.post("/v1/sessions/a/close?dry_run=true", headers=AUTH).json())
    assert CloseOut.model_validate(client.post("/v1/sessions/a/close", headers=AUTH).json())
    assert EvictOut.model_validate(client.post("/v1/evict", json={"tokens": 1}, headers=AUTH).json())
    assert FlushOut.model_validate(client.post("/v1/flush", headers=AUTH).json())


def test_dry_run_changes_nothing(client):
    before = client.get("/v1/stats").json()
    plan = client.post("/v1/sessions/b/close", params={"dry_run": "true"}, headers=AUTH)
    assert plan.status_code == 200 and plan.json()["freed_tokens"] == 3
    after = client.get("/v1/stats").json()
    assert (after["version"], after["available_tokens"], after["closes"]) == (
        before["version"], before["available_tokens"], before["closes"])
    assert client.get("/v1/sessions/b").json()["session"]["state"] == "open"


def test_close_returns_plan_and_result_and_twice_says_already_closed(client):
    first = client.post("/v1/sessions/b/close", headers=AUTH)
    assert first.status_code == 200
    body = first.json()
    assert body["result"]["freed_tokens"] == body["plan"]["freed_tokens"] == 3
    assert not body["result"]["already_closed"]
    again = client.post("/v1/sessions/b/close", headers=AUTH)
    assert again.status_code == 200
    assert again.json()["result"]["already_closed"] and again.json()["result"]["freed_tokens"] == 0
    assert again.json()["plan"]["state"] == "closed"


# ----- 401, 403, 404 -----

ACTIONS = (("/v1/sessions/a/close", None), ("/v1/evict", {"tokens": 5}), ("/v1/flush", None))


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer "}],
                         ids=["missing", "wrong", "no-scheme", "basic", "empty"])
def test_posts_without_the_right_token_are_401(client, headers):
    before = client.get("/v1/stats").json()
    for path, body in ACTIONS:
        response = client.post(path, json=body, headers=headers)
        assert response.status_code == 401, path
        assert error_code(response) == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/stats").json() == before


def test_read_only_refuses_actions_with_403(read_only_client):
    c = read_only_client
    before = c.get("/v1/stats").json()
    assert c.post("/v1/sessions/a/close?dry_run=true").status_code == 200  # a preview: a read
    for path, body in ACTIONS:
        response = c.post(path, json=body, headers=AUTH)
        assert response.status_code == 403 and error_code(response) == "read_only"
    assert c.get("/v1/stats").json()["version"] == before["version"]
    assert c.get("/v1/capabilities").json()["read_only"] is True


def test_unknown_node_session_and_route_are_404(client):
    for path in ("/v1/nodes/987654", "/v1/nodes/987654/children", "/v1/nodes/10000000000"):
        response = client.get(path)
        assert response.status_code == 404 and error_code(response) == "unknown_node"
    response = client.get("/v1/sessions/nobody")
    assert response.status_code == 404 and error_code(response) == "unknown_session"
    for path in ("/v1/sessions/nobody/close", "/v1/sessions/nobody/close?dry_run=1"):
        response = client.post(path, headers=AUTH)
        assert response.status_code == 404 and error_code(response) == "unknown_session"
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404 and error_code(response) == "not_found"
    response = client.delete("/v1/flush")
    assert response.status_code == 405 and error_code(response) == "method_not_allowed"


# ----- 422 -----


@pytest.mark.parametrize("node_id", ["-1", "abc", "٣", str(10**30), "1.5", "+1", "0x10", "1 ", "ROOT"])
def test_bad_node_ids_are_422(client, node_id):
    for path in (f"/v1/nodes/{node_id}", f"/v1/nodes/{node_id}/children"):
        response = client.get(path)
        assert response.status_code == 422, (path, response.text)
        assert error_code(response) == "bad_request"


@pytest.mark.parametrize("path", [
    "/v1/nodes/root/children?offset=-1", "/v1/nodes/root/children?limit=0",
    "/v1/nodes/root/children?limit=abc", "/v1/nodes/root/children?order=size",
    "/v1/nodes/root/children?offset=٣", "/v1/nodes/root?token_limit=0", "/v1/nodes/root?token_offset=x",
    "/v1/sessions?order=size", "/v1/sessions?limit=100000", "/v1/sessions?offset=-5",
    "/v1/changes", "/v1/changes?since=-1", "/v1/changes?since=abc",
    "/v1/match?tokens=1,x,3", "/v1/match?tokens=-1", "/v1/match?tokens=٣", "/v1/match?tokens=1,,2",
    f"/v1/match?tokens={10**30}", "/v1/audit?limit=0", "/v1/audit?offset=-1",
])
def test_bad_query_parameters_are_422(client, path):
    response = client.get(path)
    assert response.status_code == 422, response.text
    assert error_code(response) == "bad_request"


@pytest.mark.parametrize("content", [b"", b"not json", b'{"tokens": -1}', b'{"tokens": "5"}',
                                     b'{"tokens": 1.5}', b'{"tokens": true}', b"{}", b"[]",
                                     b'{"tokens": 5, "extra": 1}', b'{"tokens": 1e400}'])
def test_bad_evict_bodies_are_422(client, content):
    response = client.post("/v1/evict", content=content, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert error_code(response) == "bad_request"


def test_bad_dry_run_is_422_and_changes_nothing(client):
    before = client.get("/v1/stats").json()["version"]
    response = client.post("/v1/sessions/a/close?dry_run=maybe", headers=AUTH)
    assert response.status_code == 422 and error_code(response) == "bad_request"
    assert client.get("/v1/stats").json()["version"] == before


# ----- 413 -----


def test_oversized_bodies_are_413(client):
    big = json.dumps({"tokens": 1, "pad": "x" * MAX_BODY})
    response = client.post("/v1/evict", content=big, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 413 and error_code(response) == "payload_too_large"

    def chunks():  # no Content-Length: the server counts as it reads
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    response = client.post("/v1/evict", content=chunks(), headers=AUTH)
    assert response.status_code == 413 and error_code(response) == "payload_too_large"
    response = client.post("/v1/flush", content=big, headers=AUTH)
    assert response.status_code == 413


def test_oversized_match_is_413(client, monkeypatch):
    with pytest.raises(PayloadTooLarge):  # the real limit, below HTTP (no client sends such a URL)
        parse_tokens(",".join(["1"] * (MAX_MATCH_TOKENS + 1)))
    assert len(parse_tokens(",".join(["1"] * MAX_MATCH_TOKENS))) == MAX_MATCH_TOKENS
    monkeypatch.setattr(http_params, "MAX_MATCH_TOKENS", 10)
    assert client.get("/v1/match", params={"tokens": ",".join(["1"] * 10)}).status_code == 200
    response = client.get("/v1/match", params={"tokens": ",".join(["1"] * 11)})
    assert response.status_code == 413 and error_code(response) == "payload_too_large"


# ----- 500, 503 -----


def test_engine_thread_dead_is_503():
    engine = build_engine()
    engine.stop()
    c = make_client(BundledAdapter(engine))
    response = c.get("/healthz")
    assert response.status_code == 503 and error_code(response) == "target_unreachable"
    for path in ("/v1/stats", "/metrics"):
        response = c.get(path)
        assert response.status_code == 503 and error_code(response) == "target_unreachable"


class FailingAdapter(BundledAdapter):
    """A target with a bug: its stats raise an error that is not one of the typed ones."""

    def stats(self):
        raise RuntimeError("internal detail that must not reach a client")


def test_unexpected_errors_are_500_without_details(engine):
    c = make_client(FailingAdapter(engine))
    for path in ("/v1/stats", "/metrics", "/healthz"):
        response = c.get(path)
        assert response.status_code == 500 and error_code(response) == "error"
        assert "internal detail" not in response.text


# ----- audit -----


def test_audit_records_allowed_and_refused_actions_newest_first(engine, tmp_path):
    audit = AuditLog(tmp_path / "audit.jsonl")
    c = make_client(BundledAdapter(engine), audit)
    ro = make_client(BundledAdapter(engine, read_only=True), audit)
    steps = [
        (c.post("/v1/evict", json={"tokens": 1}), "evict", 401, "unauthorized"),
        (c.post("/v1/evict", json={"tokens": 1}, headers={"Authorization": "Bearer nope"}), "evict", 401,
         "unauthorized"),
        (c.post("/v1/evict", json={"tokens": -1}, headers=AUTH), "evict", 422, "bad_request"),
        (c.post("/v1/evict", content=b"x" * (MAX_BODY + 1), headers=AUTH), "evict", 413, "payload_too_large"),
        (c.post("/v1/sessions/nobody/close", headers=AUTH), "close", 404, "unknown_session"),
        (ro.post("/v1/flush", headers=AUTH), "flush", 403, "read_only"),
        (c.post("/v1/sessions/a/close?dry_run=true", headers=AUTH), "close_dry_run", 200, None),
        (c.post("/v1/sessions/a/close", headers=AUTH), "close", 200, None),
        (c.post("/v1/evict", json={"tokens": 1}, headers=AUTH), "evict", 200, None),
        (c.post("/v1/flush", headers=AUTH), "flush", 200, None),
    ]
    entries = c.get("/v1/audit", params={"limit": 100}).json()["entries"]
    assert len(entries) == len(steps)
    for entry, (response, action, status, code) in zip(entries, reversed(steps)):
        assert response.status_code == status
        assert entry["action"] == action and entry["allowed"] is (status == 200)
        assert entry["client"] == "testclient"
        assert entry["error"] is None if code is None else entry["error"].startswith(code + ": ")
    newest = entries[0]
    assert newest["result"]["freed_tokens"] >= 0 and newest["target"] == "cache"
    close = entries[2]
    assert close["target"] == "session:a" and close["plan"]["session_id"] == "a"
    assert close["result"]["freed_tokens"] == close["plan"]["freed_tokens"]
    assert entries[3]["plan"] is not None and entries[3]["result"] is None  # the dry run
    assert entries[1]["extra"] == {"requested_tokens": 1}
    page = c.get("/v1/audit", params={"limit": 2, "offset": 1}).json()["entries"]
    assert page == entries[1:3]
    # The file: each authorised action's intent before it ran, then its outcome; a refusal
    # before an intent (no token, a body too large) and a dry run once, as a record.
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    listed = [e for e in lines if e["phase"] != "intent"]
    assert [e["action"] for e in reversed(listed)] == [e["action"] for e in entries]
    intents = {e["id"]: i for i, e in enumerate(lines) if e["phase"] == "intent"}
    outcomes = {e["id"]: i for i, e in enumerate(lines) if e["phase"] == "outcome"}
    assert intents.keys() == outcomes.keys() and all(intents[k] < outcomes[k] for k in intents)
    assert [e["action"] for e in lines if e["phase"] == "outcome"] == ["evict", "close", "flush", "close", "evict",
                                                                       "flush"]
    assert [(e["action"], e["authorised"]) for e in lines if e["phase"] == "record"] == [
        ("evict", False), ("evict", False), ("evict", True), ("close_dry_run", True)]
    audit.close()


def cache_state(engine) -> tuple:
    from radixtop.gpu_backend.traces.ops import tree_rows

    return engine.call(lambda s: s.stats().as_dict()), engine.call(tree_rows)


def failing_writes(monkeypatch, after: int = 0) -> None:
    """The journal file's writes fail (a full disk) once ``after`` writes have gone through."""
    from radixtop.adapters.http.server import audit as audit_module

    real, done = audit_module._write_all, []

    def write(fd, data):
        if len(done) >= after:
            raise OSError(28, "No space left on device")
        done.append(data)
        real(fd, data)

    monkeypatch.setattr(audit_module, "_write_all", write)


def test_an_action_the_journal_cannot_record_is_refused_and_changes_nothing(engine, tmp_path, monkeypatch):
    """With --audit-log /dev/full a flush answered 200 and ran, and /v1/audit stayed empty."""
    audit = AuditLog(tmp_path / "audit.jsonl")
    c = make_client(BundledAdapter(engine), audit)
    before = cache_state(engine)
    failing_writes(monkeypatch)
    for path, body in (("/v1/flush", None), ("/v1/evict", {"tokens": 5}), ("/v1/sessions/b/close", None)):
        response = c.post(path, json=body, headers=AUTH)
        assert response.status_code == 503 and error_code(response) == "audit_unavailable", response.text
        message = response.json()["error"]["message"]
        assert "No space left on device" in message and "nothing was done" in message
    assert cache_state(engine) == before
    assert c.get("/v1/audit").json()["entries"] == []
    # A read, a dry run and a refusal are answered as before (a refusal changes nothing either way).
    assert c.get("/v1/stats").status_code == 200
    assert c.post("/v1/sessions/b/close?dry_run=true", headers=AUTH).status_code == 200
    assert c.post("/v1/flush").status_code == 401
    audit.close()


def test_an_outcome_the_journal_cannot_record_is_still_answered(engine, tmp_path, monkeypatch, caplog):
    """The intent is on disk, the action has run: its result is the answer, and the log says the
    outcome is missing from the file."""
    audit = AuditLog(tmp_path / "audit.jsonl")
    c = make_client(BundledAdapter(engine), audit)
    failing_writes(monkeypatch, after=1)
    response = c.post("/v1/flush", headers=AUTH)
    assert response.status_code == 200 and response.json()["flushed"]
    assert "could not journal the outcome of flush" in caplog.text
    newest = c.get("/v1/audit").json()["entries"][0]
    assert newest["action"] == "flush" and newest["result"] == response.json()
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["phase"], e["action"]) for e in lines] == [("intent", "flush")]
    audit.close()


def test_refusals_without_the_token_keep_the_operators_actions(engine):
    """Refused closes with 64 KB ids (60 KB here) pushed the operator's flush out of the in-memory journal (the
    default), and each held its whole id."""
    audit = AuditLog(None, memory_entries=20)
    c = make_client(BundledAdapter(engine), audit)
    assert c.post("/v1/flush", headers=AUTH).status_code == 200
    long_id = "x" * 60_000  # (httpx sends no URL component over 64 KiB)
    for i in range(60):
        assert c.post(f"/v1/sessions/{i}{long_id}/close").status_code == 401
        assert c.post(f"/v1/sessions/{i}{long_id}/close?dry_run=true").status_code in (200, 404)
    entries = c.get("/v1/audit", params={"limit": 1000}).json()["entries"]
    assert [e["action"] for e in entries if e["allowed"] and e["action"] != "close_dry_run"] == ["flush"]
    assert len(entries) > 100 and max(len(e["target"]) for e in entries) < 400
    audit.close()


def test_token_never_appears_in_logs_or_audit(engine, tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    audit = AuditLog(tmp_path / "audit.jsonl")
    c = make_client(FailingAdapter(engine), audit)
    near_miss = TOKEN[:-1] + "X"
    c.post("/v1/evict", json={"tokens": 1}, headers=AUTH)
    c.post("/v1/evict", json={"tokens": 1}, headers={"Authorization": f"Bearer {near_miss}"})
    c.post("/v1/sessions/a/close", headers=AUTH)
    c.post("/v1/flush", headers={"Authorization": f"Bearer {near_miss}"})
    c.get("/v1/stats", headers=AUTH)  # a 500, logged with its traceback
    audit.close()
    out, err = capfd.readouterr()
    texts = [caplog.text, out, err, (tmp_path / "audit.jsonl").read_text(),
             json.dumps(c.get("/v1/audit").json())]
    assert "internal detail" in caplog.text  # the server log has the cause; the client does not
    for text in texts:
        assert TOKEN not in text and near_miss not in text


# ----- metrics, export, schema -----


def test_metrics_parse_and_match_stats(client):
    client.post("/v1/sessions/b/close", headers=AUTH)
    stats = client.get("/v1/stats").json()
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    for state in ("available", "evictable", "protected", "session_held", "uncached"):  # adding up to capacity
        assert samples[("radixtop_tokens", (("state", state),))] == stats[f"{state}_tokens"]
        assert samples[("radixtop_bytes", (("state", state),))] == stats[f"{state}_bytes"]
    assert {s.labels["state"] for s in families["radixtop_tokens"].samples} == {
        "available", "evictable", "protected", "session_held", "uncached"}
    for figure, field in (("capacity", "capacity"), ("tree", "total"), ("unevictable", "unevictable")):
        assert samples[(f"radixtop_{figure}_tokens", ())] == stats[f"{field}_tokens"]
        assert samples[(f"radixtop_{figure}_bytes", ())] == stats[f"{field}_bytes"]
    assert samples[("radixtop_sessions", (("state", "open"),))] == stats["open_sessions"]
    assert samples[("radixtop_sessions", (("state", "closed"),))] == stats["closed_sessions"] == 2
    assert samples[("radixtop_nodes", ())] == stats["node_count"]
    for name in ("prompt_tokens", "cached_tokens", "evicted_tokens", "closes", "freed_by_close_tokens"):
        assert families[f"radixtop_{name}"].type == "counter"
        assert samples[(f"radixtop_{name}_total", ())] == stats[name]
    assert stats["closes"] == 2 and stats["freed_by_close_tokens"] >= 3
    (full,) = stats["buckets"]  # SGLang's leak-check buckets, by its names
    for bucket in ("available", "evictable", "protected", "session_held", "uncached"):
        assert samples[("radixtop_pool_tokens", (("bucket", bucket), ("component", "full")))] == full[bucket]
    assert samples[("radixtop_pool_capacity_tokens", (("component", "full"),))] == full["total"]
    assert samples[("radixtop_pool_unaccounted_tokens", (("component", "full"),))] == full["unaccounted"] == 0
    for family in families.values():
        assert family.name.startswith("radixtop_")
        assert all(set(s.labels) <= {"state", "component", "bucket"} for s in family.samples)  # never an id


def wide_engine(nodes: int) -> Engine:
    s = Scheduler(get_geometry("tiny"), 4 * nodes, device="cpu")
    for i in range(nodes):
        s.request(f"r{i}", [1000 + i], [7], f"s{i % 5}")
    return Engine(s, None).start()


def test_export_streams_a_header_and_one_line_per_node():
    engine = wide_engine(2 * EXPORT_CHUNK_ROWS + 7)
    try:
        c = make_client(BundledAdapter(engine))
        with c.stream("GET", "/v1/export") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in response.iter_lines() if line]
        header, rows = lines[0], lines[1:]
        assert header["node_count"] == len(rows) == c.get("/v1/stats").json()["node_count"]
        assert len(rows) == 2 * EXPORT_CHUNK_ROWS + 7 and header["root_id"] == ROOT_ID
        assert {r["parent"] for r in rows} == {ROOT_ID}
    finally:
        engine.stop()


def test_export_of_the_contract_cache(client):
    lines = [json.loads(line) for line in client.get("/v1/export").text.splitlines()]
    assert lines[0]["node_count"] == len(lines) - 1 == client.get("/v1/stats").json()["node_count"]


def test_openapi_schema_describes_every_route(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path in ("/v1/stats", "/v1/nodes/{node_id}", "/v1/nodes/{node_id}/children", "/v1/sessions",
                 "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/close", "/v1/evict", "/v1/flush",
                 "/v1/match", "/v1/changes", "/v1/export", "/v1/audit", "/healthz", "/metrics"):
        assert path in paths, path
        for operation in paths[path].values():
            assert operation["summary"]
    close = paths["/v1/sessions/{session_id}/close"]["post"]
    assert "dry_run" in {p["name"] for p in close["parameters"]}
    assert "tokens" in paths["/v1/evict"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]
    assert "StatsOut" in schema["components"]["schemas"] and "ErrorOut" in schema["components"]["schemas"]


# ----- serving -----


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_serve_refuses_a_public_host_without_a_token(engine, host):
    printed = []
    with pytest.raises(ValueError, match="without an explicit token"):
        serve(BundledAdapter(engine), host=host, port=1, log=printed.append)
    assert printed == []


def test_loopback_hosts():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))


def test_create_app_needs_a_token(engine):
    with pytest.raises(ValueError):
        create_app(BundledAdapter(engine), "", AuditLog(None))


def test_serve_reports_a_port_in_use_as_oserror(engine):
    printed = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            serve(BundledAdapter(engine), port=taken.getsockname()[1], log=printed.append)
    assert printed == []


SERVE_SCRIPT = """
import sys
from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import serve
from tests.support.engines import build_engine
engine = build_engine()
serve(BundledAdapter(engine), port=int(sys.argv[1]), log=lambda line: print(line, flush=True))
engine.stop()
print("stopped", flush=True)
"""


def test_serve_prints_a_made_up_token_once_and_stops_on_ctrl_c():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        banner = proc.stdout.readline()
        token = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert f"http://127.0.0.1:{port}" in banner and len(token) >= 32
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                assert httpx.get(f"{url}/healthz").status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert httpx.post(f"{url}/v1/flush").status_code == 401
        assert httpx.post(f"{url}/v1/flush", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and out.strip() == "stopped"
    assert token not in out + err and "Traceback" not in err


def test_columnar_export_and_bad_format(client):
    from radixtop.adapters.http.wire import decode_export_columns

    response = client.get("/v1/export", params={"format": "columns"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
    columns = decode_export_columns(response.content)
    rows = [json.loads(line) for line in client.get("/v1/export").text.splitlines()][1:]
    assert list(columns.columns["id"]) == [r["id"] for r in rows]
    bad = client.get("/v1/export", params={"format": "xml"})
    assert bad.status_code == 422 and error_code(bad) == "bad_request"


# ----- the pool in SGLang's words (wire version 2), version 1's keys kept for a release -----


def test_stats_speak_sglangs_words_and_keep_version_1s_keys_for_a_release(client):
    """Wire version 2: available + evictable + protected + session_held + uncached = capacity, with
    protected SGLang's (locked nodes only) and their unevictable sum beside them; version 1's
    free_* and running_tokens still sent, equal to what they meant (OpenAPI says deprecated)."""
    stats = client.get("/v1/stats").json()
    StatsOut.model_validate(stats)
    states = ("available", "evictable", "protected", "session_held", "uncached")
    assert sum(stats[f"{s}_tokens"] for s in states) == stats["capacity_tokens"]
    assert stats["unevictable_tokens"] == stats["protected_tokens"] + stats["session_held_tokens"] + stats["uncached_tokens"]
    assert stats["uncached_tokens"] == 2 and stats["protected_tokens"] > 0  # the running request: locked path, own slots
    assert (stats["free_tokens"], stats["free_bytes"]) == (stats["available_tokens"], stats["available_bytes"])
    assert stats["running_tokens"] == stats["session_held_tokens"] + stats["uncached_tokens"]
    schema = client.get("/openapi.json").json()
    assert schema["info"]["version"] == "2"
    props = schema["components"]["schemas"]["StatsOut"]["properties"]
    assert all(props[k].get("deprecated") for k in ("free_tokens", "free_bytes", "running_tokens"))
    assert not props["available_tokens"].get("deprecated")


def test_a_client_reads_a_version_1_stats_reply_without_guessing_the_split():
    """A radixtop before 0.2 (in a fleet that mixes versions) sends free_tokens and an aggregate
    protected_tokens: read as available and unevictable, the split unknown (None, never 0)."""
    from radixtop.adapters.http.wire import stats_from_dict

    old = {"target": "old", "capacity_tokens": 100, "free_tokens": 60, "evictable_tokens": 25, "protected_tokens": 15,
           "running_tokens": 5, "total_tokens": 35, "bytes_per_token": 2, "node_count": 3, "open_sessions": 1,
           "closed_sessions": 0, "prompt_tokens": 0, "cached_tokens": 0, "evicted_tokens": 0, "closes": 0,
           "freed_by_close_tokens": 0, "version": 7,
           "geometry": {"name": "tiny", "num_layers": 1, "num_kv_heads": 1, "head_dim": 1, "dtype": "bf16",
                        "page_size": 1, "bytes_per_token": 2}}
    st = stats_from_dict(old)
    assert (st.available_tokens, st.evictable_tokens, st.unevictable_tokens) == (60, 25, 15)
    assert st.protected_tokens is st.session_held_tokens is st.uncached_tokens is None
