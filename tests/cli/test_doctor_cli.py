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


HOSTILE_IDS = ["$(touch pwned-a)", "`touch pwned-b`", "s3 --yes", "-x; touch pwned-c", "it's"]


def test_a_suggested_command_pasted_into_a_shell_closes_that_session_and_runs_nothing_else(tmp_path):
    """On SGLang session ids come from the API's users: `doctor`'s `radixtop close <id>` must be
    safe to paste. Each suggestion, run by a real shell (with `radixtop` a stub that prints its
    arguments), gives `close` exactly that id after `--`, and runs no command of the id's."""
    import shlex
    import subprocess

    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler
    from tests.support.engines import CounterClock

    s = Scheduler(get_geometry("tiny"), 256, device="cpu", clock=CounterClock())
    for k, sid in enumerate(HOSTILE_IDS):
        s.request(f"r{k}", [100 + k, 1, 2], [3], sid)
    engine = Engine(s, None).start()
    try:
        with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
            doc = json.loads(run(url, "--idle-after", "0", "--json").stdout)
    finally:
        engine.stop()
    actions = {f["session_id"]: f["action"] for f in doc["findings"] if f["kind"] == "idle_session"}
    assert set(actions) == set(HOSTILE_IDS)
    stub = tmp_path / "bin" / "radixtop"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n")
    stub.chmod(0o755)
    for sid, action in actions.items():
        command = next(action[:k] for k in range(len(action)) if action.startswith(": ", k) and _words(action[:k]))
        assert command.startswith("radixtop close -- "), action
        done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                              env={"PATH": f"{stub.parent}:/usr/bin:/bin"})
        assert done.returncode == 0 and done.stdout.splitlines() == ["close", "--", sid], (command, done.stdout)
        assert shlex.split(command)[3:] == [sid]
    assert not list(tmp_path.glob("pwned-*"))


def _words(text: str) -> list[str] | None:
    import shlex

    try:
        return shlex.split(text)
    except ValueError:  # a quote left open: the ': ' was inside it
        return None
