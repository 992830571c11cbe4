"""The files `radixtop fleet` and `serve --fleet` read (--fleet, --map, --tokens) are small plain
files: a FIFO, a device or a huge file is one line and an exit code, at once (a FIFO hung the
command; /dev/zero ended in a MemoryError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO


def radixtop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "fleet", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path, 0o600)
    return path


@pytest.fixture
def fleet(tmp_path):
    path = tmp_path / "fleet.txt"
    path.write_text("http://127.0.0.1:9\n")
    return path


def one_line(done: subprocess.CompletedProcess, says: str) -> None:
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_fifo_as_the_fleet_file_is_refused_at_once(fifo):
    one_line(radixtop("--fleet", str(fifo), "--json"), "is not a plain file")


def test_a_fifo_as_the_tokens_file_is_refused_at_once(fifo, fleet):
    one_line(radixtop("--fleet", str(fleet), "--tokens", str(fifo), "--json"), "is not a plain file")


def test_a_fifo_as_the_map_file_is_refused_at_once(fifo):
    one_line(radixtop("--smg", "http://127.0.0.1:9", "--map", str(fifo), "--json"), "is not a plain file")


def test_dev_zero_as_the_fleet_file_is_one_line_not_a_memory_error():
    one_line(radixtop("--fleet", "/dev/zero", "--json"), "is not a plain file")


def test_a_fleet_file_larger_than_any_fleet_is_refused(tmp_path):
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as f:
        f.truncate(64 * 2**20)  # sparse: 64 MiB of NULs, no disk
    one_line(radixtop("--fleet", str(huge), "--json"), "larger than")
