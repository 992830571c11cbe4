"""A worker or source that sends numbers of the wrong type costs its own row (with a reason) or a
note, never the fleet view: the good workers stay in /v1/fleet, and a Dynamo dump whose
block_size is Infinity leaves only the duplicates out."""

from __future__ import annotations

import json
import math

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import Response

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.fleet.config import read_fleet_file
from radixtop.adapters.fleet.probe import FleetPoller
from radixtop.adapters.fleet.sources import DynamoSource, FleetFileSource, Mapping, SmgSource
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from tests.support.engines import build_engine
from tests.support.live_server import running_server


@pytest.fixture(scope="module")
def good():
    engine = build_engine()
    try:
        adapter = BundledAdapter(engine)
        with running_server(create_app(adapter, "t" * 24, AuditLog(None))) as url:
            yield url, json.loads(json.dumps(adapter.stats().to_dict()))
    finally:
        engine.stop()


def worker_saying(stats: dict) -> FastAPI:
    app = FastAPI()
    app.get("/v1/stats")(lambda: Response(json.dumps(stats), media_type="application/json"))
    return app


@pytest.mark.parametrize("field, value", [("capacity_tokens", "4096"), ("available_tokens", -4),
                                          ("evictable_tokens", 1.5), ("capacity_tokens", True),
                                          ("prompt_tokens", math.nan), ("cached_tokens", 2**70),
                                          ("bytes_per_token", math.inf)])
def test_a_worker_with_a_wrong_number_loses_its_own_row_only(good, tmp_path, field, value):
    url, stats = good
    with running_server(worker_saying({**stats, field: value})) as bad:
        path = tmp_path / "fleet.txt"
        path.write_text(f"{url}\n{bad}\n")
        poller = FleetPoller(FleetFileSource(path, read_fleet_file(path), Mapping()), timeout=5)
        own = build_engine()
        try:
            with running_server(create_app(BundledAdapter(own), "t" * 24, AuditLog(None), fleet=poller.poll)) as api:
                reply = httpx.get(f"{api}/v1/fleet", timeout=30, trust_env=False)
        finally:
            own.stop()
    assert reply.status_code == 200, reply.text
    rows = {r["worker"]: r for r in reply.json()["rows"]}
    assert rows[url]["reachable"] and rows[url]["capacity_tokens"] == stats["capacity_tokens"]
    assert not rows[bad]["reachable"] and rows[bad]["capacity_tokens"] is None
    assert f"unexpected reply from {bad}" in rows[bad]["why"] and field in rows[bad]["why"] or \
        "not JSON" in rows[bad]["why"], rows[bad]["why"]


def test_a_dump_with_an_infinite_block_size_costs_a_note_not_the_view():
    indexer = FastAPI()
    indexer.get("/workers")(lambda: [{"instance_id": 7, "status": "active", "endpoints": {"0": ""}}])
    dump = '{"m:g": {"block_size": Infinity, "events": []}}'
    indexer.get("/dump")(lambda: Response(dump, media_type="application/json"))
    with running_server(indexer) as url:
        found = DynamoSource(url, Mapping({}, None), timeout=5).discover()
    assert not found.error and [s.worker for s in found.specs] == ["7"]
    assert any("Dynamo's /dump" in n and "block_size" in n for n in found.notes), found.notes


def test_wrong_numbers_in_smgs_loads_are_unknown_with_a_note():
    gateway = FastAPI()
    gateway.get("/workers")(lambda: {"workers": [{"url": "http://10.9.9.9:30000", "is_healthy": True}]})
    loads = {"loads": [{"worker": "http://10.9.9.9:30000", "num_running_reqs": "3", "max_total_num_tokens": -1,
                        "num_used_tokens": True}]}
    gateway.get("/get_loads")(lambda: loads)
    with running_server(gateway) as url:
        found = SmgSource(url, Mapping({}, None), timeout=5).discover()
    assert not found.error
    spec = found.specs[0]
    assert (spec.running_requests, spec.capacity_tokens, spec.unevictable_tokens) == (None, None, None)
    assert any("num_running_reqs '3'" in n and "not a count" in n for n in found.notes), found.notes
