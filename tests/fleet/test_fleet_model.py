"""The fleet's files, its order and its unknowns, and Dynamo's dump as recorded from a real
indexer (ai-dynamo-runtime 1.6.1, two SGLang workers sharing a 64-token prefix, page size 16)."""

from __future__ import annotations

import os

import pytest

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.fleet.config import (
    plugin_url,
    read_fleet_file,
    read_map_file,
    read_tokens_file,
)
from radixtop.adapters.fleet.dump import DumpError, duplicates, parse_dump
from radixtop.adapters.fleet.format import cells
from radixtop.adapters.fleet.model import WorkerRow, by_pressure
from radixtop.adapters.fleet.sources import FleetFileSource, Mapping

RECORDED_DUMP = {"tiny:default": {"block_size": 16, "events": [
    {"worker_id": 1, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 0, "data": {
        "stored": {"parent_hash": None, "start_position": None, "blocks": [
            {"block_hash": 3783480490812179100, "tokens_hash": 10823191264391160519, "mm_extra_info": None},
            {"block_hash": 12923641463965985616, "tokens_hash": 1219978239041041138, "mm_extra_info": None},
            {"block_hash": 8220981200828417142, "tokens_hash": 11579058346470406089, "mm_extra_info": None},
            {"block_hash": 4172160871627067949, "tokens_hash": 15355247268704632839, "mm_extra_info": None}]}},
        "dp_rank": 0}},
    {"worker_id": 2, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 1, "data": {
        "stored": {"parent_hash": None, "start_position": None, "blocks": [
            {"block_hash": 3783480490812179100, "tokens_hash": 10823191264391160519, "mm_extra_info": None},
            {"block_hash": 12923641463965985616, "tokens_hash": 1219978239041041138, "mm_extra_info": None},
            {"block_hash": 8220981200828417142, "tokens_hash": 11579058346470406089, "mm_extra_info": None},
            {"block_hash": 4172160871627067949, "tokens_hash": 15355247268704632839, "mm_extra_info": None}]}},
        "dp_rank": 0}},
    {"worker_id": 2, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 2, "data": {
        "stored": {"parent_hash": 4172160871627067949, "start_position": None, "blocks": [
            {"block_hash": 15782441568240330313, "tokens_hash": 7979209851148607085, "mm_extra_info": None}]}},
        "dp_rank": 0}},
    {"worker_id": 1, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 3, "data": {
        "stored": {"parent_hash": 4172160871627067949, "start_position": None, "blocks": [
            {"block_hash": 10454497560973899929, "tokens_hash": 13738416445109219417, "mm_extra_info": None},
            {"block_hash": 3345782799051647241, "tokens_hash": 4354402608361660412, "mm_extra_info": None}]}},
        "dp_rank": 0}}]}}


def test_the_recorded_dump_per_worker_and_its_duplicate():
    parsed = parse_dump(RECORDED_DUMP)
    assert parsed.indexed_tokens == {"1": 96, "2": 80}
    d = duplicates(parsed, 256)
    assert d.duplicated_tokens == 64 and d.duplicated_bytes == 64 * 256
    (p,) = d.prefixes
    assert (p.block_hash, p.blocks, p.tokens, p.holders) == (4172160871627067949, 4, 64, ("1", "2"))
    assert duplicates(parsed, None).duplicated_bytes is None  # bytes unknown: said, not 0


def test_a_host_tier_copy_is_not_a_second_copy_in_a_pool():
    doc = {"m:g": {"block_size": 16, "events": [
        {**e, "storage_tier": "host_pinned"} if e["worker_id"] == 2 else e
        for e in RECORDED_DUMP["tiny:default"]["events"]]}}
    assert duplicates(parse_dump(doc), 256).duplicated_tokens == 0


def test_a_dump_in_another_shape_is_refused():
    with pytest.raises(DumpError):
        parse_dump([])
    with pytest.raises(DumpError):
        parse_dump({"m:g": {"events": []}})


def test_fleet_file_lines(tmp_path):
    path = tmp_path / "fleet.txt"
    path.write_text("# radixtop servers\nhttp://a:8765/\nb:8765  # no scheme: http\n"
                    "sglang=http://c:30000 radixtop=http://c:30100 dp=2\nsglang=http://d:30000\n")
    entries = read_fleet_file(path)
    assert [(e.url, e.kind, e.radixtop_url, e.dp_size) for e in entries] == [
        ("http://a:8765", "radixtop", None, 1), ("http://b:8765", "radixtop", None, 1),
        ("http://c:30000", "sglang", "http://c:30100", 2), ("http://d:30000", "sglang", None, 1)]
    specs = FleetFileSource(path, entries, Mapping({}, 30100)).discover().specs
    assert [(s.worker, s.dp_rank, s.radixtop_url, s.by_rule) for s in specs] == [
        ("http://a:8765", None, "http://a:8765", False), ("http://b:8765", None, "http://b:8765", False),
        ("http://c:30000", 0, "http://c:30100", False), ("http://c:30000", 1, "http://c:30101", False),
        ("http://d:30000", None, "http://d:30100", True)]
    for bad, said in (("ftp://x", "not an http"), ("sglang=http://x dp=two", "dp= wants"), ("x=1", "expected URL")):
        path.write_text(bad + "\n")
        with pytest.raises(BadRequest, match=said):
            read_fleet_file(path)


def test_fleet_file_vllm_lines(tmp_path):
    """``vllm=URL [radixtop=URL] [dp=N]``: a vLLM server and its radixtop (a ``radixtop serve
    --vllm-events``); without one, its own /metrics (SGLang's plugin port rule does not apply)."""
    path = tmp_path / "fleet.txt"
    path.write_text("vllm=http://v:8000 radixtop=http://v:8765 dp=2\nvllm=w:8000\n")
    entries = read_fleet_file(path)
    assert [(e.url, e.kind, e.radixtop_url, e.dp_size) for e in entries] == [
        ("http://v:8000", "vllm", "http://v:8765", 2), ("http://w:8000", "vllm", None, 1)]
    specs = FleetFileSource(path, entries, Mapping({"http://w:8000": "http://w:9000"}, 30100)).discover().specs
    assert [(s.worker, s.dp_rank, s.radixtop_url, s.by_rule, s.engine_url, s.engine) for s in specs] == [
        ("http://v:8000", 0, "http://v:8765", False, "http://v:8000", "vllm"),
        ("http://v:8000", 1, "http://v:8766", False, "http://v:8000", "vllm"),
        ("http://w:8000", None, "http://w:9000", False, "http://w:8000", "vllm")]
    path.write_text("vllm=http://x:8000\n")
    (spec,) = FleetFileSource(path, read_fleet_file(path), Mapping({}, 30100)).discover().specs
    assert (spec.radixtop_url, spec.by_rule) == (None, False)  # no plugin inside vLLM to guess a port of
    for bad, said in (("vllm=http://x sglang=http://y", "one of sglang= or vllm="),
                      ("vllm=ftp://x", "not an http"), ("vllm=http://x dp=0", "dp= wants"),
                      ("vllm=", "expected URL, sglang=URL or vllm=URL"),
                      ("vllm=http://x vllm=http://y", "expected URL, sglang=URL or vllm=URL")):
        path.write_text(bad + "\n")
        with pytest.raises(BadRequest, match=said) as caught:
            read_fleet_file(path)
        assert caught.value.message.startswith(f"{path}:1: ") and "\n" not in caught.value.message


def test_the_port_rule_is_dropped_where_two_workers_would_share_one_plugin(tmp_path):
    path = tmp_path / "fleet.txt"
    path.write_text("sglang=http://h:30000\nsglang=http://h:30001\nsglang=http://k:30000\n")
    found = FleetFileSource(path, read_fleet_file(path), Mapping({}, 30100)).discover()
    assert [s.radixtop_url for s in found.specs] == [None, None, "http://k:30100"]
    assert "http://h:30100 would be the radixtop plugin of 2 workers" in found.notes[0]


def test_map_file_and_plugin_url(tmp_path):
    path = tmp_path / "map.txt"
    path.write_text("http://h:30000 http://h:31000\nhttp://h:30001@1 http://h:32001\n7 http://k:30100\n7@1 k:30201\n")
    m = read_map_file(path)
    assert m == {"http://h:30000": "http://h:31000", "http://h:30001@1": "http://h:32001",
                 "7": "http://k:30100", "7@1": "http://k:30201"}
    mapping = Mapping(m, 30100)
    assert mapping.radixtop_for("http://h:30000", 2, "http://h:30000") == ("http://h:31002", False)
    assert mapping.radixtop_for("http://h:30001", 1, "http://h:30001") == ("http://h:32001", False)
    assert mapping.radixtop_for("7", 1, None) == ("http://k:30201", False)
    assert mapping.radixtop_for("8", None, "http://10.0.0.8") == ("http://10.0.0.8:30100", True)
    assert plugin_url("http://[::1]:30000", 3) == "http://[::1]:30103"


def test_tokens_file_mode_owner_and_lines(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# radixtop tokens\nhttp://a:8765 secret-token-aaaaaaaa\nb:1 k\n")
    path.chmod(0o640)
    with pytest.raises(BadRequest, match="mode 0640"):
        read_tokens_file(path)
    path.chmod(0o600)
    assert read_tokens_file(path) == {"http://a:8765": "secret-token-aaaaaaaa", "http://b:1": "k"}
    link = tmp_path / "link"
    os.symlink(path, link)
    with pytest.raises(BadRequest, match="cannot read the tokens file"):
        read_tokens_file(link)
    path.write_text("http://a:8765 secret-token-aaaaaaaa extra\n")
    with pytest.raises(BadRequest) as err:
        read_tokens_file(path)
    assert "secret" not in err.value.message  # a bad line is named by number, never echoed


def test_order_by_pressure_and_unknown_is_never_zero():
    def r(name, protected=None, free=None, reachable=True):
        return WorkerRow(name, None, None, "sglang", reachable, capacity_tokens=1000 if protected is not None else None,
                         unevictable_tokens=protected, available_tokens=free)
    rows = [r("down", reachable=False), r("unknown"), r("low", 100, 800), r("high", 700, 0), r("mid", 100, 10)]
    assert [x.worker for x in by_pressure(rows)] == ["high", "mid", "low", "unknown", "down"]
    unknown = cells(r("unknown"))
    assert unknown[3:10] == ("?",) * 7 and "0" not in unknown[3:10]
    assert r("unknown").to_dict()["hit_rate"] is None and r("unknown").to_dict()["available_bytes"] is None


def test_the_fleet_command_and_pollers_load_neither_torch_textual_nor_sglang():
    from tests.support.modules import loaded_modules

    mods = loaded_modules("import radixtop.adapters.fleet.probe, radixtop.cli.fleet")
    assert "radixtop.adapters.fleet.probe" in mods and "httpx" in mods
    assert not {"torch", "textual", "sglang", "uvicorn"} & mods


def test_smg_dp_aware_entries_become_rows_per_rank_of_their_base_url():
    """SMG --dp-aware over a worker with two DP ranks: entries ``url@0``, ``url@1`` with
    ``dp_rank``, ``dp_size``, ``dp_base_url`` (not load-polled, so /get_loads lists none). The
    fields as SMG 1.13 names them (its other fields as recorded from a real SMG)."""
    from fastapi import FastAPI

    from radixtop.adapters.fleet.probe import poll_fleet
    from radixtop.adapters.fleet.sources import SmgSource
    from tests.support.live_server import running_server

    base = "http://10.9.9.9:30000"  # nothing answers there: the rows fall back to SMG's own figures
    entries = [{"id": f"w{r}", "model_id": "m", "url": f"{base}@{r}", "worker_type": "regular",
                "connection_mode": "http", "runtime_type": "sglang", "is_healthy": r == 0, "status": "ready",
                "load": 0, "dp_rank": r, "dp_size": 2, "dp_base_url": base} for r in (0, 1)]
    gateway = FastAPI()
    gateway.get("/workers")(lambda: {"workers": entries, "total": 2, "stats": {}})
    gateway.get("/get_loads")(lambda: {"timestamp": "", "version": "smg-1.13.0", "dp_rank_count": 0, "loads": []})
    with running_server(gateway) as url:
        view = poll_fleet(SmgSource(url, Mapping({base: "http://10.9.9.9:31000"}, None)), timeout=0.3)
    rows = {r.key: r for r in view.rows}
    assert set(rows) == {f"{base}@0", f"{base}@1"}
    assert rows[f"{base}@1"].radixtop_url == "http://10.9.9.9:31001"  # the map's rank 0 port + 1
    assert rows[f"{base}@1"].healthy is False and "SMG marks it unhealthy" in rows[f"{base}@1"].why
    assert not any(r.reachable for r in rows.values())  # neither radixtop nor engine answers


def test_a_worker_still_out_at_the_deadline_gets_a_reason_and_the_poll_ends(monkeypatch):
    import threading
    import time

    from radixtop.adapters.fleet import probe
    from radixtop.adapters.fleet.sources import Discovery, Source, WorkerSpec

    class Two(Source):
        label = "two"

        def discover(self) -> Discovery:
            return Discovery((WorkerSpec("http://fast:1", None, "http://fast:1"),
                              WorkerSpec("http://stuck:1", None, "http://stuck:1")))

    release = threading.Event()

    def read_worker(spec, tokens, timeout):
        if "stuck" in spec.worker:
            release.wait(10)  # a read its own timeouts do not end in time
        return WorkerRow(spec.worker, None, spec.radixtop_url, "radixtop", True, capacity_tokens=10,
                         available_tokens=10, evictable_tokens=0, unevictable_tokens=0)

    monkeypatch.setattr(probe, "read_worker", read_worker)
    started = time.monotonic()
    view = probe.poll_fleet(Two(), timeout=0.2)
    release.set()
    assert time.monotonic() - started < 5  # its deadline is 2 x 0.2 + 0.5 s; the stuck read waits 10 s
    rows = {r.worker: r for r in view.rows}
    assert rows["http://fast:1"].reachable
    stuck = rows["http://stuck:1"]
    assert not stuck.reachable and stuck.why == "no answer within 0.9 s" and stuck.capacity_tokens is None
