"""The faces over SGLang's plain HTTP surface (no plugin, no events): the dashboard and the
commands through radixtop's admin API, against the stand-in SGLang server of
tests/on_sglang/ref/fake_sglang_http.py. Close is blind there: no preview, what was freed is read
back afterwards, and every face says so."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.sglang.routes import SGLangRoutesAdapter
from tests.on_sglang.test_routes import TINY, busy_day, sglang
from tests.support.live_server import running_server


def test_commands_over_radixtop_serve_of_a_plain_sglang_server():
    from radixtop.cli.main import app

    runner = CliRunner()
    with sglang("0.5.16") as (sg_url, sg):
        busy_day(sg)
        local = SGLangRoutesAdapter(sg_url, geometry=TINY, settle_s=0)
        with running_server(create_app(local, "tok", AuditLog(None))) as url:
            def run(*args: str, stdin: str | None = None):
                return runner.invoke(app, [args[0], "--url", url, *args[1:]], env={"RADIXTOP_TOKEN": "tok"},
                                     input=stdin)

            stats = json.loads(run("stats", "--json").stdout)
            assert stats["capacity_tokens"] == 4096 and stats["evictable_tokens"] == 80
            no_tree = run("tree")
            assert no_tree.exit_code == 1 and "SGLANG_PLUGINS=radixtop" in no_tree.output
            assert run("close", "a", "--dry-run").exit_code == 1  # no preview to show
            closed = run("close", "a", "--yes")
            assert closed.exit_code == 0 and "cannot show a close plan" in closed.output
            assert "80 tokens" in closed.output and "seen freed" in closed.output
            assert ("POST", "/close_session", {"session_id": "a"}) in sg.calls
            assert run("flush").exit_code != 0  # no terminal, no --yes: refused before asking SGLang
        local.release()


async def test_the_dashboard_on_a_plain_sglang_server():
    from radixtop.inspector.app import RadixtopApp
    from tests.dashboard.test_dashboard import idle, screen_text, settle

    with sglang("0.5.16") as (sg_url, sg):
        busy_day(sg)
        adapter = SGLangRoutesAdapter(sg_url, geometry=TINY, settle_s=0)
        app = RadixtopApp(adapter, target=sg_url, interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, polls=2)
            text = screen_text(app)
            assert "No tree from this target" in text and "sessions: not available here" in text
            assert app.home.stats.evictable_tokens == 80 and app.home.down is None
            await pilot.press("E")  # evict: this target cannot, and says why
            await idle(pilot, app)
            assert any("cannot evict" in n.message for n in app._notifications)
        adapter.release()
    assert not any(path == "/close_session" for _, path, _ in sg.calls)
