"""A figure the target cannot know is said to be unknown in every face, never shown as 0: the
nodes an evict or a flush freed on SGLang's Rust tree core (it counts tokens, not nodes)."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from tests.support.live_server import running_server

TOKEN = "unknown-figures-test-token-0123456789"


class UncountedNodes(BundledAdapter):
    """A target that frees tokens but cannot count the nodes they were in (the Rust core)."""

    def evict(self, num_tokens):
        return dataclasses.replace(super().evict(num_tokens), evicted_nodes=None)

    def flush(self):
        return dataclasses.replace(super().flush(), freed_nodes=None)


@pytest.fixture
def served():
    s = Scheduler(get_geometry("tiny"), 256, device="cpu")
    for k in range(4):
        s.request(f"r{k}", [10 * k + 1, 10 * k + 2, 10 * k + 3], [9], f"s{k}")
    engine = Engine(s, None).start()
    with running_server(create_app(UncountedNodes(engine), TOKEN, AuditLog(None))) as url:
        yield url
    engine.stop()


def run(url: str, *args: str):
    return CliRunner().invoke(app, list(args), env={"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN, "COLUMNS": "200"})


def test_evict_and_flush_say_the_nodes_are_unknown_not_0(served):
    evicted = run(served, "evict", "2", "--yes")
    assert evicted.exit_code == 0, evicted.output
    assert "nodes unknown" in evicted.stdout and "0 nodes" not in evicted.stdout, evicted.stdout
    assert RadixtopClient(served, token=TOKEN).evict(1).evicted_nodes is None  # over the wire: None, not 0
    flushed = run(served, "flush", "--yes")
    assert flushed.exit_code == 0, flushed.output
    assert "nodes unknown" in flushed.stdout and "0 nodes" not in flushed.stdout, flushed.stdout
