"""`radixtop close/evict/flush` with a token that only reads: one line, before any plan is shown
or confirmation asked, and nothing sent to the server to refuse (issue 26, item 1)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app as cli_app
from tests.support.engines import build_engine
from tests.support.live_server import running_server

ACTION = "cli-action-token-0123456789"
READ = "cli-read-token-0123456789"
COMMANDS = (["close", "b"], ["close", "a", "b", "--yes"], ["close", "b", "--yes", "--json"], ["evict", "5"],
            ["evict", "5", "--yes"], ["flush"], ["flush", "--yes", "--json"])


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


@pytest.mark.parametrize("token", [READ, None], ids=["read-token", "no-token"])
def test_an_action_with_a_token_that_only_reads_is_refused_before_the_plan_or_the_question(engine, tmp_path, token):
    audit = AuditLog(tmp_path / "audit.jsonl")
    with running_server(create_app(BundledAdapter(engine), ACTION, audit, read_token=READ)) as url:
        env = {"RADIXTOP_URL": url, "COLUMNS": "200", **({"RADIXTOP_TOKEN": token} if token else {})}
        for command in COMMANDS:
            result = CliRunner().invoke(cli_app, command, env=env)
            assert result.exit_code == 1, (command, result.output)
            assert result.stdout == "", (command, result.stdout)  # no plan, no question
            assert result.stderr.count("\n") == 1, (command, result.stderr)
            want = "this token only reads: actions need the action token" if token else "no token given; set RADIXTOP_TOKEN"
            assert want in result.stderr and "--yes" not in result.stderr, (command, result.stderr)
            assert "Traceback" not in result.output
        assert [e for e in audit.tail(100) if not e.allowed] == []  # no action was sent to be refused
        dry = CliRunner().invoke(cli_app, ["close", "b", "--dry-run"], env=env)
        assert dry.exit_code == 0 and "close plan" in dry.stdout, dry.output
    audit.close()
    assert BundledAdapter(engine).plan_close("b").state == "open"
