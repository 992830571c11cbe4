"""Every face over a target whose strings are hostile: session ids, the target's name, decoded
token text and the audit journal hold Rich markup, terminal escapes, bells and bidi overrides.
Each face shows them as text (never markup, never a crash), with every control code made visible:
nothing a target says reaches the operator's terminal as a control sequence."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import httpx
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
from radixtop.inspector.app import RadixtopApp
from tests.support.live_server import running_server

TOKEN = "hostile-test-token-0123456789"
HOSTILE = ["[/]", "[bold red]loud", "\x1b[2J\x1b[31mred", "bell\x07\x08x", "rtl\u202egnp.exe", "two\nlines"]
NAME = "[/]\x1b]0;pwned\x07 target"
CONTROLS = ["\x1b", "\x07", "\x08", "\u202e", "\x9b"]


class HostileTokenizer:
    def decode(self, ids: list[int]) -> str:
        return "[/]\x1b[2J\x9b31m" + " ".join(map(str, ids))


@pytest.fixture(scope="module")
def server():
    s = Scheduler(get_geometry("tiny"), 256, device="cpu")
    for k, sid in enumerate(HOSTILE):
        s.request(f"r{k}", [1, 2, 3, 10 + k], [50 + k], sid)
    engine = Engine(s, None).start()
    adapter = BundledAdapter(engine, name=NAME, tokenizer=HostileTokenizer())
    with running_server(create_app(adapter, TOKEN, AuditLog(None))) as url:
        for sid in HOSTILE:  # refused, tokenless closes: each one audited with its id
            assert httpx.post(f"{url}/v1/sessions/{quote(sid, safe='')}/close").status_code == 401
        yield url
    engine.stop()


def run(url: str, *args: str):
    result = CliRunner().invoke(app, list(args), env={"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN, "COLUMNS": "200"})
    return result


def clean(output: str) -> bool:
    return not any(c in output for c in CONTROLS)


@pytest.mark.parametrize("args", [
    ["stats"], ["tree"], ["tree", "--depth", "4"], ["sessions"], ["sessions", "--filter", "["], ["audit"],
    ["node", "#1"], ["close", "--dry-run", *HOSTILE], *(["session", sid] for sid in HOSTILE),
    *(["tree", "--session", sid] for sid in HOSTILE),
])
def test_every_command_shows_hostile_strings_as_inert_text(server, args):
    result = run(server, *args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "MarkupError" not in result.output
    assert clean(result.output), repr(result.output)


def test_markup_in_ids_is_shown_as_written(server):
    out = run(server, "sessions").output
    assert "[/]" in out and "[bold red]loud" in out and "?[2J?[31mred" in out
    assert "[/]" in run(server, "audit").output
    assert "session:[bold red]loud" in run(server, "audit").output


def test_json_keeps_the_strings_exact(server):
    doc = json.loads(run(server, "sessions", "--json").stdout)
    assert sorted(s["id"] for s in doc["sessions"]) == sorted(HOSTILE)  # the real id, to act on it


def test_a_hostile_id_can_still_be_closed_by_its_real_name(server):
    result = run(server, "close", "--yes", "\x1b[2J\x1b[31mred")
    assert result.exit_code == 0, result.output
    assert clean(result.output) and "closed ?[2J?[31mred" in result.output


def test_the_dashboard_shows_hostile_strings_and_keeps_running(server):
    async def drive() -> str:
        app_ = RadixtopApp(RadixtopClient(server, token=TOKEN, timeout=5), interval=0.2)
        async with app_.run_test(size=(160, 48)) as pilot:
            deadline = asyncio.get_running_loop().time() + 10
            while app_.home.polls < 3:  # a few polls in, with every pane filled
                assert asyncio.get_running_loop().time() < deadline
                await pilot.pause(0.1)
            await pilot.press("tab", "down", "enter")
            await pilot.pause(0.3)
            assert app_.is_running
            return app_.export_screenshot().replace("&#160;", " ")

    screen = asyncio.run(drive())
    assert clean(screen), [(c, screen[screen.index(c)-200:screen.index(c)+50]) for c in CONTROLS if c in screen]
    assert "[bold red]loud" in screen


def test_tier_and_component_names_from_a_target_are_inert():
    """Tier names (a KV event's ``medium``) and bucket components come from the target: never
    markup, never a terminal code, in the detail panel, the header and the commands' lines."""
    from rich.console import Console
    from rich.table import Table

    from radixtop.adapters.model import Bucket, NodeDetail, NodeView
    from radixtop.adapters.text import bucket_line
    from radixtop.inspector.detail import detail_rows

    hostile = "[/]\x1b[31mGPU"
    view = NodeView(1, 0, 1, 2, (1, 2), None, None, None, 0.0, 0.0, 2, 2, 2, 0, None, tiers=("GPU", hostile))
    table = Table.grid()
    table.add_column()
    table.add_column()
    for label, value in detail_rows(NodeDetail(view, (1, 2), 0, 2, None)):
        table.add_row(label, value)
    console = Console(width=200, record=True, color_system=None)
    console.print(table)  # a MarkupError before: '[/]' closed nothing
    shown = console.export_text()
    assert "GPU + [/]?[31mGPU" in shown and "\x1b" not in shown
    line = bucket_line(Bucket(hostile, 10, 5, 5, 0, 0, 0))
    assert line.startswith("[[/]?[31mGPU] total=10") and "\x1b" not in line


def _radixtop(*args: str, timeout: float = 60):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RADIXTOP_TOKEN": TOKEN})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["trickle-head", "trickle-body"])
@pytest.mark.parametrize("args", [["stats"], ["doctor"], ["flush", "--dry-run"], ["sessions", "--json"]])
def test_timeout_is_a_total_deadline_against_a_server_that_trickles(mode, args):
    """A byte every 0.3 s never trips a per-read timeout: ``--timeout 2`` still ends the command
    (exit 3, one line naming the URL) within a generous 15 s."""
    import time

    from tests.support.hostile_http import hostile_server

    with hostile_server(mode, every=0.3) as seen:
        started = time.monotonic()
        done = _radixtop(*args, "--url", seen.url, "--timeout", "2")
        assert time.monotonic() - started < 15
    assert done.returncode == 3, done.stderr
    assert f"{seen.url} did not answer within 2 s" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_a_server_that_floods_costs_one_line_not_the_memory():
    from tests.support.hostile_http import hostile_server

    with hostile_server("flood") as seen:
        done = _radixtop("stats", "--url", seen.url, "--timeout", "30")
    assert done.returncode != 0 and "answered more than 64 MiB" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
