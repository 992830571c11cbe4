"""The fleet over one real SGLang CPU server running radixtop's plugin (0.5.16, tests/on_sglang/server),
seen through a real SMG (PyPI `smg`) and a real Dynamo KV indexer (PyPI `ai-dynamo-runtime`) fed by the
server's own KV-event publisher (`--kv-events-config`, with its replay endpoint).

SMG: the worker found through SMG's /workers, its radixtop by the plugin's port rule (checked: a
radixtop that is not the worker's plugin is not believed), or, without it, SGLang's own routes with
what they cannot tell marked unknown. Dynamo: the server's blocks in the indexer's dump, and a prefix
it caches that a second SGLang cache (in this process, page size 1 as on the server) caches too."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from radixtop.adapters.fleet.probe import poll_fleet
from radixtop.adapters.fleet.sources import DynamoSource, Mapping, SmgSource
from radixtop.cli.embedded import demo_server
from tests.fleet.engines import dynamo_indexer, smg
from tests.on_sglang.server import BYTES_PER_TOKEN, launch
from tests.on_sglang.test_kv_events import Server, sgl  # noqa: F401  (sgl: the fixture)
from tests.support.live_server import free_port, free_ports


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet-smg")
    events_port, replay_port = free_port(), free_port()
    kv_events = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{events_port}",
                            "replay_endpoint": f"tcp://*:{replay_port}", "topic": "kv"})
    srv = launch(work, sessions=True, metrics=True, extra_args=("--kv-events-config", kv_events))
    srv.kv_events = (f"tcp://127.0.0.1:{events_port}", f"tcp://127.0.0.1:{replay_port}")
    try:
        for i in range(4):  # a shared prefix, four sessions
            srv.generate(list(range(10, 150)) + [200 + i] * 20, max_new_tokens=4, session_id=f"fleet-{i}")
        with smg([srv.url], work / "smg.log") as gateway:
            yield srv, gateway
    finally:
        srv.stop()


def admin_port(srv) -> int:
    return int(srv.admin_url.rsplit(":", 1)[1])


def test_the_worker_through_smg_and_its_plugin_by_the_port_rule(fleet):
    srv, gateway = fleet
    source = SmgSource(gateway, Mapping({}, admin_port(srv)))
    deadline = time.monotonic() + 60
    while True:  # SMG's /get_loads has no figures for a worker until its first load report: unknown till then
        view = poll_fleet(source, timeout=5)
        assert not view.error and len(view.rows) == 1
        row = view.rows[0]
        if row.running_requests is not None:
            break
        assert time.monotonic() < deadline, f"SMG's /get_loads gave no figures for the worker in 60 s: {row.why}"
        time.sleep(0.5)
    assert row.worker == srv.url and row.dp_rank is None
    assert row.source == "radixtop" and row.radixtop_url == srv.admin_url and row.reachable, row.why
    assert row.healthy is True and row.running_requests == 0  # SMG's health, SMG's /get_loads
    assert row.capacity_tokens == 4096 and row.bytes_per_token == BYTES_PER_TOKEN
    assert row.available_tokens + row.evictable_tokens + row.unevictable_tokens == 4096
    assert row.evictable_tokens > 0 and row.open_sessions == 4
    assert row.model.endswith("tiny-llama")


def test_without_radixtop_the_engines_own_figures_and_unknowns(fleet):
    srv, gateway = fleet
    view = poll_fleet(SmgSource(gateway, Mapping({}, None)), timeout=5)
    row = view.rows[0]
    assert row.source == "sglang" and row.reachable and row.radixtop_url is None
    assert row.capacity_tokens == 4096 and row.unevictable_tokens is not None
    assert row.open_sessions is None  # SGLang's routes list no sessions: unknown, not 0
    assert row.prompt_tokens and row.prompt_tokens > 0  # --enable-metrics: the counters are there
    if row.available_tokens is None:  # its KV gauges come after a batch (or within 30 s idle)
        assert row.evictable_tokens is None and "available and evictable apart" in row.why
    else:
        assert row.available_tokens + row.evictable_tokens + row.unevictable_tokens == 4096


def test_a_dead_radixtop_falls_back_to_the_engine_and_says_why(fleet, tmp_path):
    srv, gateway = fleet
    dead = f"http://127.0.0.1:{free_port()}"
    view = poll_fleet(SmgSource(gateway, Mapping({srv.url: dead}, None)), timeout=2)
    row = view.rows[0]
    assert row.source == "sglang" and row.reachable and row.radixtop_url is None
    assert f"radixtop: cannot reach {dead}" in row.why


def test_a_radixtop_that_is_not_the_workers_plugin_is_not_believed(fleet):
    srv, gateway = fleet
    with demo_server("not the plugin", "tiny", 1024, 4, 0, 10.0) as other:
        port = int(other.url.rsplit(":", 1)[1])
        view = poll_fleet(SmgSource(gateway, Mapping({}, port)), timeout=5)
    row = view.rows[0]
    assert row.source == "sglang"
    assert "is a radixtop ('not the plugin') but not this worker's plugin" in row.why


def test_the_cli_over_smg(fleet):
    import json
    import subprocess
    import sys

    srv, gateway = fleet
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "fleet", "--smg", gateway,
                           "--radixtop-port", str(admin_port(srv)), "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["source"] == f"smg {gateway}" and doc["rows"][0]["source"] == "radixtop"
    assert doc["rows"][0]["open_sessions"] == 4


def test_smg_dp_aware_over_one_rank_keeps_one_entry_and_one_row(fleet, tmp_path):
    """SMG 1.13 --dp-aware splits a worker into ``url@rank`` entries only where the worker has
    several DP ranks; over this one-rank server it lists the plain URL (the split shape is tested
    in test_fleet_model.py from SMG's documented fields: a CPU server with --dp-size 2 is more than
    these machines run beside the rest)."""
    import httpx

    srv, _ = fleet
    with smg([srv.url], tmp_path / "smg-dp.log", "--dp-aware") as gateway:
        (entry,) = httpx.get(f"{gateway}/workers", timeout=5, trust_env=False).json()["workers"]
        assert entry["url"] == srv.url
        view = poll_fleet(SmgSource(gateway, Mapping({}, admin_port(srv))), timeout=5)
    (row,) = view.rows
    assert (row.worker, row.dp_rank) == (srv.url, None)
    assert row.source == "radixtop" and row.radixtop_url == srv.admin_url and row.open_sessions == 4


def test_the_servers_kv_events_in_dynamo_and_a_prefix_cached_twice(fleet, sgl, tmp_path):  # noqa: F811
    """The real server registers with the indexer after it has served requests: the indexer asks
    its replay endpoint for what came before (without it, every later store fails: "parent block
    not found"). A second SGLang cache holding the fleet's shared prefix makes it cached twice."""
    srv, _ = fleet
    shared = list(range(10, 150))  # the prefix of every request the fixture sent
    other_port = free_ports(1)
    other = Server(sgl, other_port, None, page_size=1, capacity=1024)
    try:
        with dynamo_indexer(tmp_path / "indexer.log", 1) as url, \
                httpx.Client(base_url=url, timeout=5, trust_env=False) as http:
            for body in ({"instance_id": 7, "endpoint": srv.kv_events[0], "replay_endpoint": srv.kv_events[1],
                          "model_name": "tiny", "block_size": 1},
                         {"instance_id": 8, "endpoint": f"tcp://127.0.0.1:{other_port}", "model_name": "tiny",
                          "block_size": 1}):
                reply = http.post("/register", json=body)
                assert reply.status_code == 201, reply.text
            srv.generate(shared + [400] * 8, max_new_tokens=2, session_id="fleet-late")  # after registering
            deadline = time.monotonic() + 120
            # the indexer's /dump on a busy machine (three CI runs at once) took past the default
            # 3 s source timeout: a generous one, as an operator would give a loaded indexer
            source = DynamoSource(url, Mapping({"7": srv.admin_url}, None), timeout=15)
            while True:  # (the in-process cache publishes again until the indexer has connected)
                other.reset()
                other.insert(shared)
                other.publish()
                other.flushed()
                time.sleep(1.0)
                view = poll_fleet(source, timeout=5)
                if view.duplicates and view.duplicates.prefixes:
                    break
                assert time.monotonic() < deadline, (
                    f"no prefix cached twice in 120 s: error {view.error!r}, notes {view.notes}, duplicates "
                    f"{view.duplicates}, rows {[(r.key, r.indexed_tokens, r.why) for r in view.rows]}",
                    (tmp_path / "indexer.log").read_text()[-3000:])
    finally:
        other.close()
    rows = {r.key: r for r in view.rows}
    assert rows["7"].source == "radixtop" and rows["7"].radixtop_url == srv.admin_url  # the plugin, by --map
    assert rows["7"].indexed_tokens >= len(shared) + 8 and rows["8"].indexed_tokens == len(shared)
    assert rows["8"].source == "dynamo" and rows["8"].capacity_tokens is None
    (prefix,) = view.duplicates.prefixes
    assert prefix.holders == ("7", "8") and prefix.tokens == len(shared) and prefix.blocks == len(shared)
    assert view.duplicates.duplicated_tokens == len(shared)
    assert view.duplicates.duplicated_bytes == len(shared) * BYTES_PER_TOKEN  # bytes per token from the plugin
