"""The SGLang plugin, loaded by SGLang's own plugin loader and hook registry: the contract suite,
the commands and the dashboard over its HTTP API, against a CPU-built SGLang 0.5.16 cache whose
scheduler loop drains the plugin's queue through the hooked ``process_input_requests``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from radixtop.adapters.errors import TargetTimeout
from tests.contract.suite import ContractSuite
from tests.on_sglang.ref.plugin16 import TOKEN, load_plugin, plugin_target
from tests.support.live_server import free_port


@pytest.fixture
def adapter():
    with plugin_target() as (remote, _, _):
        yield remote


@pytest.fixture
def read_only_adapter():
    with plugin_target(read_only=True) as (remote, _, _):
        yield remote



class TestPlugin(ContractSuite):
    """The contract over the plugin's admin API inside a CPU-built SGLang 0.5.16 scheduler."""


def test_the_loader_installs_both_hooks_on_the_scheduler():
    sgl = load_plugin()
    from radixtop.adapters.sglang import plugin as sglang_plugin

    hooked = {target: [h for _, h, _ in hooks] for target, hooks in sgl.HookRegistry._hooks.items()}
    assert sglang_plugin._after_init in hooked["sglang.srt.managers.scheduler.Scheduler.__init__"]
    assert sglang_plugin._after_inputs in hooked[
        "sglang.srt.managers.scheduler.Scheduler.process_input_requests"]
    assert "sglang.srt.managers.scheduler.Scheduler.process_input_requests" in sgl.HookRegistry._patched


def test_close_goes_through_sglangs_scheduler_handler():
    with plugin_target() as (remote, replayer, loop):
        controller = loop.scheduler.session_controller
        assert "b" in controller.sessions
        result = remote.close_session("b")
        assert result.freed_tokens == 3
        assert "b" not in controller.sessions and "b" in replayer.cache._closed_session_ids


def test_a_scheduler_that_stops_draining_times_out_cleanly():
    with plugin_target() as (remote, replayer, loop):
        from radixtop.adapters.sglang import plugin as sglang_plugin

        attached = sglang_plugin.attached_to(loop.scheduler)
        attached.adapter.timeout = 0.3
        loop.running.clear()
        with pytest.raises(TargetTimeout, match="SGLang scheduler .DP rank 0. did not take the request"):
            remote.close_session("b")
        loop.running.set()
        assert "b" in replayer.cache._session_leaves  # the timed-out close never ran late
        assert remote.plan_close("b").state == "open"


def test_every_command_works_over_the_plugin():
    from radixtop.cli.main import app

    runner = CliRunner()
    with plugin_target() as (remote, _, _):
        url = remote.base_url if hasattr(remote, "base_url") else remote.name
        base = ["--url", url]

        def run(*args: str):
            return runner.invoke(app, [args[0], *base, *args[1:]], env={"RADIXTOP_TOKEN": TOKEN})

        stats = json.loads(run("stats", "--json").stdout)
        assert stats["capacity_tokens"] == 256 and stats["open_sessions"] == 4
        assert run("tree").exit_code == 0
        tree = json.loads(run("tree", "--json").stdout)
        first = tree["children"][0]["node"]["id"]
        assert run("node", str(first)).exit_code == 0
        assert {s["id"] for s in json.loads(run("sessions", "--json").stdout)["sessions"]} >= {"a", "b", "c", "d"}
        assert json.loads(run("session", "b", "--json").stdout)["session"]["exclusive_bytes"] == 768
        assert json.loads(run("match", "1", "2", "3", "4", "5", "--json").stdout)["matched_tokens"] == 5
        assert run("close", "b", "--dry-run").exit_code == 0
        closed = run("close", "b", "--yes", "--json")
        assert closed.exit_code == 0 and json.loads(closed.stdout)["results"][0]["freed_tokens"] == 3
        assert run("close", "nobody", "--yes").exit_code == 1
        assert run("evict", "1", "--yes").exit_code == 0
        assert run("flush", "--yes").exit_code == 0
        assert run("export").exit_code == 0
        assert run("audit").exit_code == 0


async def test_the_dashboard_over_the_plugin():
    from radixtop.inspector.app import RadixtopApp
    from radixtop.inspector.modals import ConfirmScreen
    from radixtop.inspector.sessions_view import SessionsTable
    from radixtop.inspector.tree_view import CacheTree
    from tests.dashboard.test_dashboard import idle, open_sessions, screen_text, settle

    with plugin_target() as (remote, replayer, _):
        app = RadixtopApp(remote, interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, polls=2)
            rows = app.query_one(CacheTree).rows
            assert rows and rows[0].node.first_tokens[:4] == (1, 2, 3, 4)  # the shared prompt first
            assert {s.id for s in app.query_one(SessionsTable).rows} == {"a", "b", "c", "d", "gone"}
            assert "sglang dp0 tiny" in screen_text(app) and "LIVE" in screen_text(app)
            await open_sessions(pilot, app, "b")
            await pilot.press("c")
            await idle(pilot, app)
            assert isinstance(app.screen, ConfirmScreen) and "frees 768 B now" in app.screen.title_text
            await pilot.click("#confirm")
            await idle(pilot, app)
            assert "b" in replayer.cache._closed_session_ids
            assert any("freed 3 tok" in n.message for n in app._notifications)


def test_the_plugin_shows_text_with_the_servers_tokenizer():
    """Started with its tokenizer, the server's previews and node details carry text (the ids
    stay beside it); without one, ids only."""
    from radixtop.gpu_backend.demo_text import DEMO_TOKENIZER

    with plugin_target(tokenizer=DEMO_TOKENIZER) as (remote, _, _):
        child = remote.children(0).children[0]
        assert child.text == DEMO_TOKENIZER.decode(list(child.first_tokens)) and child.text
        detail = remote.node(child.id, 0, 2)
        assert detail.text == DEMO_TOKENIZER.decode(list(detail.token_ids)) and detail.token_ids
    with plugin_target() as (remote, _, _):
        child = remote.children(0).children[0]
        assert child.text is None and remote.node(child.id).text is None


@pytest.mark.parametrize("value, beside", [(None, True), ("", True), ("1", True), ("on", True), ("0", False),
                                           ("off", False), ("false", False)])
def test_radixtop_runs_beside_the_scheduler_unless_told_otherwise(monkeypatch, value, beside):
    from radixtop.adapters.sglang.plugin import beside_wanted

    if value is None:
        monkeypatch.delenv("RADIXTOP_BESIDE", raising=False)
    else:
        monkeypatch.setenv("RADIXTOP_BESIDE", value)
    assert beside_wanted() is beside


def test_a_place_radixtop_does_not_know_is_one_line(monkeypatch):
    from radixtop.adapters.sglang.plugin import beside_wanted

    monkeypatch.setenv("RADIXTOP_BESIDE", "maybe")
    with pytest.raises(ValueError, match="RADIXTOP_BESIDE must be 1 .*, 0 .* or attach"):
        beside_wanted()
    monkeypatch.setenv("RADIXTOP_BESIDE", " Attach ")
    assert beside_wanted() == "attach"


@pytest.mark.parametrize("value", ["ture", "read-only", "2"])
def test_a_read_only_switch_radixtop_cannot_read_is_refused_not_taken_for_off(monkeypatch, value):
    """``RADIXTOP_READ_ONLY`` misspelt must not leave the actions on: the plugin refuses to attach
    (one line; SGLang goes on without radixtop), and radixtop's process beside says so and exits."""
    from radixtop.adapters.sglang.plugin import attach

    monkeypatch.setenv("RADIXTOP_READ_ONLY", value)
    with pytest.raises(ValueError, match="RADIXTOP_READ_ONLY must be 1 .* or 0") as refused:
        attach(object(), port=free_port())
    assert "\n" not in str(refused.value)
    done = subprocess.run([sys.executable, "-m", "radixtop.adapters.sglang.beside", "--handover-fd", "0",
                           "--socket-fd", "0"], env={**os.environ, "RADIXTOP_READ_ONLY": value},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "RADIXTOP_READ_ONLY must be 1" in done.stderr


@pytest.mark.parametrize("value, read_only", [(None, False), ("", False), ("1", True), ("on", True), ("0", False),
                                              ("off", False)])
def test_the_read_only_switch_reads_as_the_other_switches(monkeypatch, value, read_only):
    from radixtop.adapters.owned.common import switch

    assert switch(value, "RADIXTOP_READ_ONLY", False) is read_only


def test_radixtop_runs_in_the_scheduler_when_its_process_beside_cannot_start(monkeypatch, caplog):
    """Beside is the default; where radixtop's process cannot start, radixtop serves from the
    scheduler's process (one line says why) rather than not at all."""
    from radixtop.adapters.sglang import plugin as sglang_plugin
    from tests.on_sglang.ref.plugin16 import attach_plugin, build_known, stand_in

    def cannot(*a, **k):
        raise OSError("no room for another process")

    monkeypatch.setenv("RADIXTOP_BESIDE", "1")
    monkeypatch.setattr(sglang_plugin, "_beside", cannot)
    scheduler = stand_in(build_known())
    attached = attach_plugin(scheduler)
    try:
        assert attached is not None and attached.beside is None and attached.server is not None
        assert "did not start (OSError: no room for another process)" in caplog.text
    finally:
        attached.stop()
        setattr(scheduler, sglang_plugin.ATTACHED, None)


def test_a_bad_place_is_one_line_and_no_token_is_written(monkeypatch, caplog, tmp_path):
    from radixtop.adapters.sglang import plugin as sglang_plugin
    from tests.on_sglang.ref.plugin16 import build_known, stand_in

    monkeypatch.setenv("RADIXTOP_BESIDE", "maybe")
    monkeypatch.delenv("RADIXTOP_TOKEN", raising=False)
    monkeypatch.setenv("RADIXTOP_TOKEN_FILE", str(tmp_path / "token"))
    scheduler = stand_in(build_known())
    sglang_plugin._after_init(None, scheduler)
    assert sglang_plugin.attached_to(scheduler) is None
    assert "RADIXTOP_BESIDE must be 1" in caplog.text and "Traceback" not in caplog.text
    assert not (tmp_path / "token").exists()


def test_the_attach_points_directory_refused_says_so_not_the_tokens(monkeypatch, tmp_path):
    """RADIXTOP_BESIDE=attach writes no token: a private directory others can write is refused in
    the words of what it was for (it read "refusing to write the radixtop token")."""
    from radixtop.adapters.sglang.plugin import TokenFileError, attach_path

    (tmp_path / "radixtop").mkdir(mode=0o777)
    (tmp_path / "radixtop").chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(TokenFileError, match="refusing to make the probe's socket for radixtop attach: others can "
                                             "write directory"):
        attach_path(30100)
