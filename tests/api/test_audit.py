"""AuditLog: JSON lines appended whole, read back newest first in blocks from the end."""

from __future__ import annotations

import json
import threading

import pytest

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.http import audit as audit_module
from radixtop.adapters.http.audit import AuditLog
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
