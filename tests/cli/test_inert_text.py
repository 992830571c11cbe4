"""One rule for every string from a target, in every face: control codes, invisible and layout
characters become '?' (`adapters.text.inert`), so nothing a target says can move the cursor,
hide itself, or push a table's columns out of line."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.text import inert
from radixtop.cli.main import app
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from tests.support.live_server import running_server

TOKEN = "inert-text-test-token-0123456789"

# Each hides, reorders or breaks a line on screen: a word joiner, the Hangul filler (a blank
# letter), a line and a paragraph separator, the Arabic letter mark, tag characters, a soft
# hyphen, the Mongolian vowel separator, the other Hangul fillers, a lone surrogate (cannot be
# printed at all), and the terminal's own: ESC, CSI, BEL, bidi override.
INVISIBLE = ["\u2060", "\u3164", "\u2028", "\u2029", "\u061c", "\U000e0041", "\U000e0001", "\u00ad", "\u180e",
             "\u115f", "\u1160", "\uffa0", "\ud800", "\x1b", "\x9b", "\x07", "\u202e", "\u200b", "\ufeff"]


@pytest.mark.parametrize("char", INVISIBLE, ids=[f"U+{ord(c):04X}" for c in INVISIBLE])
def test_inert_makes_each_invisible_or_layout_character_visible(char):
    assert inert(f"a{char}b") == "a?b"
    assert inert(f"a{char}b", lines=True) == "a?b"


def test_inert_keeps_what_people_write():
    for text in ("plain ascii", "größe", "日本語のテキスト", "emoji 🙂", "tab-free", "a—b «c»", "Ω≈ç√"):
        assert inert(text) == text
    assert inert("two\nlines") == "two?lines" and inert("two\nlines", lines=True) == "two\nlines"


HOSTILE_REASON = "shared\x1b]0;pwned\x07\u3164"
HIDDEN_IDS = ["a\u2060\u2060\u2060", "b\u3164\u3164", "c\u2028d", "e\U000e0041\U000e0042"]


class HostileTarget(BundledAdapter):
    """A target whose close plans' reasons hold escapes and invisible text (the wire takes any
    string there; a state must be open, closed or unknown)."""

    def plan_close(self, session_id):
        plan = super().plan_close(session_id)
        return dataclasses.replace(plan, kept=tuple(dataclasses.replace(k, reason=HOSTILE_REASON) for k in plan.kept))


@pytest.fixture(scope="module")
def hostile():
    s = Scheduler(get_geometry("tiny"), 256, device="cpu")
    s.request("r1", [1, 2, 3, 4], [5], "a")
    s.request("r2", [1, 2, 3, 4, 6], [7], "b")  # shares a's prefix: a's plan keeps it, with a reason
    for k, sid in enumerate(HIDDEN_IDS):
        s.request(f"h{k}", [20 + k, 1], [2], sid)
    engine = Engine(s, None).start()
    with running_server(create_app(HostileTarget(engine), TOKEN, AuditLog(None))) as url:
        yield url
    engine.stop()


def run(url: str, *args: str):
    return CliRunner().invoke(app, list(args), env={"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN, "COLUMNS": "200"})


@pytest.mark.parametrize("args", [["sessions"], *(["session", sid] for sid in HIDDEN_IDS), ["close", "a", "--dry-run"],
                                  ["close", *HIDDEN_IDS, "--dry-run"]])
def test_a_targets_strings_reach_the_terminal_inert(hostile, args):
    result = run(hostile, *args)
    assert result.exit_code == 0, result.output
    assert not any(c in result.output for c in INVISIBLE), repr(result.output)


def test_a_close_plans_reasons_are_inert(hostile):
    out = run(hostile, "close", "a", "--dry-run").output
    assert "shared?]0;pwned??" in out, out


def test_hidden_characters_in_ids_keep_the_sessions_table_in_line(hostile):
    """Zero-width and blank characters in ids misaligned the table: every row is as wide as its
    header, each hidden character shown as one '?'."""
    from rich.cells import cell_len

    out = run(hostile, "sessions").output
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) >= 1 + len(HIDDEN_IDS) and len({cell_len(r) for r in rows}) == 1, out
    assert "a???" in out and "b??" in out and "c?d" in out and "e??" in out
