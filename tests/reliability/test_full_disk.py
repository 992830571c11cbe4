"""The audit journal on a disk that fills up (a real, small tmpfs) under a live server: an action
that ran keeps its outcome line, one that cannot keep room for its outcome does not run, and no
line is ever torn."""

from __future__ import annotations

import errno
import json
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app, http_protocol
from radixtop.adapters.http.server.audit import OUTCOME_ROOM, AuditLog
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from tests.support.live_server import running_server

TOKEN = "full-disk-test-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODES = 700
"""Nodes session 'big' holds: its close's outcome line lists them twice (some 7 KB)."""
MANY = 2500
"""As many as make an outcome line longer than OUTCOME_ROOM (some 25 KB)."""


IN_OWN_NAMESPACE = "RADIXTOP_TEST_OWN_MOUNT_NAMESPACE"
"""Set in the child that runs a test in a user and mount namespace of its own."""


def ran_in_own_namespace(request) -> bool:
    """Without root (no tmpfs to mount here): run this very test again in a child that is root
    of a user and mount namespace of its own (``unshare -Urm``), where it can mount one, and
    check that it passed there; True then (the child's assertions were the test's). False where
    this process can mount, or is that child."""
    import os
    import sys

    from tests.support import REPO

    if os.geteuid() == 0 or os.environ.get(IN_OWN_NAMESPACE):
        return False
    child = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-m", "pytest",
                            request.node.nodeid, "-q", "-p", "no:cacheprovider"],
                           cwd=REPO, env={**os.environ, IN_OWN_NAMESPACE: "1"}, capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0 and "\n1 passed" in "\n" + child.stdout, (
        "the test needs a small file system of its own: root, or user namespaces (unshare -Urm)",
        child.stdout[-3000:], child.stderr[-2000:])
    return True


@pytest.fixture
def disk(tmp_path):
    """A 512 KiB file system of its own (tmpfs: as root, or as root of a user namespace)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True)
    assert mounted.returncode == 0, f"cannot mount a small tmpfs: {mounted.stderr.decode().strip()}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> int:
    """Fill the file system to its last byte; the bytes written."""
    written = 0
    with open(disk / "filler", "ab", buffering=0) as f:
        for size in (65536, 4096, 512, 64, 8, 1):
            while True:
                try:
                    written += f.write(b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return written


class Gated(BundledAdapter):
    """A close that waits for the test (which fills the disk meanwhile) before it runs."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.entered, self.gate = threading.Event(), threading.Event()

    def close_session_planned(self, session_id):
        self.entered.set()
        assert self.gate.wait(60)
        return super().close_session_planned(session_id)


@pytest.fixture(params=[NODES, MANY])
def engine(request):
    s = Scheduler(get_geometry("tiny"), 8 * request.param, device="cpu")
    for i in range(request.param):
        s.request(f"r{i}", [5000 + i, 1, 2], [3], "big")
    s.request("other", [9, 9], [9], "small")
    engine = Engine(s, None).start()
    yield engine
    engine.stop()


def journal_lines(path: Path) -> list[dict]:
    """Every line of the journal, each a whole JSON object (a torn one fails here)."""
    text = path.read_bytes().decode()
    assert text.endswith("\n"), f"the journal ends in a torn line: {text[-200:]!r}"
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_an_action_that_ran_on_a_disk_that_filled_keeps_its_outcome_line(request, engine):
    """It answered 200 while the journal held only its intent and a torn line. An outcome longer
    than its room keeps its figures, not its lists of node ids."""
    if ran_in_own_namespace(request):
        return
    disk = request.getfixturevalue("disk")
    journal = disk / "audit.jsonl"
    adapter, audit = Gated(engine), AuditLog(journal)
    try:
        with running_server(create_app(adapter, TOKEN, audit), http=http_protocol()) as url, \
                httpx.Client(base_url=url, headers=AUTH, timeout=60) as http:
            assert http.post("/v1/evict", json={"tokens": 0}).status_code == 200  # a few lines first
            done: list[httpx.Response] = []
            closing = threading.Thread(target=lambda: done.append(http.post("/v1/sessions/big/close")))
            closing.start()
            assert adapter.entered.wait(60)  # its intent is journaled: now the disk fills
            assert fill(disk) > 0
            adapter.gate.set()
            closing.join(60)
            (response,) = done
            assert response.status_code == 200, response.text
            result = response.json()["result"]
            assert result["freed_tokens"] >= NODES and response.headers["content-length"]
            lines = journal_lines(journal)
            intent = [e for e in lines if e["phase"] == "intent" and e["action"] == "close"]
            outcome = [e for e in lines if e["phase"] == "outcome" and e["action"] == "close"]
            assert len(intent) == 1 and len(outcome) == 1 and outcome[0]["id"] == intent[0]["id"], lines[-3:]
            assert outcome[0]["allowed"]
            if len(response.content) < OUTCOME_ROOM // 2:  # (NODES's: some 7 KB)
                assert outcome[0]["result"] == result and "lists_left_out" not in outcome[0]
            else:  # (MANY's, some 25 KB: too long for its room, with no more on the disk)
                assert len(response.content) > OUTCOME_ROOM
                assert result["freed_tokens"] >= MANY and outcome[0]["lists_left_out"] is True
                assert outcome[0]["result"] == {k: v for k, v in result.items() if not isinstance(v, list)}
            listed = http.get("/v1/audit").json()["entries"][0]
            assert listed["action"] == "close" and listed["result"] == result  # memory has it whole

            if len(response.content) > OUTCOME_ROOM // 2:
                return  # (its short outcome left most of its room: enough for one more action)
            # The disk is full: past the journal's end is what is left of the close's room (some 9 KB:
            # an intent fits, an intent and its outcome's room do not), so the next action does not run.
            size = journal.stat().st_size
            assert journal.stat().st_blocks * 512 - size < OUTCOME_ROOM
            refused = http.post("/v1/sessions/small/close")
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "audit_unavailable", refused.text
            assert "nothing was done" in refused.json()["error"]["message"]
            assert http.get("/v1/sessions/small").json()["session"]["state"] == "open"
            assert len(journal_lines(journal)) == len(lines)  # no intent of it, and nothing torn
    finally:
        adapter.gate.set()
        audit.close()


def test_a_write_cut_short_leaves_no_torn_line(tmp_path, monkeypatch):
    """Without a small file system of its own: a write that stops half way (a full disk) is cut
    off again, whichever line it was."""
    from radixtop.adapters.http.server import audit as audit_module
    from radixtop.adapters.model import AuditEntry

    journal = tmp_path / "audit.jsonl"
    log = AuditLog(journal)
    entry = AuditEntry(time=1.0, client="127.0.0.1", action="flush", target="cache", allowed=True)
    pending = log.begin(entry)
    whole = journal.read_bytes()
    real = audit_module._write_all

    def half_then_full(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(audit_module, "_write_all", half_then_full)
    with pytest.raises(audit_module.AuditUnavailable):
        log.finish(pending, entry)
    with pytest.raises(audit_module.AuditUnavailable):
        log.append(entry)
    assert journal.read_bytes() == whole and journal_lines(journal)[0]["phase"] == "intent"
    monkeypatch.setattr(audit_module, "_write_all", real)
    log.append(entry)
    assert [e["phase"] for e in journal_lines(journal)] == ["intent", "record"]
    log.close()
