"""The leak doctor over the admin API: GET /v1/doctor (a read, with the reads' token rules) and the client."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():  # newer starlette asks for httpx2 here; httpx still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.schemas import DiagnosisOut
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.server.edge import HEAVY_READS
from tests.support.engines import build_engine
from tests.support.live_server import running_server

TOKEN = "doctor-api-test-token-1234"
READ_TOKEN = "doctor-api-read-token-5678"


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


def plant_lock(engine) -> int:
    def plant(s) -> int:
        node = next(iter(s.cache._session_leaves["b"]))
        s.cache.inc_lock_ref(node)
        return node.id

    return engine.call(plant)


def test_the_route_answers_with_its_schema_healthy_then_with_a_planted_lock(engine):
    client = TestClient(create_app(BundledAdapter(engine), TOKEN, AuditLog(None)), base_url="http://127.0.0.1")
    healthy = client.get("/v1/doctor")
    assert healthy.status_code == 200, healthy.text
    body = DiagnosisOut.model_validate(healthy.json())
    assert body.healthy and body.findings == [] and body.nodes_walked and body.idle_after_s == 600
    node_id = plant_lock(engine)
    found = DiagnosisOut.model_validate(client.get("/v1/doctor", params={"idle_after_s": 3600}).json())
    assert not found.healthy and [f.kind for f in found.findings] == ["leaked_lock"]
    assert found.findings[0].node_ids[0] == node_id and found.findings[0].figures["leaked_locks"] == 1
    for bad in ("-1", "nan", "inf", "x"):
        refused = client.get("/v1/doctor", params={"idle_after_s": bad})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "bad_request", bad
    assert HEAVY_READS.fullmatch("/v1/doctor")  # its walk follows the cache: held to the heavy reads' limit


def test_a_public_bind_needs_a_token_to_read_it_and_a_read_token_will_do(engine):
    app = create_app(BundledAdapter(engine), TOKEN, AuditLog(None), host="0.0.0.0", read_token=READ_TOKEN)
    client = TestClient(app, base_url="http://10.1.2.3:8765")
    assert client.get("/v1/doctor").status_code == 401
    for token in (TOKEN, READ_TOKEN):
        assert client.get("/v1/doctor", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_the_client_reads_the_same_diagnosis_as_the_adapter(engine):
    adapter = BundledAdapter(engine)
    plant_lock(engine)
    with running_server(create_app(adapter, TOKEN, AuditLog(None))) as url:
        remote = RadixtopClient(url, token=TOKEN)
        try:
            over_http = remote.diagnose(idle_after_s=0.0)
        finally:
            remote.release()
    here = adapter.diagnose(idle_after_s=0.0)

    def same(f):  # all but the idle time, which moves between the two reads
        return f.kind, f.node_ids, f.tokens, f.bytes, f.session_id, f.action, f.meaning, \
            {k: v for k, v in f.figures.items() if k != "idle_s"}

    assert [same(f) for f in over_http.findings] == [same(f) for f in here.findings]
    assert over_http.checked == here.checked and over_http.findings[0] == here.findings[0]
    # b's own node is the one locked: closing b frees nothing now, so b is no idle finding
    assert [(f.kind, f.session_id) for f in here.findings] == [("leaked_lock", None), ("idle_session", "a")]
    assert over_http.skipped == {} and over_http.nodes_walked == here.nodes_walked
