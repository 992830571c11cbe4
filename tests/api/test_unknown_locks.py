"""A target that tells no locks (a tree kept from KV events: SGLang's or vLLM's) says a session's
locked tokens are unknown, never 0: in the adapter, over the admin API, in the sessions command."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.wire import Batch, Stored
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app as cli
from tests.support.live_server import running_server

TOKEN = "unknown-locks-token-0123456789"


def test_a_kv_event_tree_tells_no_locked_tokens():
    adapter = EventTreeAdapter(name="events", bytes_per_token=2, capacity_tokens=100)
    adapter.apply_batch(0, Batch(time.time(), 0, [Stored((1, 2), None, (7, 8), 1, "GPU", session_id="alice")]))
    (row,) = adapter.sessions().sessions
    assert row.locked_tokens is None and adapter.session("alice").session.locked_tokens is None
    with running_server(create_app(adapter, TOKEN, AuditLog(None))) as url:
        remote = RadixtopClient(url, token=TOKEN)
        try:
            assert remote.sessions().sessions[0].locked_tokens is None
        finally:
            remote.release()
        shown = CliRunner().invoke(cli, ["sessions", "--url", url], env={"RADIXTOP_TOKEN": TOKEN})
        (line,) = [x for x in shown.stdout.splitlines() if "alice" in x]
        assert line.split("│")[7].strip() == "unknown"  # the locked column
