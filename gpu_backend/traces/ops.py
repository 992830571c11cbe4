"""Traces: JSON-lines ops (begin, finish, abort, request, close, register, evict, flush), parsing and replay."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from radixtop.gpu_backend.kv_geometry import KVGeometry, get_geometry
from radixtop.gpu_backend.scheduler import OutOfSlotsError, Scheduler, UnknownRequestError

OPS = ("begin", "finish", "abort", "request", "close", "register", "evict", "flush")
MAX_TOKEN_ID = 2**63 - 1  # token ids and counts are int64 everywhere past the trace (pool, API, export)
MAX_LINE_BYTES = 16 * 2**20
"""The longest op line read: a 1M-token prompt is about 8 MB of JSON. A longer line is refused
before it is parsed, so one line cannot cost gigabytes of Python ints."""


class TraceError(ValueError):
    """A trace line that cannot be applied; the message names the line."""

    def __init__(self, line_no: int, message: str):
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no


@dataclass(frozen=True)
class Op:
    line_no: int
    op: str
    fields: dict[str, Any]


def _token_list(line_no: int, fields: dict, name: str) -> list[int]:
    if name not in fields:
        raise TraceError(line_no, f"missing field {name!r}")
    value = fields[name]
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise TraceError(line_no, f"field {name!r} must be a list of integer token ids")
    if any(t < 0 for t in value):
        raise TraceError(line_no, f"field {name!r} has a negative token id")
    if any(t > MAX_TOKEN_ID for t in value):
        raise TraceError(line_no, f"field {name!r} has a token id over 2**63-1")
    return value


def _session(line_no: int, fields: dict, required: bool) -> str | None:
    if "session" not in fields:
        if required:
            raise TraceError(line_no, "missing field 'session'")
        return None
    sid = fields["session"]
    if sid is None and not required:
        return None
    if not isinstance(sid, str) or not sid:
        raise TraceError(line_no, "field 'session' must be a non-empty string" + ("" if required else " or null"))
    return sid


def parse_op(line_no: int, text: str) -> Op:
    """Validate one trace line into an Op (fields normalised); raises TraceError."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(line_no, f"not valid JSON ({exc.msg})") from None
    except ValueError:  # json's int() refuses numbers over 4300 digits
        raise TraceError(line_no, "not valid JSON (a number too long to read)") from None
    except RecursionError:
        raise TraceError(line_no, "not valid JSON (nested too deeply)") from None
    if not isinstance(raw, dict):
        raise TraceError(line_no, "an op must be a JSON object")
    op = raw.get("op")
    if op not in OPS:
        raise TraceError(line_no, f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    f: dict[str, Any] = {}
    if op in ("begin", "finish", "abort"):
        rid = raw.get("id")
        if not isinstance(rid, str) or not rid:
            raise TraceError(line_no, "missing field 'id' (a non-empty string)")
        f["id"] = rid
    if op in ("begin", "request"):
        f["input"] = _token_list(line_no, raw, "input")
        f["session"] = _session(line_no, raw, required=False)
    if op in ("finish", "request"):
        f["output"] = _token_list(line_no, raw, "output")
    if op in ("close", "register"):
        f["session"] = _session(line_no, raw, required=True)
    if op == "evict":
        tokens = raw.get("tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= MAX_TOKEN_ID:
            raise TraceError(line_no, "field 'tokens' must be a non-negative integer (below 2**63)")
        f["tokens"] = tokens
    return Op(line_no, op, f)


def read_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """A binary stream's lines for read_trace, split as a text file's are (LF, CRLF or CR). Each
    is read with a bound, so a line over ``limit`` bytes is a TraceError naming it rather than a
    line held whole in memory; and they stay bytes, so a line that is not UTF-8 is named too."""
    line_no = 0
    while True:
        chunk = stream.readline(limit + 1)
        if not chunk:
            return
        if len(chunk) > limit and not chunk.endswith(b"\n"):
            raise TraceError(line_no + 1, f"longer than {limit:,} bytes (one op is one line: is this a trace?)")
        if chunk.endswith(b"\n"):
            body = chunk[:-2] if chunk.endswith(b"\r\n") else chunk[:-1]
        else:  # the last line, without an end
            body = chunk[:-1] if chunk.endswith(b"\r") else chunk
        for line in body.split(b"\r"):
            line_no += 1
            yield line


def read_trace(lines: Iterable[str | bytes]) -> Iterator[Op]:
    """Ops from JSON lines (text, or UTF-8 bytes as read_lines yields them); blank lines and
    lines starting with '#' are skipped."""
    for line_no, text in enumerate(lines, start=1):
        if len(text) > MAX_LINE_BYTES:
            raise TraceError(line_no, f"longer than {MAX_LINE_BYTES:,} bytes (one op is one line: is this a trace?)")
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(line_no, f"not UTF-8 text (byte 0x{text[exc.start]:02x} at column "
                                          f"{exc.start + 1})") from None
        text = text.strip()
        if text and not text.startswith("#"):
            yield parse_op(line_no, text)


def op_to_json(op: str, **fields: Any) -> str:
    return json.dumps({"op": op, **fields}, separators=(",", ":"))


class Replayer:
    """Applies ops to a Scheduler and keeps one result per op."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.results: list[dict[str, Any]] = []
        self._auto_id = 0

    def apply(self, op: Op) -> dict[str, Any]:
        s, f = self.scheduler, op.fields
        try:
            if op.op == "begin":
                result = {"op": "begin", "hit": s.begin(f["id"], f["input"], f["session"])}
            elif op.op == "finish":
                s.finish(f["id"], f["output"])
                result = {"op": "finish"}
            elif op.op == "abort":
                s.abort(f["id"])
                result = {"op": "abort"}
            elif op.op == "request":
                self._auto_id += 1
                rid = f"\x00request-{self._auto_id}"
                result = {"op": "request", "hit": s.request(rid, f["input"], f["output"], f["session"])}
            elif op.op == "close":
                closed = s.close_session(f["session"])
                result = {"op": "close", "freed_nodes": closed.freed_nodes, "freed_tokens": closed.freed_tokens}
            elif op.op == "register":
                s.register_session(f["session"])
                result = {"op": "register"}
            elif op.op == "evict":
                result = {"op": "evict", "evicted_tokens": s.evict_asked(f["tokens"], "the trace").num_tokens_evicted}
            else:
                result = {"op": "flush", "evicted_tokens": s.flush().num_tokens_evicted}
        except (UnknownRequestError, OutOfSlotsError, ValueError) as exc:
            raise TraceError(op.line_no, str(exc)) from None
        self.results.append(result)
        return result


def tree_rows(scheduler: Scheduler) -> list[dict[str, Any]]:
    """Every node but the root as {path, tokens, lock_ref, holders}, sorted by path."""
    cache = scheduler.cache
    rows = []
    stack = [(child, ()) for child in cache.root_node.children.values()]
    while stack:
        node, prefix = stack.pop()
        path = prefix + node.key
        rows.append({
            "path": list(path),
            "tokens": len(node.key),
            "lock_ref": node.lock_ref,
            "holders": sorted(node.session_ids or ()),
        })
        stack.extend((c, path) for c in node.children.values())
    rows.sort(key=lambda r: r["path"])
    return rows


def replay(
    lines: Iterable[str],
    capacity: int,
    page_size: int = 1,
    eviction_policy: str = "lru",
    close_policy: str = "free",
    geometry: KVGeometry | None = None,
    clock=None,
) -> dict[str, Any]:
    """Apply a trace op by op as it is read (the first bad line stops it before the next is
    read, and memory never follows the trace's size); the document ``radixtop replay --json``
    prints. ``timing.ops_s`` counts applying the ops, not reading them."""
    geometry = (geometry or get_geometry("tiny")).with_page_size(page_size)
    scheduler = Scheduler(
        geometry, capacity, device="meta", eviction_policy=eviction_policy,
        close_policy=close_policy, clock=clock,
    )
    replayer = Replayer(scheduler)
    ops_s = 0.0
    for op in read_trace(lines):
        start = time.perf_counter()
        replayer.apply(op)
        ops_s += time.perf_counter() - start
    return {
        "results": replayer.results,
        "tree": tree_rows(scheduler),
        "stats": scheduler.stats().as_dict(),
        "timing": {"ops_s": ops_s},
    }
