"""The command line itself, run as a user runs it: usage errors in one line, --version, help
text that reflows (no server needed)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest


def radixtop(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": str(columns), "HOME": "/nonexistent", "RADIXTOP_URL": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_version():
    done = radixtop("--version")
    assert done.returncode == 0 and done.stdout == f"radixtop {version('radixtop')}\n" and done.stderr == ""


@pytest.mark.parametrize("args, says", [
    (["stats", "--bogus"], "No such option: --bogus"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
    (["tree", "--depth", "0"], "'--depth'"),
    (["close"], "Missing argument"),
    (["sessions", "--limit", "x"], "'--limit'"),
])
def test_a_usage_error_is_one_line_pointing_at_help(args, says):
    """Errors are one line, the README says; typer's boxed multi-line panels were not."""
    done = radixtop(*args)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("radixtop: ") and says in lines[0], done.stderr
    assert "--help" in lines[0] and "╭" not in done.stderr


def test_help_text_reflows_to_the_terminal():
    """A docstring's own line breaks are not kept: on a wide terminal each command's summary is one
    line in the list, and each command's help is one paragraph per paragraph."""
    done = radixtop("--help", columns=400)
    assert done.returncode == 0, done.stderr
    panel = done.stdout.split("Commands")[1]
    rows = [line for line in panel.splitlines() if line.startswith("│ ")]
    commands = [r for r in rows if re.match(r"│ [a-z]+ ", r)]
    assert len(commands) >= 15 and len(rows) == len(commands), [r for r in rows if r not in commands]
    for command in ("export", "replay", "evict", "doctor"):
        done = radixtop(command, "--help", columns=400)
        head = "\n".join(line.strip() for line in done.stdout.split("╭")[0].splitlines())
        paragraphs = [p for p in head.split("\n\n") if p.strip() and "Usage:" not in p]
        assert paragraphs and all(len(p.strip().splitlines()) == 1 for p in paragraphs), (command, head)
