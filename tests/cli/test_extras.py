"""Optional dependencies: without ``radixtop[kv-events]`` the KV-event target says, in one line,
which extra to install (the wheel check in .ci/wheel-check runs the same without the packages)."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = "import sys\nsys.modules[{name!r}] = None  # as if not installed\n"


def run_without(module: str, *args: str) -> subprocess.CompletedProcess:
    code = BLOCKED.format(name=module) + (
        f"sys.argv = ['radixtop', *{list(args)!r}]\nfrom radixtop.cli.main import main\nmain()\n")
    return subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("module", ["zmq", "msgspec"])
@pytest.mark.parametrize("command", [["serve"], ["tui"]])
def test_kv_events_without_the_extra_is_one_line_naming_it(module, command):
    done = run_without(module, *command, "--kv-events", "tcp://127.0.0.1:5557")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (f"radixtop: --kv-events needs {module}, which is not installed: "
                           "pip install 'radixtop[kv-events]'\n")
