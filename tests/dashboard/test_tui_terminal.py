"""`radixtop tui` without a terminal refuses in one line (issue 26, item 7): it neither starts the
demo engine nor writes escape codes to a pipe."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [["tui"], []])
def test_the_dashboard_without_a_terminal_refuses_in_one_line(args):
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert done.stdout == "" and "\x1b" not in done.stderr
    assert done.stderr.startswith("radixtop: the dashboard needs a terminal") and done.stderr.count("\n") == 1, \
        done.stderr
