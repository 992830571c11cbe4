"""A recording of a target's history (issue 29's flight recorder, written to disk): what
``radixtop record`` and ``serve --record`` write, and ``radixtop diff`` reads.

One JSON object a line (a file only its owner reads: it holds prompts' token ids):

* ``{"recording": 1, "radixtop": VERSION, "target": NAME, "started_at": T, "capacity_tokens": N,
  "bytes_per_token": N, "geometry": {...}}``: the first line;
* ``{"moment": {"at": T, "stats": {...}, "sessions": [...] | null}}``: the target's figures (its
  ``Stats``) and its sessions with the most exclusive memory (at most ``MOMENT_SESSIONS``: id,
  state, exclusive and shared bytes, tagged nodes, locked tokens), every ``--every`` seconds, and
  at the start and the end;
* ``{"removed": {...}}``: a node that left the tree (the history's ``GhostView``: when, why, its
  tokens, its holders, the pool then, who);
* ``{"served": {...}}``: an op of the engine's (``ServedEntry``): a request's begin (when, its
  session, its prompt's tokens and its hit), finish or abort, a session's close or register, an
  evict or flush asked; with its token ids (a begin's prompt, a finish's output), so that
  ``radixtop replay --format recording`` replays the server's own traffic. A session's begin that
  reuses the start of its last turn (its prompt and its answer: a chat's next turn) says how many
  tokens it reuses (``"reuse": N``) and has only the rest in ``tokens`` (recording 2; read back
  whole, ``SessionTurns``);
* ``{"gap": {"at": T, "reason": "..."}}``: what is missing from here back to the line before (the
  target down, restarted, or the history's bounds dropped some before they were read);
* ``{"end": {"at": T, "reason": "..."}}``: the last line.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable
from radixtop.adapters.http.wire import WireError, from_wire
from radixtop.adapters.model import CAUSES, MAX_HISTORY_PAGE, ServedEntry, moment_end

RECORDING = 2
READABLE = (1, 2)
"""The recordings this one reads: 1 wrote each prompt whole."""
MOST_TURNS = 100_000
"""Sessions whose last turn a recording keeps (to write, and to read back, the next one's reuse):
the least recently active dropped first, the same on both sides."""
MIN_REUSE = 16
"""Tokens a turn reuses at least to be written as a reuse (fewer: whole)."""
MOMENT_SESSIONS = 100
"""Sessions a moment keeps: those with the most exclusive memory."""
SESSION_FIELDS = ("id", "state", "exclusive_bytes", "shared_bytes", "tagged_nodes", "locked_tokens")
POLL_S = 1.0
"""Seconds between reads of the journal once caught up."""
MAX_LINE = 64 << 20
"""A recording's line is at most this long (a node's tokens as JSON); past it, the file is refused."""


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h`` as seconds (ValueError in one line otherwise)."""
    units = {"s": 1, "m": 60, "h": 3600}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], None)
    number = raw[:-1] if scale else raw
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 2h)") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 2h)")
    return seconds


def create_private(path: Path) -> IO[str]:
    """``path`` created new, readable by its owner only (a recording holds prompts' token ids);
    FileExistsError where it exists (a recording is never overwritten)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


@dataclass
class Recorded:
    """What a recording run wrote, for its summary line."""

    removed: int = 0
    removed_tokens: int = 0
    served: int | None = 0
    """None: the target does not tell its requests."""
    moments: int = 0
    gaps: list[str] = field(default_factory=list)
    reason: str = ""


class Recorder:
    """Reads ``adapter``'s journal from its place, writes each removal and request as it comes and
    a moment every ``every`` seconds, until ``until`` (a ``clock()`` time), ``stop()`` or
    ``max_bytes``. A target that goes down or restarts is a gap, and the recording goes on."""

    def __init__(self, adapter: CacheAdapter, out: IO[str], until: float, every: float = 10.0,
                 max_bytes: int = 256 << 20, kept: bool = False, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.adapter, self.out = adapter, out
        self.until, self.every, self.max_bytes, self.kept = until, every, max_bytes, kept
        self.clock, self.sleep = clock, sleep
        self.done = Recorded()
        self.written = 0
        self._stopped = False
        self._epoch: str | None = None
        self._after = self._served_after = 0
        self._down: str | None = None
        self._turns = SessionTurns()

    def stop(self) -> None:
        self._stopped = True

    def _line(self, obj: dict[str, Any]) -> None:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"
        self.out.write(text)
        self.written += len(text)

    def run(self, version: str = "") -> Recorded:
        stats = self.adapter.stats()
        self._line({"recording": RECORDING, "radixtop": version, "target": stats.target, "started_at": time.time(),
                    "capacity_tokens": stats.capacity_tokens, "bytes_per_token": stats.bytes_per_token,
                    "geometry": stats.geometry.to_dict()})
        first = self.adapter.history(0, 0, 1)  # (Unsupported here: nothing to record, said at once)
        self._epoch = first.epoch
        if not self.kept:
            self._after, self._served_after = first.removed_count, first.served_count
        self._moment()
        next_moment = self.clock() + self.every
        reason = "the time asked for is up"
        try:
            while not self._stopped:
                caught_up = self._read()
                if self.written > self.max_bytes:
                    reason = f"the recording reached its bound ({self.max_bytes:,} bytes)"
                    break
                now = self.clock()
                if now >= next_moment:
                    self._moment()
                    next_moment = now + self.every
                if now >= self.until:
                    break
                if caught_up:
                    self.sleep(min(POLL_S, max(0.0, self.until - now)))
            else:
                reason = "stopped"
        except KeyboardInterrupt:
            reason = "interrupted"
        except AdapterError as exc:  # (down and restarts are gaps: this is the target refusing)
            reason = f"the target answered: {exc.message}"
        self._moment()
        self._line({"end": {"at": time.time(), "reason": reason}})
        self.out.flush()
        self.done.reason = reason
        return self.done

    def _gap(self, reason: str) -> None:
        self.done.gaps.append(reason)
        self._line({"gap": {"at": time.time(), "reason": reason}})

    def _read(self) -> bool:
        """One page of the journal written; True when it was the last for now."""
        try:
            page = self.adapter.history(self._after, self._served_after)
        except (TargetUnreachable, TargetTimeout) as exc:
            if self._down is None:
                self._down = exc.message
                self._gap(f"the target is down: {exc.message}")
            return True
        if self._down is not None:
            self._down = None
            self._line({"gap": {"at": time.time(), "reason": "the target is back"}})
        if page.epoch != self._epoch:
            self._epoch, self._after, self._served_after = page.epoch, 0, 0
            self._gap("the target's history started again (a restart): what left meanwhile is not known")
            return False
        if page.removed and page.removed_first > self._after + 1:
            self._gap(f"{page.removed_first - self._after - 1:,} removals were dropped by the target's history "
                      "bounds before they were read")
        for ghost in page.removed:
            self._line({"removed": ghost.to_dict()})
            self.done.removed += 1
            self.done.removed_tokens += len(ghost.tokens)
        if page.served is None:
            self.done.served = None
        elif page.served and page.served_first > self._served_after + 1:
            self._gap(f"{page.served_first - self._served_after - 1:,} ops of the engine were dropped by the target's "
                      "history bounds before they were read")
        for entry in page.served or ():
            self._line({"served": self._turns.written(entry.to_dict())})
            self.done.served = (self.done.served or 0) + (entry.op == "begin")
        if page.removed:
            self._after = page.removed[-1].seq
        if page.served:
            self._served_after = page.served[-1].seq
        return self._after >= page.removed_count and self._served_after >= page.served_count

    def _moment(self) -> None:
        """The figures and the largest sessions now; nothing where the target cannot say (down, or
        refusing: the recording's lines around say why)."""
        try:
            stats = self.adapter.stats()
        except AdapterError:
            return
        try:
            page = self.adapter.sessions("exclusive_bytes", 0, MOMENT_SESSIONS)
            sessions: list[dict[str, Any]] | None = [
                {name: getattr(row, name) for name in SESSION_FIELDS} for row in page.sessions]
        except AdapterError:  # (Unsupported: a target without sessions)
            sessions = None
        self._line({"moment": {"at": time.time(), "stats": stats.to_dict(), "sessions": sessions}})
        self.done.moments += 1


# ----- reading one -----


@dataclass
class Recording:
    path: Path
    header: dict[str, Any]
    moments: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    served: list[ServedEntry] = field(default_factory=list)
    served_lines: list[int] = field(default_factory=list)
    """The line of each of ``served`` in the file."""
    gap_lines: list[int] = field(default_factory=list)
    """The line of each of ``gaps``."""
    gaps: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None


class RecordingError(ValueError):
    pass


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    n = 0
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE:
            raise RecordingError(f"line {n}: longer than {MAX_LINE:,} bytes: not a recording")
        yield n, line


def read_header(path: Path) -> dict[str, Any]:
    """A recording's first line: RecordingError where it is not one."""
    with open(path, "rb") as stream:
        for _, line in _lines(stream):
            try:
                obj = json.loads(line)
            except ValueError:
                break
            if isinstance(obj, dict) and obj.get("recording") in READABLE:
                return obj
            break
    raise RecordingError(f"{path}: not a radixtop recording (its first line has no 'recording': 1 or 2)")


def read_recording(path: Path) -> Recording:
    """A recording, every line checked: RecordingError in one line (its number) where one is not
    a recording's."""
    with open(path, "rb") as stream:
        recording: Recording | None = None
        turns = SessionTurns()
        for n, line in _lines(stream):
            try:
                obj = json.loads(line)
            except ValueError:
                raise RecordingError(f"{path}: line {n} is not JSON: not a recording") from None
            if not isinstance(obj, dict) or len(obj) != 1 and recording is not None:
                raise RecordingError(f"{path}: line {n} is not a recording's line")
            if recording is None:
                if obj.get("recording") not in READABLE:
                    raise RecordingError(f"{path}: not a radixtop recording (its first line has no 'recording': 1 or 2)")
                recording = Recording(path, obj)
                continue
            ((kind, value),) = obj.items()
            if not isinstance(value, dict) or not _number(value.get("at")):
                raise RecordingError(f"{path}: line {n}: a {kind!r} line without its moment ('at')")
            if kind == "moment":
                if not isinstance(value.get("stats"), dict):
                    raise RecordingError(f"{path}: line {n}: a moment without its figures")
                recording.moments.append(value)
            elif kind == "removed":
                if not isinstance(value.get("tokens"), list) or value.get("cause") not in CAUSES:
                    raise RecordingError(f"{path}: line {n}: a removal without its tokens or cause")
                recording.removed.append(value)
            elif kind == "served":
                try:
                    recording.served.append(from_wire(ServedEntry, turns.read(value), "the op"))
                except WireError as exc:
                    raise RecordingError(f"{path}: line {n}: {exc.message}") from None
                except ValueError as exc:
                    raise RecordingError(f"{path}: line {n}: {exc}") from None
                recording.served_lines.append(n)
            elif kind == "gap":
                recording.gaps.append(value)
                recording.gap_lines.append(n)
            elif kind == "end":
                recording.end = value
            else:
                raise RecordingError(f"{path}: line {n}: unknown line {kind!r}")
        if recording is None:
            raise RecordingError(f"{path}: empty: not a recording")
        if not recording.moments:
            raise RecordingError(f"{path}: no moment recorded")
        return recording



def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


# ----- two moments compared -----

FIGURES = ("available_tokens", "evictable_tokens", "protected_tokens", "unevictable_tokens", "node_count",
           "open_sessions", "evicted_tokens", "freed_by_close_tokens", "prompt_tokens", "cached_tokens")
"""The figures a diff compares (each moment's ``Stats``)."""
TOP = 10


def moment_at(recording: Recording, offset: float | None, last: bool) -> dict[str, Any]:
    """The recording's last moment at or before ``offset`` seconds from its start (None: its first,
    or its last where ``last``)."""
    moments = recording.moments
    if offset is None:
        return moments[-1] if last else moments[0]
    start = recording.header.get("started_at", moments[0]["at"])
    at = start + offset
    ends = recording.end["at"] if recording.end else moments[-1]["at"]
    if at > ends:
        raise RecordingError(f"{recording.path}: it ends {ends - start:.0f}s after its start, before {offset:g}s")
    before = [m for m in moments if m["at"] <= at]
    if not before:
        raise RecordingError(f"{recording.path}: no moment by {offset:g}s from its start (its first is at "
                             f"{moments[0]['at'] - recording.header.get('started_at', moments[0]['at']):.0f}s)")
    return before[-1]


def diff(a: Recording, b: Recording | None, start: float | None, stop: float | None) -> dict[str, Any]:
    """From a moment of ``a`` to a later one (of ``b`` where given, else of ``a``): its figures
    then and after, the sessions that grew, came and went, and what left the tree in between, by
    cause and by session."""
    m1 = moment_at(a, start, last=b is not None and start is None)
    m2 = moment_at(b or a, stop, last=True)
    t1, t2 = m1["at"], m2["at"]
    if t2 < t1:
        raise RecordingError("the second moment is before the first: give the earlier recording first")
    figures = {}
    for name in FIGURES:
        x, y = m1["stats"].get(name), m2["stats"].get(name)
        figures[name] = {"from": x, "to": y, "change": None if x is None or y is None else y - x}
    s1 = None if m1.get("sessions") is None else {row["id"]: row["exclusive_bytes"] for row in m1["sessions"]}
    s2 = None if m2.get("sessions") is None else {row["id"]: row["exclusive_bytes"] for row in m2["sessions"]}
    removed = [r for r in _unique(a.removed + (b.removed if b else [])) if t1 < r["at"] <= t2]
    gaps = [g for g in a.gaps + (b.gaps if b else []) if t1 < g["at"] <= t2]
    if b is not None and a.end is not None and b.header.get("started_at", t2) > a.end["at"]:
        gaps.append({"at": a.end["at"], "reason": "between the two recordings nothing was recorded"})
    return compared(t1, t2, m2["stats"].get("bytes_per_token") or 0, figures, s1, s2, removed, gaps)


def compared(t1: float, t2: float, bpt: int, figures: dict[str, Any], s1: dict[str, int] | None,
             s2: dict[str, int] | None, removed: list[dict[str, Any]], gaps: list[dict[str, Any]]) -> dict[str, Any]:
    """``diff``'s answer from its parts (a recording's, or a live target's: ``diff_live``): the
    figures, each moment's largest sessions by their exclusive bytes (None: not known), the
    removals between the moments (as a recording's lines), the gaps."""
    sessions_known = s1 is not None and s2 is not None
    s1, s2 = s1 or {}, s2 or {}
    grew = sorted(((sid, s2[sid] - s1[sid]) for sid in s1.keys() & s2.keys()),
                  key=lambda item: (-abs(item[1]), item[0]))
    by_cause: dict[str, dict[str, int]] = {}
    by_session: dict[str, dict[str, int]] = {}
    for r in removed:
        n = len(r["tokens"])
        cause = by_cause.setdefault(r["cause"], {"nodes": 0, "tokens": 0})
        cause["nodes"] += 1
        cause["tokens"] += n
        owners = set(r.get("holders") or ())
        if r["cause"] == "closed" and r.get("session_id"):
            owners.add(r["session_id"])
        for sid in owners:
            mine = by_session.setdefault(sid, {})
            mine[r["cause"]] = mine.get(r["cause"], 0) + n
    return {
        "from": t1, "to": t2, "bytes_per_token": bpt, "figures": figures,
        "sessions": None if not sessions_known else {
            "grew": [{"id": sid, "exclusive_bytes_change": change} for sid, change in grew if change][:TOP],
            "new": sorted(s2.keys() - s1.keys())[:TOP], "gone": sorted(s1.keys() - s2.keys())[:TOP],
            "new_count": len(s2.keys() - s1.keys()), "gone_count": len(s1.keys() - s2.keys())},
        "left": {"nodes": len(removed), "tokens": sum(len(r["tokens"]) for r in removed), "by_cause": by_cause,
                 "by_session": [{"id": sid, "tokens": sum(c.values()), "by_cause": c} for sid, c in
                                sorted(by_session.items(), key=lambda item: (-sum(item[1].values()), item[0]))][:TOP]},
        "gaps": [{"at": g["at"], "reason": g["reason"]} for g in gaps],
    }


NO_OPS = 1 << 62
"""A reader's place past every op (``history``'s ``served_after``): a page of removals only."""


def diff_live(target: Any, t1: float, t2: float) -> dict[str, Any]:
    """``diff`` of two moments of a live target's history (no recording): the tokens cached at
    each and the sessions' memory then (``then``), and what left the tree in between (its journal,
    ``history``, read from its start)."""
    if t2 < t1:
        raise RecordingError("the second moment is before the first: give the earlier one first")
    v1, v2 = target.then(t1), target.then(t2)
    figures = {"cached_tokens": {"from": v1.tokens_then, "to": v2.tokens_then,
                                 "change": v2.tokens_then - v1.tokens_then}}
    bpt = v2.bytes_per_token or 0

    def largest(v: Any) -> dict[str, int] | None:
        return None if v.memory is None or not bpt else {x.session_id: x.exclusive_tokens * bpt for x in v.memory}

    removed: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []
    after, epoch = 0, None
    end1, end2 = moment_end(t1), moment_end(t2)  # (each tree is told as of its millisecond's end)
    while True:
        page = target.history(after, NO_OPS, MAX_HISTORY_PAGE)
        if epoch is not None and page.epoch != epoch:
            raise RecordingError("the target's history began again (a restart) while it was read: ask again")
        epoch = page.epoch
        if page.removed_first > after + 1 and after:
            gaps.append({"at": page.removed[0].at if page.removed else t2,
                         "reason": "removals dropped by the history's bounds while it was read"})
        removed.extend(g.to_dict() for g in page.removed if end1 <= g.at < end2)
        if not page.removed or page.removed[-1].seq >= page.removed_count or page.removed[-1].at >= end2:
            break
        after = page.removed[-1].seq
    return compared(t1, t2, bpt, figures, largest(v1), largest(v2), removed, gaps)


def _unique(removed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Removals once each (two recordings of one run may overlap), by their moment and node."""
    seen: set[tuple[Any, Any]] = set()
    out = []
    for r in removed:
        key = (r["at"], r.get("node_id"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


# ----- its traffic as a trace -----


@dataclass
class RecordedTraffic:
    """A recording's ops of the engine as radixtop's trace ops (``replay --format recording``),
    and what of them could not be replayed."""

    ops: list[Any]
    """``Op``s, in the engine's order."""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """The hits the engine served them with (the requests replayed)."""
    began_before: int = 0
    """Requests that finished or aborted in the recording but began before it: left out."""
    without_tokens: int = 0
    """Requests whose tokens the target's history no longer held when they were read: left out."""
    tokens_at_start: int | None = 0
    """The tree's tokens when the recording's first op ran (a replay starts from an empty tree);
    None: unknown (``--kept``: ops from before its first moment)."""
    gaps: int = 0
    cut_by_gaps: int = 0
    """Requests begun before a gap whose end is in it: aborted at the gap (their slots given back)."""

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


def recorded_traffic(recording: Recording) -> RecordedTraffic:
    """The engine's ops in ``recording`` as trace ops: each request whose begin the recording holds
    with its prompt (and its finish with its output); a session's close and register; an evict or
    flush someone asked for. At a gap, the requests still running are aborted (what became of them
    is not known; a restart's request ids may come again after it). RecordingError where it holds
    none (a KV-event stream tells no requests)."""
    from radixtop.gpu_backend.traces.ops import Op

    if not recording.served:
        raise RecordingError(f"{recording.path}: no requests recorded (the target does not tell them: a KV-event "
                             "stream's events carry none)")
    first = recording.moments[0]
    at_start = first["stats"].get("total_tokens")
    traffic = RecordedTraffic([], tokens_at_start=None if recording.served[0].at < first["at"]
                              else at_start if isinstance(at_start, int) and at_start >= 0 else 0,
                              gaps=len(recording.gaps))
    ops, begun, left_out = traffic.ops, {}, set()
    last: dict[str, list[int]] = {}
    """Each session's last request's prompt and output: what its next one may reuse."""
    gaps, epoch = iter(recording.gap_lines), 0
    gap = next(gaps, None)
    for n, entry in zip(recording.served_lines, recording.served, strict=True):
        while gap is not None and gap < n:  # (the requests running at a gap: aborted there)
            for rid in begun:
                ops.append(Op(gap, "abort", {"id": rid}))
            traffic.cut_by_gaps += len(begun)
            begun.clear()
            epoch += 1
            gap = next(gaps, None)
        op, tokens, sid = entry.op, entry.tokens, entry.session_id or None
        rid = None if not entry.request_id else entry.request_id if not epoch else f"{epoch}/{entry.request_id}"
        if op == "begin":
            if rid is None or tokens is None:
                traffic.without_tokens += 1
                left_out.add(rid)
                continue
            prompt = list(tokens)
            if rid in begun:  # (an id again while it ran: the first never ended in the recording)
                ops.append(Op(n, "abort", {"id": rid}))
            begun[rid] = (sid, prompt)
            reuse = 0 if sid not in last else _common_prefix(prompt, last[sid])
            ops.append(Op(n, "begin", {"id": rid, "input": prompt, "session": sid, "reuse": reuse}))
            traffic.requests += 1
            traffic.prompt_tokens += entry.prompt_tokens
            traffic.cached_tokens += entry.cached_tokens
        elif op in ("finish", "abort"):
            if rid not in begun:
                traffic.began_before += rid not in left_out
                continue
            began, prompt = begun.pop(rid)
            if op == "finish" and tokens is not None:
                ops.append(Op(n, "finish", {"id": rid, "output": list(tokens)}))
                if began is not None:
                    last[began] = prompt + list(tokens)
            else:  # (its output no longer held: it runs no further, as an abort)
                traffic.without_tokens += op == "finish"
                ops.append(Op(n, "abort", {"id": rid}))
        elif op in ("close", "register") and isinstance(sid, str) and sid:
            ops.append(Op(n, op, {"session": sid}))
        elif op == "evict":
            ops.append(Op(n, "evict", {"tokens": entry.asked_tokens}))
        elif op == "flush":
            ops.append(Op(n, "flush", {}))
    if not traffic.requests and traffic.without_tokens:
        raise RecordingError(f"{recording.path}: its requests have no token ids (the target's history no longer "
                             "held them when they were read, or they were too long for a frame): nothing to replay")
    return traffic


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # (a[:low] == b[:low], a[:high] != b[:high])
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


class SessionTurns:
    """Each session's last turn (its last finished request's prompt and answer), kept alike by the
    recording's writer and its reader: a begin of the session that reuses the start of it is
    written as the tokens it reuses (``reuse``) and the rest, and read back whole. Both sides see
    the same lines in the same order, so they keep the same turns."""

    def __init__(self) -> None:
        self._last: OrderedDict[str, list[int]] = OrderedDict()
        self._prompts: dict[str, tuple[str, list[int]]] = {}
        """Each request begun and not yet ended: its session and its prompt."""

    def written(self, entry: dict[str, Any]) -> dict[str, Any]:
        """An op as the recording writes it (a begin that reuses its session's last turn: the rest)."""
        raw, sid = entry.get("tokens"), entry.get("session_id")
        tokens = None if raw is None else list(raw)  # (a view's are a tuple)
        last = self._last.get(sid) if entry.get("op") == "begin" and sid is not None else None
        reuse = 0 if last is None or tokens is None else _common_prefix(tokens, last)
        self._told(entry, tokens)
        return {**entry, "tokens": tokens[reuse:], "reuse": reuse} if tokens is not None and reuse >= MIN_REUSE else entry

    def read(self, value: dict[str, Any]) -> dict[str, Any]:
        """An op as the recording holds it, whole again (ValueError: a reuse that is not one). A
        reuse of a turn the file does not hold (a line taken out of it): its tokens are not known
        (None, as the history's bounds leave an op), the rest of the file is read."""
        reuse = value.pop("reuse", None)
        tokens, sid = value.get("tokens"), value.get("session_id")
        if reuse is not None:
            if value.get("op") != "begin" or not isinstance(tokens, list) or isinstance(reuse, bool) \
                    or not isinstance(reuse, int) or reuse < 1:
                raise ValueError(f"a reuse of {reuse!r} tokens that is not one")
            last = self._last.get(sid) if isinstance(sid, str) else None
            tokens = value["tokens"] = None if last is None or reuse > len(last) else last[:reuse] + tokens
        if isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            self._told(value, tokens)
        else:
            self._told(value, None)
        return value

    def _told(self, entry: dict[str, Any], tokens: list[int] | None) -> None:
        op, rid, sid = entry.get("op"), entry.get("request_id"), entry.get("session_id")
        if not isinstance(rid, str):
            if op == "close" and isinstance(sid, str):
                self._last.pop(sid, None)
            return
        if op == "begin":
            if isinstance(sid, str) and tokens is not None:
                self._prompts[rid] = (sid, list(tokens))
            return
        began = self._prompts.pop(rid, None)
        if op == "finish" and began is not None and tokens is not None:
            sid, prompt = began
            self._last[sid] = prompt + list(tokens)
            self._last.move_to_end(sid)
            if len(self._last) > MOST_TURNS:
                self._last.popitem(last=False)
