"""AuditLog: JSON lines appended whole, read back newest first in blocks from the end."""

from __future__ import annotations

import json
import threading
import time

import pytest

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.http.server import audit as audit_module
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.model import AuditEntry


def entry(i: int, **fields) -> AuditEntry:
    return AuditEntry(time=float(i), client="127.0.0.1", action="evict", target="cache", allowed=i % 2 == 0,
                      result={"evicted_tokens": i, "ids": [i, i + 1]}, extra={"n": i}, **fields)


@pytest.mark.parametrize("block", [7, 64, 64 * 1024])
def test_tail_is_newest_first_across_block_boundaries(tmp_path, monkeypatch, block):
    monkeypatch.setattr(audit_module, "BLOCK", block)
    log = AuditLog(tmp_path / "sub" / "audit.jsonl")
    written = [entry(i) for i in range(50)]
    for e in written:
        log.append(e)
    assert log.tail(5) == written[::-1][:5]
    assert log.tail(10, offset=45) == written[::-1][45:]
    assert log.tail(100) == written[::-1]
    assert log.tail(3, offset=60) == []
    log.close()
    reopened = AuditLog(tmp_path / "sub" / "audit.jsonl")  # appends after what is there
    reopened.append(entry(50))
    assert [e.time for e in reopened.tail(2)] == [50.0, 49.0]
    assert (tmp_path / "sub" / "audit.jsonl").stat().st_mode & 0o077 == 0
    reopened.close()


def test_lines_that_are_not_entries_are_skipped(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.append(entry(1))
    with open(path, "a") as f:
        f.write('{"torn": \n\nnot json\n[1,2]\n')
    log.append(entry(2))
    assert [e.time for e in log.tail(10)] == [2.0, 1.0]
    log.close()


def test_memory_log_is_bounded_and_pages(tmp_path):
    log = AuditLog(None, memory_entries=5)
    for i in range(8):
        log.append(entry(i))
    assert [e.time for e in log.tail(10)] == [7.0, 6.0, 5.0, 4.0, 3.0]
    assert [e.time for e in log.tail(2, offset=1)] == [6.0, 5.0]
    with pytest.raises(BadRequest):
        log.tail(0)
    with pytest.raises(BadRequest):
        log.tail(5, offset=-1)


def test_concurrent_appends_write_whole_lines(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    padding = "x" * 10_000  # longer than a write buffer's worth per line

    def writer(base: int) -> None:
        for i in range(50):
            log.append(entry(base + i, error=padding))

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 200 and all(json.loads(line)["error"] == padding for line in lines)
    assert len(log.tail(1000)) == 200
    log.close()


# ----- fail closed, bounded refusals, reads that cost what they return (issue 17, items 5 and 6) -----


def refusal(i: int, target: str) -> AuditEntry:
    return AuditEntry(time=float(i), client="10.0.0.9", action="close", target=target, allowed=False,
                      error="unauthorized: missing 'Authorization: Bearer <token>' header")


def test_refusals_without_the_token_are_bounded_and_never_evict_authorised_actions():
    """10,500 refused closes with 64 KB ids once pushed the operator's flush out of the in-memory
    journal and held every id whole (253 -> 896 MiB). A request without the token records a
    bounded id, in a part of the journal of its own."""
    import gc
    import tracemalloc

    log = AuditLog(None, memory_entries=100)
    flush = AuditEntry(time=0.0, client="127.0.0.1", action="flush", target="cache", allowed=True,
                       result={"freed_tokens": 5})
    log.append(flush)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            log.append(refusal(i + 1, f"session:{i}" + "x" * 64 * 1024), authorised=False)
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 2 * 2**20, f"1000 refusals with 64 KB ids retained {retained / 2**20:.1f} MiB"
    entries = log.tail(1000)
    assert log.tail(10, offset=len(entries)) == [flush]  # the oldest, still there
    refused = [e for e in entries if not e.allowed]
    assert refused and all(len(e.target) <= audit_module.MAX_ANONYMOUS_TEXT + 40 for e in refused)
    assert refused[0].target.startswith("session:999x") and "65547 characters" in refused[0].target


def test_reads_of_a_large_journal_cost_what_they_return(tmp_path):
    """GET /v1/audit?offset=2**63-1 read the whole file backwards: 40 of them made /healthz take
    38 s. A page past the end, and any page, is answered without reading the journal file."""
    path = tmp_path / "audit.jsonl"
    line = json.dumps(entry(2).to_dict()) + "\n"
    path.write_text(line * 100_000)
    log = AuditLog(path)
    started = time.perf_counter()
    for _ in range(40):
        assert log.tail(100, offset=2**63 - 1) == []
    assert len(log.tail(100, offset=500)) == 100
    assert time.perf_counter() - started < 1.0
    log.close()


def test_an_intent_is_written_before_the_action_and_its_outcome_after(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    started = AuditEntry(time=1.0, client="127.0.0.1", action="flush", target="cache", allowed=True)
    pending = log.begin(started)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["phase"], e["action"]) for e in lines] == [("intent", "flush")]
    assert log.tail(5) == [AuditEntry(time=1.0, client="127.0.0.1", action="flush", target="cache",
                                      allowed=True, extra={"in_progress": True})]
    done = AuditEntry(time=1.5, client="127.0.0.1", action="flush", target="cache", allowed=True,
                      result={"freed_tokens": 3})
    log.finish(pending, done)
    assert log.tail(5) == [done]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["phase"] for e in lines] == ["intent", "outcome"] and lines[0]["id"] == lines[1]["id"]
    log.begin(started)  # never finished: the server stopped while it ran
    log.close()
    reopened = AuditLog(path)
    orphan, finished = reopened.tail(5)
    assert finished == done  # its intent is not listed a second time
    assert orphan.action == "flush" and orphan.error.startswith("no outcome recorded")
    reopened.close()


def test_an_intent_that_cannot_be_written_is_refused(tmp_path, monkeypatch):
    log = AuditLog(tmp_path / "audit.jsonl")

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(audit_module, "_write_all", full)
    with pytest.raises(audit_module.AuditUnavailable, match="No space left on device"):
        log.begin(AuditEntry(time=1.0, client="127.0.0.1", action="flush", target="cache", allowed=True))
    assert log.tail(5) == []
    log.close()


def test_a_journal_deleted_while_serving_is_created_again(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.append(entry(0))
    path.unlink()
    log.append(entry(2))
    assert [json.loads(line)["time"] for line in path.read_text().splitlines()] == [2.0]
    assert [e.time for e in log.tail(5)] == [2.0, 0.0]  # read from memory, not the file
    assert path.stat().st_mode & 0o077 == 0
    log.close()


@pytest.mark.parametrize("where", ["directory", "/dev/full", "/dev/null"])
def test_a_journal_that_is_not_a_regular_file_is_refused_at_start(tmp_path, where):
    path = tmp_path if where == "directory" else where
    with pytest.raises(ValueError, match=r"^cannot use the audit log .*: (Is a directory|not a regular file)"):
        AuditLog(path)


def test_a_torn_line_does_not_swallow_the_next_entry(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.append(entry(0))
    with open(path, "ab") as f:
        f.write(b'{"time": 1.0, "cli')  # a write cut short (a full disk)
    log.append(entry(2))
    log.close()
    assert [e.time for e in AuditLog(path).tail(5)] == [2.0, 0.0]
