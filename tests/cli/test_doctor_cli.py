"""`radixtop doctor` against a real admin API server: its report, --json, and exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server

TOKEN = "doctor-cli-test-token"


@pytest.fixture
def served():
    engine = build_engine()
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        yield url, engine
    engine.stop()


def run(url: str, *args: str):
    result = CliRunner().invoke(app, ["doctor", *args], env={"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN})
    assert "Traceback" not in result.output
    return result


def test_healthy_exits_0_and_a_planted_lock_exits_1_with_what_it_means_and_the_fix(served):
    url, engine = served
    healthy = run(url)
    assert healthy.exit_code == 0 and "healthy: nothing found" in healthy.stdout
    assert "checked buckets, leaked_lock" in healthy.stdout
    assert json.loads(run(url, "--json").stdout)["healthy"] is True

    def plant(s) -> int:
        node = next(iter(s.cache._session_leaves["b"]))
        s.cache.inc_lock_ref(node)
        return node.id

    node_id = engine.call(plant)
    found = run(url)
    assert found.exit_code == 1 and f"[leaked_lock] node #{node_id}" in found.stdout
    assert "means:" in found.stdout and "fix:" in found.stdout and "report it" in found.stdout
    doc = json.loads(run(url, "--json").stdout)
    assert doc["healthy"] is False and [f["kind"] for f in doc["findings"]] == ["leaked_lock"]
    idle = run(url, "--idle-after", "0", "--json")
    assert idle.exit_code == 1
    assert {f["session_id"] for f in json.loads(idle.stdout)["findings"] if f["kind"] == "idle_session"} == {"a"}  # b: its node is the locked one


def test_usage_and_unreachable_exit_codes():
    assert run("http://127.0.0.1:1", "--idle-after", "-5").exit_code == 2
    down = run(f"http://127.0.0.1:{free_port()}", "--timeout", "1")
    assert down.exit_code == 3 and down.stdout == "" and "radixtop:" in down.stderr
