"""``GET /v1/read``: several reads in one request. Its answers (each what the read's own route
answers), its refusals (422 naming the read), what it shares with the other reads (no token, never
audited, read-only targets answer it, in the schema), and RadixtopClient.read_many over a real server,
with its fallback to one read at a time for a server without the route."""

from __future__ import annotations

import json
import warnings

import httpx
import pytest

with warnings.catch_warnings():  # newer starlette asks for httpx2 here; httpx still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from radixtop.adapters.base import MAX_CHAIN, MAX_PAGE, MAX_READS, READ_PARAMS
from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import TargetUnreachable, UnknownNode, UnknownSession
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.params import MAX_ID
from radixtop.adapters.http.schemas import ReadOut
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.model import ROOT_ID
from tests.contract.suite import ageless, comparable, known_reads
from tests.support.engines import build_engine
from tests.support.live_server import running_server

TOKEN = "read-route-test-token"
LOOPBACK = "http://127.0.0.1"  # the Host a loopback server answers to (TestClient sends "testserver")


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


@pytest.fixture
def client(engine, audit):
    return TestClient(create_app(BundledAdapter(engine), TOKEN, audit), base_url=LOOPBACK, raise_server_exceptions=False)


def read(client, reads, **kwargs) -> httpx.Response:
    raw = reads if isinstance(reads, str) else json.dumps(reads)
    return client.get("/v1/read", params={"reads": raw}, **kwargs)


def refusal(response) -> str:
    """The message of a 422 bad_request, the error body and nothing else."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == "bad_request"
    return body["error"]["message"]


def top_ids(client) -> tuple[int, int]:
    """The shared prompt's node and the top of the run of single children."""
    children = client.get("/v1/nodes/root/children").json()["children"]
    return children[0]["id"], next(c["id"] for c in children if c["first_tokens"][:1] == [50])


# ----- answers -----


def test_each_read_answers_what_its_route_answers(client):
    prompt, run = top_ids(client)
    since = client.get("/v1/stats").json()["version"] - 3
    pairs = [
        ({"op": "capabilities"}, "/v1/capabilities"), ({"op": "stats"}, "/v1/stats"),
        ({"op": "children", "node_id": "root"}, "/v1/nodes/root/children"),
        ({"op": "children", "node_id": prompt, "offset": 1, "limit": 2, "order": "tokens"},
         f"/v1/nodes/{prompt}/children?offset=1&limit=2&order=tokens"),
        ({"op": "chain", "node_id": str(run)}, f"/v1/nodes/{run}/chain"),
        ({"op": "chain", "node_id": run, "limit": 1}, f"/v1/nodes/{run}/chain?limit=1"),
        ({"op": "subtree", "node_id": "root"}, "/v1/nodes/root/subtree"),
        ({"op": "subtree", "node_id": prompt, "depth": 1, "limit": 1, "order": "tokens", "min_bytes": 1},
         f"/v1/nodes/{prompt}/subtree?depth=1&limit=1&order=tokens&min_bytes=1"),
        ({"op": "node", "node_id": 0}, "/v1/nodes/root"),
        ({"op": "node", "node_id": prompt, "token_offset": 1, "token_limit": 2},
         f"/v1/nodes/{prompt}?token_offset=1&token_limit=2"),
        ({"op": "sessions"}, "/v1/sessions"),
        ({"op": "sessions", "order": "id", "offset": 1, "limit": 2}, "/v1/sessions?order=id&offset=1&limit=2"),
        ({"op": "session", "session_id": "a"}, "/v1/sessions/a"),
        ({"op": "match", "tokens": [1, 2, 3, 4, 5, 99]}, "/v1/match?tokens=1,2,3,4,5,99"),
        ({"op": "match", "tokens": []}, "/v1/match?tokens="),
        ({"op": "changes", "since": since}, f"/v1/changes?since={since}"),
        ({"op": "paths", "node_ids": [run, "root", 999_999]}, f"/v1/paths?node_ids={run},root,999999"),
    ]
    assert {item["op"] for item, _ in pairs} == set(READ_PARAMS)
    response = read(client, [item for item, _ in pairs])
    assert response.status_code == 200, response.text
    body = response.json()
    ReadOut.model_validate(body)
    assert set(body) == {"results"} and len(body["results"]) == len(pairs)
    for result, (item, path) in zip(body["results"], pairs):
        assert set(result) == {"ok"}, item
        assert ageless(result["ok"]) == ageless(client.get(path).json()), item
    stats = body["results"][1]["ok"]
    assert stats["available_bytes"] == stats["available_tokens"] * stats["bytes_per_token"]  # with its byte figures


def test_left_out_parameters_take_the_routes_defaults(client):
    prompt, run = top_ids(client)
    pairs = [
        ({"op": "children", "node_id": "root"},
         {"op": "children", "node_id": 0, "offset": 0, "limit": 100, "order": "bytes"}),
        ({"op": "chain", "node_id": run}, {"op": "chain", "node_id": run, "limit": 10_000}),
        ({"op": "node", "node_id": prompt}, {"op": "node", "node_id": prompt, "token_offset": 0, "token_limit": 256}),
        ({"op": "sessions"}, {"op": "sessions", "order": "exclusive_bytes", "offset": 0, "limit": 100}),
    ]
    short = read(client, [a for a, _ in pairs]).json()["results"]
    full = read(client, [b for _, b in pairs]).json()["results"]
    assert ageless(short) == ageless(full)
    assert short[0]["ok"]["limit"] == 100 and short[0]["ok"]["order"] == "bytes"
    assert short[3]["ok"]["order"] == "exclusive_bytes" and short[3]["ok"]["limit"] == 100


def test_a_failed_read_carries_its_routes_error_and_status(client):
    reads = [{"op": "stats"}, {"op": "node", "node_id": 987654}, {"op": "children", "node_id": "987654"},
             {"op": "chain", "node_id": MAX_ID}, {"op": "session", "session_id": "nobody"},
             {"op": "session", "session_id": "a"}]
    paths = ["/v1/nodes/987654", "/v1/nodes/987654/children", f"/v1/nodes/{MAX_ID}/chain", "/v1/sessions/nobody"]
    response = read(client, reads)
    assert response.status_code == 200
    results = response.json()["results"]
    assert "ok" in results[0] and results[-1]["ok"]["session"]["id"] == "a"
    for result, path in zip(results[1:5], paths):
        alone = client.get(path)
        assert alone.status_code == 404
        assert result == {**alone.json(), "status": 404}
    assert [r["error"]["code"] for r in results[1:5]] == ["unknown_node"] * 3 + ["unknown_session"]


# ----- refusals: the whole request, 422, naming the read -----


@pytest.mark.parametrize("raw, says", [
    ("not json", "JSON list"), ("[{'op': 'stats'}]", "JSON list"), ("[NaN]", "JSON list"), ("", "JSON list"),
    ('{"op": "stats"}', f"1 to {MAX_READS} reads"), ('"stats"', "JSON list of"), ("[]", "JSON list of"),
    (json.dumps([{"op": "stats"}] * (MAX_READS + 1)), f"1 to {MAX_READS} reads"),
])
def test_a_reads_parameter_that_is_not_a_list_of_reads_is_422(client, raw, says):
    assert says in refusal(read(client, raw))


def test_reads_is_required(client):
    assert "reads" in refusal(client.get("/v1/read"))


MAX_PLUS = MAX_ID + 1  # 2**63
BAD_READS = [  # (a read, what the message names); each sent second, after a good one
    (5, "must be an object"), (["stats"], "must be an object"), ("stats", "must be an object"),
    ({}, "op must be one of"), ({"op": None}, "op must be one of"), ({"op": ["stats"]}, "op must be one of"),
    ({"op": "evict", "tokens": 1}, "op must be one of"), ({"op": "close_session", "session_id": "a"}, "op must be"),
    ({"op": "export"}, "op must be one of"), ({"op": "Stats"}, "op must be one of"),
    ({"op": "stats", "since": 1}, "unknown parameter 'since'"),
    ({"op": "children", "node_id": 0, "page": 2}, "unknown parameter 'page'"),
    ({"op": "node"}, "node_id is required"), ({"op": "children"}, "node_id is required"),
    ({"op": "chain", "limit": 5}, "node_id is required"), ({"op": "session"}, "session_id is required"),
    ({"op": "match"}, "tokens is required"), ({"op": "changes"}, "since is required"),
    ({"op": "children", "node_id": 0, "limit": True}, "limit"), ({"op": "changes", "since": False}, "since"),
    ({"op": "node", "node_id": True}, "node_id"), ({"op": "match", "tokens": [True]}, "tokens"),
    ({"op": "children", "node_id": 0, "limit": 0}, "limit"),
    ({"op": "children", "node_id": 0, "limit": MAX_PAGE + 1}, "limit"),
    ({"op": "children", "node_id": 0, "limit": 5.0}, "limit"),
    ({"op": "children", "node_id": 0, "limit": "5"}, "limit"),
    ({"op": "children", "node_id": 0, "offset": -1}, "offset"),
    ({"op": "children", "node_id": 0, "offset": MAX_PLUS}, "offset"),
    ({"op": "children", "node_id": 0, "offset": 2**64}, "offset"),
    ({"op": "node", "node_id": 0, "token_limit": 0}, "token_limit"),
    ({"op": "node", "node_id": 0, "token_offset": -1}, "token_offset"),
    ({"op": "chain", "node_id": 0, "limit": 0}, "limit"),
    ({"op": "chain", "node_id": 0, "limit": MAX_CHAIN + 1}, "limit"),
    ({"op": "sessions", "limit": MAX_PAGE + 1}, "limit"), ({"op": "sessions", "offset": -5}, "offset"),
    ({"op": "changes", "since": -1}, "since"), ({"op": "changes", "since": MAX_PLUS}, "since"),
    ({"op": "changes", "since": 10**30}, "since"), ({"op": "changes", "since": 1.5}, "since"),
    *(({"op": "node", "node_id": bad}, "node_id") for bad in (
        -1, MAX_PLUS, "-1", str(MAX_PLUS), "ROOT", "Root", "٣", "1.5", 1.5, "0x10", "+1", " 1", "1 ", "", None, [0])),
    ({"op": "children", "node_id": "abc"}, "node_id"), ({"op": "chain", "node_id": -3}, "node_id"),
    *(({"op": "match", "tokens": bad}, "tokens") for bad in ([-1], "1,2", [MAX_PLUS], [1.5], None, {"a": 1}, ["1"])),
    ({"op": "session", "session_id": 5}, "session_id"), ({"op": "session", "session_id": None}, "session_id"),
    ({"op": "children", "node_id": 0, "order": "size"}, "order"),
    ({"op": "children", "node_id": 0, "order": "exclusive_bytes"}, "order"),
    ({"op": "sessions", "order": "bytes"}, "order"), ({"op": "sessions", "order": 5}, "order"),
    ({"op": "sessions", "order": ["id"]}, "order"),
]


@pytest.mark.parametrize("bad, names", BAD_READS, ids=lambda v: repr(v)[:50])
def test_a_malformed_read_is_422_naming_it(client, engine, bad, names):
    before = engine.call(lambda s: s.cache.version)
    message = refusal(read(client, [{"op": "stats"}, bad]))
    assert message.startswith("read 1") and names in message, message
    assert engine.call(lambda s: s.cache.version) == before


@pytest.mark.parametrize("where", ["item", "op", "parameter"])
def test_a_deeply_nested_value_is_422(client, where):
    deep = "[" * 1000 + "]" * 1000
    raw = {"item": f"[{deep}]", "op": f'[{{"op": {deep}}}]',
           "parameter": f'[{{"op": "session", "session_id": {deep}}}]'}
    assert "read 0" in refusal(read(client, raw[where]))


def test_node_ids_and_bounds_the_routes_take_are_taken(client):
    prompt, _ = top_ids(client)
    forms = [{"op": "node", "node_id": v} for v in ("root", 0, "0", "00", str(prompt), prompt, f"{prompt:019d}")]
    results = read(client, forms).json()["results"]
    ids = [r["ok"]["node"]["id"] for r in results]
    assert ids == [ROOT_ID] * 4 + [prompt] * 3
    edges = [{"op": "children", "node_id": "root", "offset": MAX_ID, "limit": MAX_PAGE},
             {"op": "node", "node_id": "root", "token_offset": MAX_ID, "token_limit": MAX_PAGE},
             {"op": "chain", "node_id": 0, "limit": MAX_CHAIN}, {"op": "changes", "since": MAX_ID},
             {"op": "sessions", "order": "last_activity", "offset": MAX_ID, "limit": 1},
             {"op": "match", "tokens": [MAX_ID, 0]}, {"op": "session", "session_id": ""},
             {"op": "node", "node_id": MAX_ID}, {"op": "node", "node_id": str(MAX_ID)}]
    response = read(client, edges)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert all("ok" in r for r in results[:6]), results
    assert results[0]["ok"]["children"] == [] and results[3]["ok"]["resync"] is True
    assert [r["status"] for r in results[6:]] == [404, 404, 404]


# ----- shared with the other reads -----


def test_needs_no_token_and_is_never_audited(engine, tmp_path):
    audit = AuditLog(tmp_path / "audit.jsonl")
    client = TestClient(create_app(BundledAdapter(engine), TOKEN, audit), base_url=LOOPBACK, raise_server_exceptions=False)
    good = [{"op": "stats"}, {"op": "session", "session_id": "nobody"}]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
        assert read(client, good, headers=headers).status_code == 200
        assert read(client, [{"op": "evict", "tokens": 1}], headers=headers).status_code == 422
    response = client.post("/v1/read", params={"reads": json.dumps(good)}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 405
    assert audit.tail(100) == []
    audit.close()
    assert not (tmp_path / "audit.jsonl").exists() or (tmp_path / "audit.jsonl").read_text() == ""


def test_a_read_only_target_answers_it(engine, audit):
    client = TestClient(create_app(BundledAdapter(engine, read_only=True), TOKEN, audit), base_url=LOOPBACK)
    results = read(client, [{"op": "capabilities"}, {"op": "stats"}, {"op": "sessions"}]).json()["results"]
    assert results[0]["ok"]["read_only"] is True and all("ok" in r for r in results)


def test_a_stopped_target_fails_the_whole_request(engine, client):
    engine.stop()
    response = read(client, [{"op": "stats"}, {"op": "node", "node_id": 0}])
    assert response.status_code == 503 and response.json()["error"]["code"] == "target_unreachable"


def test_the_schema_describes_it(client):
    schema = client.get("/openapi.json").json()
    operations = schema["paths"]["/v1/read"]
    assert set(operations) == {"get"}
    get = operations["get"]
    reads = next(p for p in get["parameters"] if p["name"] == "reads")
    assert reads["in"] == "query" and reads["required"] is True and reads["schema"]["type"] == "string"
    assert {"200", "422", "503", "504"} <= set(get["responses"])
    assert get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ReadOut")
    assert "ReadOut" in schema["components"]["schemas"] and get["summary"]


# ----- RadixtopClient.read_many over a real server -----


def served_paths(remote: RadixtopClient) -> list[str]:
    """The paths ``remote`` requests from now on, in order."""
    paths: list[str] = []
    remote._client.event_hooks["request"].append(lambda request: paths.append(request.url.path))
    return paths


def check_over(app, local: BundledAdapter, batched: bool) -> None:
    with running_server(app) as url:
        remote = RadixtopClient(url, token=TOKEN, timeout=10)
        try:
            reads = known_reads(local) + [("node", (987654,)), ("session", ("nobody",))]
            paths = served_paths(remote)
            for _ in range(2):
                got = remote.read_many(reads)
                assert [comparable(r) for r in got] == [comparable(r) for r in local.read_many(reads)]
                assert isinstance(got[-2], UnknownNode) and isinstance(got[-1], UnknownSession)
            assert remote._batch_reads is batched
            if batched:  # one request a batch
                assert paths == ["/v1/read"] * 2
            else:  # asked once, then one request a read, remembered
                assert paths[0] == "/v1/read" and paths.count("/v1/read") == 1
                assert len(paths) == 1 + 2 * len(reads)
        finally:
            remote.release()


def test_http_adapter_reads_a_batch_in_one_request(engine):
    local = BundledAdapter(engine)
    check_over(create_app(local, TOKEN, AuditLog(None)), local, batched=True)


def test_http_adapter_reads_one_by_one_from_a_server_without_the_route(engine):
    local = BundledAdapter(engine)
    app = create_app(local, TOKEN, AuditLog(None))
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/v1/read"]
    assert TestClient(app, base_url=LOOPBACK).get("/v1/read", params={"reads": '[{"op":"stats"}]'}).status_code == 404
    check_over(app, local, batched=False)


def test_http_adapter_read_many_raises_when_the_target_is_gone(engine):
    local = BundledAdapter(engine)
    with running_server(create_app(local, TOKEN, AuditLog(None))) as url:
        remote = RadixtopClient(url, timeout=10)
        engine.stop()
        with pytest.raises(TargetUnreachable):
            remote.read_many([("stats", ()), ("node", (0,))])
        remote.release()
