"""The audit journal of admin actions: an authorised action's intent is written before it runs and
its outcome after; refusals are kept too, bounded. JSON lines in a file; the newest entries in
memory, which is what ``/v1/audit`` pages through."""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixtop.adapters.base import check_page
from radixtop.adapters.errors import AdapterError
from radixtop.adapters.http.server.room import Room
from radixtop.adapters.http.wire import WireError, audit_entry_from_dict
from radixtop.adapters.model import AuditEntry

logger = logging.getLogger(__name__)

BLOCK = 64 * 1024
MEMORY_ENTRIES = 10_000
"""Actions by holders of the token that /v1/audit pages through (the file keeps every one)."""
ANONYMOUS_ENTRIES = 1_000
"""Entries from requests without the token (refusals, dry runs), kept apart so that they never
push an authorised action out."""
MAX_ANONYMOUS_TEXT = 256
"""Characters kept of a target or an error from a request without the token (the rest is counted)."""
ANONYMOUS_LINES_PER_S, ANONYMOUS_BURST = 10.0, 1_000
"""How many such entries reach the file: a flood of refusals cannot fill the disk (and a full disk
refuses every action)."""
LOAD_BYTES = 64 * 2**20
"""How much of an existing journal is read at start to fill memory (newest first)."""
NO_OUTCOME = ("no outcome recorded: the server stopped, or could not write its journal, while this "
              "action ran")
OUTCOME_ROOM = 16 * 1024
"""Bytes of disk kept for each running action's outcome line: every other line is written only if
this much stays allocated past it for each (else its intent is refused: the action does not run).
An outcome longer than this that finds no room is journaled without its lists (node ids)."""


class AuditUnavailable(AdapterError):
    """The journal cannot be written: an action that cannot be audited is not run."""

    code = "audit_unavailable"
    http_status = 503


@dataclass
class Pending:
    """An authorised action whose intent is in the journal and whose outcome is not yet."""

    id: str
    slot: _Slot


@dataclass
class _Slot:
    """One entry as /v1/audit lists it: its journal line (JSON), ordered by ``seq``."""

    seq: int
    line: bytes
    state: str = "done"  # or "running" (in this process), or "orphan" (an intent with no outcome)


class AuditLog:
    """Journals an ``AuditEntry`` per request that asks for an action, allowed or refused, to a
    JSON-lines file (mode 0600 when created), or to memory only when ``path`` is None.

    An authorised action is journaled twice: ``begin`` writes (and syncs) its intent before it
    runs, raising ``AuditUnavailable`` if it cannot, and ``finish`` its outcome; lines carry
    ``phase`` (intent, outcome, record) and pair by ``id``. An entry from a request without the
    token (``authorised=False``) keeps at most MAX_ANONYMOUS_TEXT characters of its target and
    error and the scalars of its plan and result, is kept apart in memory, and reaches the file
    at most ANONYMOUS_LINES_PER_S a second. Entries never carry a credential: callers must not
    put the API token in any field.

    Reads (``tail``) come from memory and cost what they return. A journal deleted or replaced
    while serving is created again at its path (as after a log rotation).
    """

    def __init__(self, path: Path | str | None = None, memory_entries: int = MEMORY_ENTRIES,
                 anonymous_entries: int = ANONYMOUS_ENTRIES):
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._authorised: deque[_Slot] = deque(maxlen=memory_entries)
        self._anonymous: deque[_Slot] = deque(maxlen=anonymous_entries)
        self._seq = itertools.count(1)
        self._run = secrets.token_hex(4)  # ids are unique across restarts sharing a file
        self._ids = itertools.count(1)
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._end = 0  # the file's size after our last whole write
        self._budget, self._budget_at = float(ANONYMOUS_BURST), time.monotonic()
        self._unjournaled = 0
        self._failing = False
        self._room = Room()
        self._running = 0  # actions whose intent is journaled and outcome not yet: each has its room
        if self.path is not None:
            self._open()
            self._load()

    # ----- writing -----

    def begin(self, entry: AuditEntry) -> Pending:
        """Journal the intent of an authorised action, before it runs; ``AuditUnavailable`` if
        the journal cannot be written (then the action must not run)."""
        audit_id = f"{self._run}-{next(self._ids)}"
        line = _line(entry, phase="intent", id=audit_id)
        with self._lock:
            # (room for its outcome, and every running action's, stays on disk past it: else refused)
            self._write(line, sync=True, keep=OUTCOME_ROOM * (self._running + 1))
            self._running += 1
            slot = _Slot(next(self._seq), line, state="running")
            self._authorised.append(slot)
        return Pending(audit_id, slot)

    def finish(self, pending: Pending, entry: AuditEntry) -> None:
        """Journal what the action did, in the room its intent kept (one too long for it, and for
        what the disk has left, without its lists). Memory has it whole even when the file cannot
        be written; then ``AuditUnavailable`` is raised (the action has run: the caller says so in
        its log)."""
        line = _line(entry, phase="outcome", id=pending.id)
        with self._lock:
            self._running -= 1
            pending.slot.line, pending.slot.state = line, "done"
            if len(line) < OUTCOME_ROOM:
                self._write(line, sync=True)
                return
            try:  # as any other line: allocated first, the others' rooms kept
                self._write(line, sync=True, keep=OUTCOME_ROOM * self._running)
            except AuditUnavailable:
                self._write(_line(_bounded(entry), phase="outcome", id=pending.id, lists_left_out=True), sync=True)

    def append(self, entry: AuditEntry, authorised: bool = True) -> None:
        """Journal an entry that had no intent before it: a refusal, or a dry run. Without the
        token (``authorised=False``) it is bounded, and written to the file only within its rate;
        a failure to write it is logged, not raised."""
        if not authorised:
            entry = _bounded(entry)
        with self._lock:
            ring = self._authorised if authorised else self._anonymous
            journaled = self._fd is not None and (authorised or self._take_budget())
            marks: dict[str, Any] = {"phase": "record", "authorised": authorised}
            if journaled and not authorised and self._unjournaled:
                marks["unjournaled_before"] = self._unjournaled  # how many the rate left out
            line = _line(entry, **marks)
            ring.append(_Slot(next(self._seq), line))
            if self._fd is None:
                return
            if not journaled:
                self._unjournaled += 1
                if self._unjournaled == 1:
                    logger.warning("over %g refusals a second: the audit log %s records their count, "
                                   "not each one", ANONYMOUS_LINES_PER_S, self.path)
                return
            try:
                self._write(line, sync=False, keep=OUTCOME_ROOM * self._running)
            except AuditUnavailable as exc:
                if authorised:
                    raise
                self._failing_once(exc)
                return
            self._unjournaled = 0

    def _take_budget(self) -> bool:
        now = time.monotonic()
        self._budget = min(ANONYMOUS_BURST, self._budget + (now - self._budget_at) * ANONYMOUS_LINES_PER_S)
        self._budget_at = now
        if self._budget < 1:
            return False
        self._budget -= 1
        return True

    def _failing_once(self, exc: AuditUnavailable) -> None:
        if not self._failing:
            self._failing = True
            logger.error("%s (refusals are kept in memory only until it can be written)", exc.message)

    # ----- the file -----

    def _open(self) -> None:
        """Open (or create) the journal at its path; ValueError, in one line, if it cannot be."""
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # The journal names clients and sessions: readable by its owner only when created here.
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ValueError(f"cannot use the audit log {self.path}: {exc.strerror or exc}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # /dev/null would swallow it, /dev/full refuse every line
            os.close(fd)
            raise ValueError(f"cannot use the audit log {self.path}: not a regular file")
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._identity, self._end = fd, (info.st_dev, info.st_ino), info.st_size

    def _check_path(self) -> None:
        """Write where the path points now: a journal deleted or replaced is created again."""
        try:
            info = os.stat(self.path)
            current = (info.st_dev, info.st_ino)
        except OSError:
            current = None
        if current != self._identity:
            logger.warning("the audit log %s was deleted or replaced while serving: writing to a new "
                           "one there", self.path)
            self._open()
            try:  # the running actions' outcomes go to this one now
                self._room.reserve(self._fd, self._end, OUTCOME_ROOM * self._running)
            except OSError as exc:
                logger.error("no room for the outcomes of %d running actions in the new audit log %s: %s",
                             self._running, self.path, exc.strerror)

    def _write(self, line: bytes, sync: bool, keep: int | None = None) -> None:
        """Append one whole line (under the lock), or nothing: a write cut short (a full disk) is
        cut off again. ``keep``: first allocate the line and this many bytes past it (the running
        actions' outcomes' room), or write nothing; None: an outcome, written in that room.
        AuditUnavailable, saying why, if it cannot."""
        if self._fd is None:
            return
        try:
            self._check_path()
            size = os.fstat(self._fd).st_size
            if size != self._end and size and os.pread(self._fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a torn write (by another process): start on a line of our own
            if keep is not None:
                self._room.reserve(self._fd, size, len(line) + keep)
            try:
                _write_all(self._fd, line)
            except OSError:
                os.ftruncate(self._fd, size)  # never a torn line
                raise
            if sync:
                os.fsync(self._fd)
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise AuditUnavailable(f"cannot write the audit log {self.path}: {reason}") from None
        self._end = size + len(line)
        self._failing = False

    def _load(self) -> None:
        """Fill memory from the newest LOAD_BYTES of an existing journal. An intent whose outcome
        is there is not listed; one without is listed with NO_OUTCOME."""
        assert self._fd is not None
        finished: set[str] = set()
        loaded: list[tuple[bytes, bool, str]] = []  # newest first
        room = {True: self._authorised.maxlen or 0, False: self._anonymous.maxlen or 0}
        for raw in _lines_backwards(self._fd, self._end, LOAD_BYTES):
            try:
                data = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            phase, audit_id = data.get("phase"), data.get("id")
            if phase == "outcome":
                finished.add(audit_id)
            elif phase == "intent" and audit_id in finished:
                continue
            authorised = data.get("authorised", True) is not False
            if room[authorised] > 0:
                room[authorised] -= 1
                loaded.append((raw, authorised, "orphan" if phase == "intent" else "done"))
            if not any(room.values()):
                break
        for seq, (raw, authorised, state) in zip(range(-len(loaded), 0), reversed(loaded)):
            (self._authorised if authorised else self._anonymous).append(_Slot(seq, raw, state))

    # ----- reading -----

    def tail(self, limit: int = 100, offset: int = 0) -> list[AuditEntry]:
        """Up to ``limit`` entries, newest first, after skipping the ``offset`` newest (an
        action in progress is listed with ``extra.in_progress``)."""
        check_page(offset, limit)
        with self._lock:
            if offset >= len(self._authorised) + len(self._anonymous):
                return []
            newest_first = heapq.merge(reversed(self._authorised), reversed(self._anonymous),
                                       key=lambda slot: -slot.seq)
            page = [(slot.line, slot.state) for slot in itertools.islice(newest_first, offset, offset + limit)]
        entries = []
        for line, state in page:
            entry = _parse(line)
            if entry is not None:
                entries.append(_as_listed(entry, state))
        return entries

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a short write is not an error)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _line(entry: AuditEntry, **marks: Any) -> bytes:
    data = {**entry.to_dict(), **marks}
    return json.dumps(data, separators=(",", ":"), default=str).encode() + b"\n"


def _as_listed(entry: AuditEntry, state: str) -> AuditEntry:
    if state == "running":
        return AuditEntry(**{**entry.to_dict(), "extra": {**entry.extra, "in_progress": True}})
    if state == "orphan":
        return AuditEntry(**{**entry.to_dict(), "error": NO_OUTCOME})
    return entry


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_ANONYMOUS_TEXT:
        return text
    return f"{text[:MAX_ANONYMOUS_TEXT]}... ({len(text)} characters)"


def _scalars(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """A plan or result without its lists (node ids), its strings cut."""
    if data is None:
        return None
    return {key: _cut(value) if isinstance(value, str) else value for key, value in data.items()
            if isinstance(value, (int, float, bool, str)) or value is None}


def _bounded(entry: AuditEntry) -> AuditEntry:
    """What is kept of an entry from a request without the token: its size does not follow what
    the request sent."""
    return AuditEntry(time=entry.time, client=entry.client, action=entry.action, target=_cut(entry.target),
                      allowed=entry.allowed, plan=_scalars(entry.plan), result=_scalars(entry.result),
                      error=_cut(entry.error), extra=_scalars(entry.extra) or {})


def _parse(line: bytes) -> AuditEntry | None:
    """An entry, or None for a line that is not one (a torn write, a hand edit)."""
    try:
        return audit_entry_from_dict(json.loads(line))
    except (ValueError, TypeError, WireError):
        return None


def _lines_backwards(fd: int, size: int, budget: int):
    """The non-empty lines of the file's first ``size`` bytes, last first, read in blocks from
    the end, at most ``budget`` bytes (memory bounded by the longest line, not the file)."""
    position, rest, floor = size, b"", max(0, size - budget)
    while position > floor:
        step = min(BLOCK, position - floor)
        position -= step
        block = os.pread(fd, step, position) + rest
        lines = block.split(b"\n")
        rest = lines.pop(0)  # may continue in the previous block
        for line in reversed(lines):
            if line.strip():
                yield line
    if position == 0 and rest.strip():
        yield rest
