"""The faces over the KV-events adapter: the dashboard (Pilot) and the commands, through
``radixtop serve --kv-events`` (a real subprocess) and its admin API, fed by SGLang's own publisher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from radixtop.adapters.events.zmq import KVEventsAdapter
from tests.on_sglang.test_kv_events import Server, catch_up, sgl  # noqa: F401  (the sgl fixture)
from tests.support.live_server import free_ports, wait_for_serve

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(90)]


async def test_the_dashboard_on_a_kv_event_stream(sgl):  # noqa: F811
    from radixtop.inspector.app import RadixtopApp
    from radixtop.inspector.tree_view import CacheTree
    from tests.dashboard.test_dashboard import idle, screen_text, settle

    port = free_ports()
    server = Server(sgl, port, None)
    try:
        with KVEventsAdapter(f"tcp://*:{port}", bytes_per_token=256, capacity_tokens=512) as adapter:
            catch_up(adapter, server)
            server.insert([1, 2, 3, 4, 5])
            server.insert([1, 2, 3, 9])
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            app = RadixtopApp(adapter, target="kv events", interval=0.2)
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot, app, polls=2)
                rows = app.query_one(CacheTree).rows
                assert rows[0].node.first_tokens == (1, 2, 3) and rows[0].node.num_children == 2
                text = screen_text(app)
                assert "READ-ONLY" in text and "sessions: not available here" in text
                await pilot.press("c")  # close: refused, and says why
                await idle(pilot, app)
                assert any("read-only" in n.message for n in app._notifications)
                assert app.home.down is None  # no poll failed on the missing sessions
    finally:
        server.close()


def test_serve_kv_events_then_every_read_command(sgl, tmp_path):  # noqa: F811
    from radixtop.cli.main import app

    port, api = free_ports(2), None
    api = port + 1
    server = Server(sgl, port, None)
    env = {**os.environ, "RADIXTOP_TOKEN": "kv-events-test-token-0123"}
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--kv-events", f"tcp://127.0.0.1:{port}",
         "--model", "tiny", "--capacity", "8192", "--port", str(api)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    url = f"http://127.0.0.1:{api}"
    try:
        wait_for_serve(proc, url, "radixtop serve --kv-events", 30)
        server.insert([7, 8, 9, 10])
        runner = CliRunner()

        def run(*args: str):
            return runner.invoke(app, [args[0], "--url", url, *args[1:]], env={"RADIXTOP_TOKEN": "kv-events-test-token-0123"})

        deadline = time.monotonic() + 20
        while json.loads(run("stats", "--json").stdout)["node_count"] == 0:
            assert time.monotonic() < deadline, "no events reached the server"
            server.publish()
            time.sleep(0.2)
        stats = json.loads(run("stats", "--json").stdout)
        assert stats["total_tokens"] == 4 and stats["bytes_per_token"] == 256  # --model tiny
        # --capacity is the pool's size (it was ignored: capacity 0 beside cached tokens)
        assert stats["capacity_tokens"] == 8192 and stats["available_tokens"] == 8192 - 4
        assert stats["available_tokens"] + stats["evictable_tokens"] == stats["capacity_tokens"]
        tree = json.loads(run("tree", "--json").stdout)
        assert tree["children"][0]["node"]["first_tokens"] == [7, 8, 9, 10]
        assert json.loads(run("match", "7", "8", "9", "--json").stdout)["matched_tokens"] == 3
        assert run("node", str(tree["children"][0]["node"]["id"])).exit_code == 0
        refused = run("evict", "1", "--yes")
        assert refused.exit_code == 1 and "read-only" in refused.output
        assert run("sessions").exit_code == 1  # not available from events: one clear line
    finally:
        proc.terminate()
        proc.wait(10)
        server.close()


async def test_the_dashboard_shows_the_sessions_a_stream_attributes(sgl):  # noqa: F811
    """0.5.19+'s tagged maps with ``session_id`` (0.5.23's real ones are in test_kv_events23.py),
    sent through 0.5.16's publisher: the dashboard's sessions table lists who stored the blocks,
    and a close is refused (read-only), in words."""
    from radixtop.inspector.app import RadixtopApp
    from tests.dashboard.test_dashboard import idle, screen_text, settle

    def stored(hashes, parent, tokens, session):
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                "block_size": 1, "lora_id": None, "medium": "GPU", "session_id": session}

    port = free_ports()
    server = Server(sgl, port, None)
    try:
        with KVEventsAdapter(f"tcp://*:{port}", bytes_per_token=256, capacity_tokens=512) as adapter:
            catch_up(adapter, server)
            server.publish(sgl.kv_events.KVEventBatch(ts=time.time(), events=[
                stored([1, 2, 3], None, [1, 2, 3], "alice-7"), stored([4], 3, [4], "bob-9")]))
            assert adapter.wait_for_seq(server.seq)
            app = RadixtopApp(adapter, target="kv events", interval=0.2)
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot, app, polls=2)
                text = screen_text(app)
                assert "alice-7" in text and "bob-9" in text and "not available here" not in text
                await pilot.press("c")  # close the holders of the node under the cursor: refused
                await idle(pilot, app)
                assert any("read-only" in n.message for n in app._notifications)
                assert app.home.down is None
    finally:
        server.close()
