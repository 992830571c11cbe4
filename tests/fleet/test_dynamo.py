"""`radixtop fleet --dynamo` over a real Dynamo KV indexer (PyPI `ai-dynamo-runtime` 1.6.1) fed by
real SGLang radix caches (SGLang's RadixCache with page size 16, its ZmqEventPublisher, one per
worker and DP rank): each worker's row with what the indexer says it caches, and the prefixes
cached on more than one worker with the bytes duplicated."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from radixtop.adapters.fleet.probe import poll_fleet
from radixtop.adapters.fleet.sources import DynamoSource, Mapping
from tests.fleet.engines import dynamo_indexer
from tests.on_sglang.test_kv_events import Server, sgl  # noqa: F401  (sgl: the fixture)
from tests.support.live_server import free_ports

BLOCK = 16
SHARED = list(range(100, 164))  # 4 blocks


def _dump_holders(http: httpx.Client) -> int:
    return sum(len(e["event"]["data"].get("stored", {}).get("blocks", []))
               for g in http.get("/dump").json().values() for e in g["events"])


@pytest.fixture(scope="module")
def indexer(sgl, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("dynamo") / "indexer.log"
    p1, p2 = free_ports(1), free_ports(2)
    workers = {"1": Server(sgl, p1, None, page_size=BLOCK, capacity=1024),
               "2": Server(sgl, p2, None, page_size=BLOCK, capacity=1024),
               "2@1": Server(sgl, p2, None, dp_rank=1, page_size=BLOCK, capacity=1024)}
    contents = {"1": SHARED + list(range(500, 532)),          # shared + 2 blocks of its own
                "2": SHARED + list(range(600, 616)),          # shared + 1 block
                "2@1": SHARED[:32] + list(range(700, 716))}   # half the shared prefix + 1 block
    try:
        with dynamo_indexer(log, BLOCK) as url, httpx.Client(base_url=url, timeout=5, trust_env=False) as http:
            for who, port in (("1", p1), ("2", p2), ("2@1", p2 + 1)):
                wid, _, rank = who.partition("@")
                body = {"instance_id": int(wid), "endpoint": f"tcp://127.0.0.1:{port}", "model_name": "tiny",
                        "block_size": BLOCK}
                if rank:
                    body["dp_rank"] = int(rank)
                reply = http.post("/register", json=body)
                assert reply.status_code == 201, reply.text
            # Events sent before the indexer's subscriber has connected are lost (it says
            # "active" at once): clear and publish again until the dump holds them all.
            expected = sum(len(c) // BLOCK for c in contents.values())
            deadline = time.monotonic() + 60
            while True:
                for who, server in workers.items():
                    server.reset()
                    server.insert(contents[who])
                    server.publish()
                    server.flushed()
                time.sleep(1.0)
                if _dump_holders(http) >= expected:
                    break
                assert time.monotonic() < deadline, f"the indexer never held the events: {log.read_text()[-2000:]}"
            yield url
    finally:
        for server in workers.values():
            server.close()


def test_rows_per_worker_and_rank_with_what_the_indexer_holds(indexer):
    view = poll_fleet(DynamoSource(indexer, Mapping({}, None)), timeout=3, bytes_per_token=256)
    assert not view.error
    rows = {r.key: r for r in view.rows}
    assert set(rows) == {"1", "2@0", "2@1"}
    assert rows["1"].indexed_tokens == 96 and rows["2@0"].indexed_tokens == 80 and rows["2@1"].indexed_tokens == 48
    for r in rows.values():
        assert r.source == "dynamo" and r.reachable and r.model == "tiny"
        assert r.capacity_tokens is None and r.available_tokens is None and r.open_sessions is None  # unknown
        assert "no radixtop URL known" in r.why


def test_prefixes_cached_twice_and_the_bytes_duplicated(indexer):
    view = poll_fleet(DynamoSource(indexer, Mapping({}, None)), timeout=3, bytes_per_token=256)
    d = view.duplicates
    assert d is not None and d.block_size == BLOCK
    # blocks 1-2 of the shared prefix on three ranks (2 extra copies), blocks 3-4 on two (1 extra)
    assert d.duplicated_tokens == 2 * BLOCK * 2 + 2 * BLOCK * 1
    assert d.duplicated_bytes == d.duplicated_tokens * 256
    by_holders = {p.holders: p for p in d.prefixes}
    assert set(by_holders) == {("1", "2", "2@1"), ("1", "2")}
    whole, half = by_holders[("1", "2")], by_holders[("1", "2", "2@1")]
    assert (whole.blocks, whole.tokens, whole.duplicated_tokens) == (4, 64, 64)
    assert (half.blocks, half.tokens, half.duplicated_tokens) == (2, 32, 64)
    assert whole.model == "tiny:default" and whole.duplicated_bytes == 64 * 256


def test_the_cli_over_dynamo(indexer):
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "fleet", "--dynamo", indexer,
                           "--radixtop-port", "0", "--model", "tiny", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["workers"] == 3 and doc["duplicates"]["duplicated_tokens"] == 96
    assert doc["duplicates"]["bytes_per_token"] == 256
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "fleet", "--dynamo", indexer,
                           "--radixtop-port", "0", "--model", "tiny"], capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "COLUMNS": "160"})
    assert "cached twice or more: 24.0 KiB in 2 prefixes" in done.stdout
    assert "1, 2, 2@1" in done.stdout


def test_a_mapped_worker_reads_its_radixtop_and_keeps_what_the_indexer_says(indexer):
    """With --map, instance 1's row comes from its radixtop (here a bundled demo server standing in
    for it), with the indexer's tokens beside; the duplicates' bytes per token then come from it."""
    from radixtop.cli.embedded import demo_server

    with demo_server("instance one", "tiny", 2048, 4, 0, 10.0) as one:
        view = poll_fleet(DynamoSource(indexer, Mapping({"1": one.url}, None)), timeout=3)
    rows = {r.key: r for r in view.rows}
    assert rows["1"].source == "radixtop" and rows["1"].radixtop_url == one.url
    assert rows["1"].capacity_tokens == 2048 and rows["1"].indexed_tokens == 96
    assert rows["2@0"].source == "dynamo"
    assert view.duplicates.bytes_per_token == 256 and view.duplicates.duplicated_bytes == 96 * 256
