"""A fleet source or a worker that answers something unexpected costs a row or a note, never the
poll: a worker URL radixtop cannot read, a malformed or cyclic Dynamo dump, a guessed radixtop URL
(no engine's API key goes there; the plugin's name is matched exactly), and readers during a poll."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi import Request

from radixtop.adapters.fleet import probe
from radixtop.adapters.fleet.dump import DumpError, duplicates, parse_dump
from radixtop.adapters.fleet.model import WorkerRow
from radixtop.adapters.fleet.sources import Discovery, Mapping, SmgSource, Source, WorkerSpec


def test_an_smg_worker_that_is_not_http_is_skipped_with_a_note():
    from fastapi import FastAPI

    from tests.support.live_server import running_server

    entries = [{"url": "http://10.9.9.9:30000", "model_id": "m", "is_healthy": True},
               {"url": "grpc://10.9.9.8:30000", "model_id": "m", "is_healthy": True}]
    gateway = FastAPI()
    gateway.get("/workers")(lambda: {"workers": entries, "total": 2, "stats": {}})
    gateway.get("/get_loads")(lambda: {"loads": [{"worker": "grpc://10.9.9.8:30000", "dp_rank": 0},
                                                {"worker": "http://10.9.9.9:30000", "num_running_reqs": 3}]})
    with running_server(gateway) as url:
        view = probe.poll_fleet(SmgSource(url, Mapping({}, None)), timeout=0.3)
    assert not view.error
    assert [(r.worker, r.running_requests) for r in view.rows] == [("http://10.9.9.9:30000", 3)]
    assert any("grpc://10.9.9.8:30000" in n and "not an http(s) URL" in n for n in view.notes)


def test_a_source_that_raises_is_the_views_error():
    class Broken(Source):
        label = "broken"

        def discover(self) -> Discovery:
            raise RuntimeError("boom")

    view = probe.poll_fleet(Broken(), timeout=0.2)
    assert view.rows == () and "boom" in view.error


def _dump(*events, block_size=16):
    return {"m:g": {"block_size": block_size, "events": list(events)}}


def _stored(worker, blocks, parent=None):
    return {"worker_id": worker, "storage_tier": "device", "event": {"data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": b} for b in blocks]}}, "dp_rank": 0}}


@pytest.mark.parametrize("body", [
    _dump({"worker_id": 1, "event": {"data": {"stored": {"parent_hash": None, "blocks": [{}]}}}}),  # no block_hash
    _dump(_stored(1, ["abc"])),                                       # not a number
    _dump({"worker_id": 1, "event": {"data": None}}),                 # data null
    _dump({"worker_id": 1, "event": {"data": {"stored": None}}}),     # stored null
    _dump({"worker_id": 1, "event": {"data": {"removed": {"block_hashes": ["x"]}}}}),
    _dump(_stored(1, [1], parent=[1, 2])),                            # a parent that is no hash
    {"m:g": {"block_size": 16, "events": 7}},                          # events not a list
    _dump("not an event"),
])
def test_a_malformed_dump_is_a_dump_error(body):
    with pytest.raises(DumpError):
        parse_dump(body)


def test_a_malformed_dump_costs_a_note_not_the_poll(monkeypatch):
    from radixtop.adapters.fleet import sources
    from radixtop.adapters.fleet.sources import DynamoSource

    answers = {"/workers": [{"instance_id": 1, "listeners": {"0": "not a dict"}, "endpoints": {"0": ""}}],
               "/dump": _dump({"worker_id": 1, "event": {"data": None}})}
    monkeypatch.setattr(sources, "_get", lambda client, path, what: answers[path])
    found = DynamoSource("http://indexer:8090", Mapping({}, None)).discover()
    assert not found.error and [s.worker for s in found.specs] == ["1"]
    assert any(n.startswith("Dynamo's /dump:") for n in found.notes)


@pytest.mark.timeout(10)
def test_a_cyclic_dump_ends():
    """A's parent B, B's parent A (and C under A, which the walk starts from): the walk stops at
    the repeat instead of going round while the poller holds its lock."""
    events = [_stored(w, [b], parent=p) for w in (1, 2) for b, p in ((10, 20), (20, 10), (30, 10))]
    d = duplicates(parse_dump(_dump(*events)), None)
    assert d.duplicated_tokens == 48
    assert [(p.block_hash, p.blocks) for p in d.prefixes] == [(30, 3)]


def test_a_guessed_radixtop_url_gets_only_its_own_token(monkeypatch):
    sent: list[tuple[str, str | None]] = []

    class Client:
        def __init__(self, url, token=None, timeout=2.0):
            sent.append((url, token))

        def stats(self):
            raise probe.AdapterError("refused")

        def release(self):
            pass

    monkeypatch.setattr(probe, "open_radixtop", Client)
    monkeypatch.setattr(probe, "read_sglang", lambda spec, key, timeout, why: WorkerRow(
        spec.worker, spec.dp_rank, None, "sglang", True, why=why))
    tokens = {"http://h:30000": "engine-api-key"}
    guessed = WorkerSpec("http://h:30000", None, "http://h:30100", True, engine_url="http://h:30000")
    probe.read_worker(guessed, tokens, 0.2)
    assert sent == [("http://h:30100", None)]
    probe.read_worker(guessed, {**tokens, "http://h:30100": "plugin-token"}, 0.2)
    assert sent[-1] == ("http://h:30100", "plugin-token")
    mapped = WorkerSpec("http://h:30000", None, "http://h:31000", False, engine_url="http://h:30000")
    probe.read_worker(mapped, tokens, 0.2)  # a URL the user gave: the worker's entry still serves it
    assert sent[-1] == ("http://h:31000", "engine-api-key")


@pytest.mark.parametrize("target,rank,ok", [
    ("sglang dp1 tiny", 1, True), ("sglang dp1", 1, True), ("sglang dp10 tiny", 1, False),
    ("sglang dp0 tiny", None, True), ("sglang dp01 tiny", 1, False), ("sglang dp1x", 1, False)])
def test_a_guessed_url_is_believed_only_for_exactly_its_rank(monkeypatch, target, rank, ok):
    from types import SimpleNamespace

    class Client:
        def __init__(self, url, token=None, timeout=2.0):
            pass

        def stats(self):
            return SimpleNamespace(target=target, geometry=SimpleNamespace(name="tiny"), capacity_tokens=1,
                                   available_tokens=1, evictable_tokens=0, unevictable_tokens=0, bytes_per_token=0,
                                   open_sessions=0, prompt_tokens=0, cached_tokens=0)

        def release(self):
            pass

    monkeypatch.setattr(probe, "open_radixtop", Client)
    spec = WorkerSpec("http://h:30000", rank, "http://h:30101", True)
    if ok:
        assert probe.read_radixtop(spec, spec.radixtop_url, None, 0.2).source == "radixtop"
    else:
        with pytest.raises(probe.AdapterError, match="not this worker's plugin"):
            probe.read_radixtop(spec, spec.radixtop_url, None, 0.2)


@pytest.mark.timeout(20)
def test_readers_during_a_poll_get_the_last_view_at_once():
    release, polls = threading.Event(), []

    class Slow(Source):
        label = "slow"

        def discover(self) -> Discovery:
            polls.append(1)
            if len(polls) > 1:
                release.wait(10)
            return Discovery(())

    poller = probe.FleetPoller(Slow(), max_age=0.0)
    first = poller.poll()
    slow = threading.Thread(target=poller.poll)
    slow.start()
    while len(polls) < 2:
        time.sleep(0.01)
    started = time.monotonic()
    again = [poller.poll() for _ in range(5)]
    assert time.monotonic() - started < 5.0 and all(v is first for v in again)  # the stuck poll waits 10 s
    release.set()
    slow.join(5)
    assert poller.poll() is not first


def test_enter_on_a_guessed_plugin_sends_it_no_engine_api_key(tmp_path):
    """The drill-down follows the polls' rule (docs/fleet.md): a radixtop URL the port rule
    guessed, believed only by the name its server gives (any server can give it), gets only a
    token the tokens file gives that very URL, never the worker's entry (the engine's API key)."""
    import json

    from fastapi import FastAPI
    from fastapi.responses import Response

    from radixtop.adapters.bundled.adapter import BundledAdapter
    from radixtop.adapters.fleet.config import read_fleet_file
    from radixtop.adapters.fleet.sources import FleetFileSource
    from radixtop.cli.fleet import open_worker
    from tests.support.engines import build_engine
    from tests.support.live_server import free_port, running_server

    engine = build_engine()
    try:
        stats = json.loads(json.dumps(BundledAdapter(engine).stats().to_dict()))
    finally:
        engine.stop()
    heard: list[str | None] = []
    plugin = FastAPI()  # a server on the rule's port that names itself as the worker's plugin

    @plugin.get("/v1/stats")
    def said(request: Request) -> Response:
        heard.append(request.headers.get("authorization"))
        return Response(json.dumps({**stats, "target": "sglang dp0 tiny"}), media_type="application/json")

    port = free_port()
    engine_url = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "fleet.txt"
    path.write_text(f"sglang={engine_url}\n")
    with running_server(plugin, port=port):
        for tokens, sent in (({engine_url: "engine-api-key"}, None),
                             ({engine_url: "engine-api-key", f"http://127.0.0.1:{port}": "plugin-token"},
                              "Bearer plugin-token")):
            poller = probe.FleetPoller(FleetFileSource(path, read_fleet_file(path), Mapping({}, port)), tokens, 5)
            row = poller.poll().rows[0]
            assert row.source == "radixtop" and row.radixtop_url == f"http://127.0.0.1:{port}", row.why
            assert heard[-1] == sent  # the poll's own read
            adapter, _ = open_worker(row, poller)  # Enter in the fleet view
            try:
                adapter.stats()
            finally:
                adapter.release()
            assert heard[-1] == sent, heard
    assert "Bearer engine-api-key" not in heard


@pytest.mark.timeout(20)
def test_latest_never_waits_on_a_poll_and_starts_one_at_a_time():
    """What serve --fleet's /v1/fleet reads: at once, always; before the first poll has ended,
    that poll's Future (one poll for every reader), then the last view while the next runs."""
    from concurrent.futures import Future

    release, polls = threading.Event(), []

    class Slow(Source):
        label = "slow"

        def discover(self) -> Discovery:
            polls.append(1)
            release.wait(10)
            return Discovery(())

    poller = probe.FleetPoller(Slow(), max_age=0.0)
    started = time.monotonic()
    first = poller.latest()
    assert isinstance(first, Future) and not first.done()
    assert all(poller.latest() is first for _ in range(5)) and time.monotonic() - started < 5  # not the 10 s
    release.set()
    view = first.result(10)
    assert polls == [1] and view.source == "slow"
    assert poller.latest() is view  # stale at once (max_age 0): a new poll starts, the last view now
    while len(polls) < 2:
        time.sleep(0.01)
