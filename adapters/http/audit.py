"""The audit log of admin actions: one JSON line per action, read back newest first."""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path
from typing import IO

from radixtop.adapters.base import check_page
from radixtop.adapters.http.wire import WireError, audit_entry_from_dict
from radixtop.adapters.model import AuditEntry

BLOCK = 64 * 1024
MEMORY_ENTRIES = 10_000


class AuditLog:
    """Appends an ``AuditEntry`` per action (allowed or refused) to a JSON-lines file, or to a
    bounded in-memory deque when ``path`` is None (tests, demos).

    Entries carry what was asked and what happened, never a credential: callers must not put
    the API token in any field. Lines are written whole under a lock and flushed one by one, so
    a reader sees complete lines up to the size it read under that lock.
    """

    def __init__(self, path: Path | str | None = None, memory_entries: int = MEMORY_ENTRIES):
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._memory: deque[AuditEntry] = deque(maxlen=memory_entries)
        self._file: IO[bytes] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # The log names clients and sessions: readable by its owner only when we create it.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._file = os.fdopen(fd, "ab")

    def append(self, entry: AuditEntry) -> None:
        if self._file is None:
            with self._lock:
                self._memory.append(entry)
            return
        line = json.dumps(entry.to_dict(), separators=(",", ":"), default=str).encode() + b"\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def tail(self, limit: int = 100, offset: int = 0) -> list[AuditEntry]:
        """Up to ``limit`` entries, newest first, after skipping the ``offset`` newest."""
        check_page(offset, limit)
        if self._file is None:
            with self._lock:
                newest_first = list(reversed(self._memory))
            return newest_first[offset : offset + limit]
        with self._lock:
            size = os.fstat(self._file.fileno()).st_size
        entries: list[AuditEntry] = []
        skipped = 0
        for line in _lines_backwards(self.path, size):
            entry = _parse(line)
            if entry is None:
                continue
            if skipped < offset:
                skipped += 1
                continue
            entries.append(entry)
            if len(entries) == limit:
                break
        return entries

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _parse(line: bytes) -> AuditEntry | None:
    """An entry, or None for a line that is not one (a torn write, a hand edit)."""
    try:
        return audit_entry_from_dict(json.loads(line))
    except (ValueError, TypeError, WireError):
        return None


def _lines_backwards(path: Path, size: int):
    """The non-empty lines of the file's first ``size`` bytes, last first, read in blocks from
    the end (memory bounded by the longest line, not the file)."""
    with open(path, "rb") as f:
        position, rest = size, b""
        while position > 0:
            step = min(BLOCK, position)
            position -= step
            f.seek(position)
            block = f.read(step) + rest
            lines = block.split(b"\n")
            rest = lines.pop(0)  # may continue in the previous block
            for line in reversed(lines):
                if line.strip():
                    yield line
        if rest.strip():
            yield rest
