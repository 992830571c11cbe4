"""Public KV-cache traces (Mooncake, kv-cache-tester) read and turned into radixtop's trace ops.

Both formats give, per request, an arrival time, token counts and the hash ids of its prompt's
blocks, never the tokens. Each hash id becomes a fixed run of synthetic token ids (the same id in
the same scope gives the same run, so the trace's sharing is kept); the part of a prompt past its
blocks and every output are fresh ids that nothing else shares. ``scale`` divides every length:
with 512-token blocks and scale 8, a block is 64 tokens.

* Mooncake (kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl``): one JSON object a line,
  ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` (prefix block hashes of
  512-token blocks; the last block is usually partial). One hash-id scope for the whole trace.
  Sessions are inferred: a request whose hash ids start with all of an earlier request's (or all but
  its last, partial block), at least two blocks, continues that request's session.
* kv-cache-tester (callanjfox/kv-cache-tester ``traces/trace_*.json``): one conversation a file,
  ``block_size``, ``hash_id_scope``, ``requests[]`` of ``t`` (s), ``in``, ``out``, ``hash_ids``
  (whole blocks only), ``api_time``; an entry of ``type`` "subagent" holds a sub-agent's own
  ``requests`` (its ``t`` from the parent's start, theirs from its own). One file is one session,
  each sub-agent its own; ``local`` scope: hash ids are per file, sub-agents sharing their parent's.

A request with a duration (``api_time``) begins at its time and finishes that much later (never
after its session's next request begins); one without is a ``request`` op. A session is closed
right after its last request finishes.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixtop.gpu_backend.traces.ops import Op, TraceError, read_lines

FORMATS = ("radixtop", "mooncake", "kv-cache-tester")
MOONCAKE_BLOCK_SIZE = 512
MIN_CONTINUATION_BLOCKS = 2
"""A Mooncake request continues a session only through at least this many shared blocks: every
request of the conversation trace starts with the same block (hash id 0)."""


class TraceFormatError(TraceError):
    """A trace in a public format that cannot be read; the message names where (line or field)."""

    def __init__(self, where: str, message: str, line_no: int = 0):
        ValueError.__init__(self, f"{where}: {message}" if where else message)
        self.line_no = line_no


@dataclass(frozen=True)
class TraceRequest:
    """One request of a public trace, with its session found."""

    t: float
    """Seconds from the trace's start."""
    session: str
    scope: str
    """The namespace of its hash ids: the same id in the same scope is the same block."""
    hash_ids: tuple[int, ...]
    input_length: int
    output_length: int
    duration: float | None
    """Seconds it runs (begin to finish); None: it begins and finishes at once."""


@dataclass(frozen=True)
class ParsedTrace:
    format: str
    block_size: int
    requests: list[TraceRequest]
    """Sorted by time (stable: the trace's own order among equal times)."""

    @property
    def sessions(self) -> int:
        return len({r.session for r in self.requests})

    @property
    def duration(self) -> float:
        return max((r.t + (r.duration or 0.0) for r in self.requests), default=0.0)


# ----- field checks -----


def _int(raw: dict, name: str, where: str, line_no: int = 0) -> int:
    if name not in raw:
        raise TraceFormatError(where, f"missing field {name!r}", line_no)
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TraceFormatError(where, f"field {name!r} must be a non-negative integer, not {value!r:.40}", line_no)
    return value


def _number(raw: dict, name: str, where: str, line_no: int = 0, default: float | None = None) -> float | None:
    if name not in raw:
        if default is not None:
            return default
        raise TraceFormatError(where, f"missing field {name!r}", line_no)
    value = raw[name]
    if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            or value < 0):
        raise TraceFormatError(where, f"field {name!r} must be a non-negative number, not {value!r:.40}", line_no)
    return float(value)


MAX_REQUEST_TOKENS = 1 << 21
"""The longest prompt or output a trace's request may ask for (2,097,152 tokens, past every
context window served today): each prompt's tokens are built in full, so a hostile line asking
for billions would take the memory of the box."""


def _length(value: int, name: str, where: str, line_no: int, blocks: int | None, block_size: int) -> int:
    """A request's ``name`` length, read: backed by its ``blocks`` hash ids (a prompt; a partial
    block past them allowed) and at most MAX_REQUEST_TOKENS."""
    if blocks is not None and value > (blocks + 1) * block_size:
        raise TraceFormatError(where, f"{name} {value:,} is more than its {blocks:,} hash_ids blocks of "
                                      f"{block_size} tokens (and a partial block) hold", line_no)
    if value > MAX_REQUEST_TOKENS:
        raise TraceFormatError(where, f"{name} {value:,} is over radixtop's maximum of {MAX_REQUEST_TOKENS:,} "
                                      "tokens a request", line_no)
    return value


def _hash_ids(raw: dict, where: str, line_no: int = 0) -> tuple[int, ...]:
    if "hash_ids" not in raw:
        raise TraceFormatError(where, "missing field 'hash_ids'", line_no)
    value = raw["hash_ids"]
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in value
    ):
        raise TraceFormatError(where, "field 'hash_ids' must be a list of non-negative integers", line_no)
    return tuple(value)


# ----- Mooncake -----


class _SessionFinder:
    """Which earlier request a Mooncake request continues: a trie of hash ids whose nodes remember
    the session of the latest request that ended there (or one block short of its end)."""

    def __init__(self) -> None:
        self.children: dict[tuple[int, int], int] = {}
        self.ends: dict[int, str] = {}

    def find(self, hash_ids: tuple[int, ...]) -> str | None:
        node, found = 0, None
        for depth, h in enumerate(hash_ids, start=1):
            node = self.children.get((node, h))
            if node is None:
                break
            if depth >= MIN_CONTINUATION_BLOCKS and node in self.ends:
                found = self.ends[node]
        return found

    def add(self, hash_ids: tuple[int, ...], session: str) -> None:
        node = 0
        for depth, h in enumerate(hash_ids, start=1):
            nxt = self.children.get((node, h))
            if nxt is None:
                nxt = self.children[(node, h)] = len(self.children) + 1
            node = nxt
            if depth >= len(hash_ids) - 1:  # its whole list, or all but its last (partial) block
                self.ends[node] = session


def read_mooncake(lines: Iterable[str | bytes]) -> ParsedTrace:
    """A Mooncake JSONL trace (read_lines of a binary stream, or text lines)."""
    finder = _SessionFinder()
    requests: list[TraceRequest] = []
    sessions = 0
    for line_no, text in enumerate(lines, start=1):
        where = f"line {line_no}"
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceFormatError(where, "not UTF-8 text", line_no) from None
        text = text.strip()
        if not text:
            continue
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
            raise TraceFormatError(where, f"not valid JSON ({msg})", line_no) from None
        if not isinstance(raw, dict):
            raise TraceFormatError(where, "a Mooncake request must be a JSON object with timestamp, "
                                          "input_length, output_length and hash_ids", line_no)
        t = _number(raw, "timestamp", where, line_no) / 1000.0
        input_length = _int(raw, "input_length", where, line_no)
        output_length = _int(raw, "output_length", where, line_no)
        hash_ids = _hash_ids(raw, where, line_no)
        _length(input_length, "input_length", where, line_no, len(hash_ids), MOONCAKE_BLOCK_SIZE)
        _length(output_length, "output_length", where, line_no, None, MOONCAKE_BLOCK_SIZE)
        session = finder.find(hash_ids)
        if session is None:
            sessions += 1
            session = f"m{sessions}"
        finder.add(hash_ids, session)
        requests.append(TraceRequest(t, session, "", hash_ids, input_length, output_length, None))
    requests.sort(key=lambda r: r.t)
    return ParsedTrace("mooncake", MOONCAKE_BLOCK_SIZE, requests)


# ----- kv-cache-tester -----


def _tester_requests(entries: Any, where: str, session: str, scope: str, base: float,
                     out: list[TraceRequest], block_size: int) -> None:
    if not isinstance(entries, list):
        raise TraceFormatError(where, "field 'requests' must be a list")
    own: list[tuple[float, tuple[int, ...], int, int, float | None]] = []
    agents = 0
    for i, raw in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(raw, dict):
            raise TraceFormatError(at, "a request must be a JSON object")
        t = base + _number(raw, "t", at)
        if raw.get("type") == "subagent":
            agents += 1
            agent = raw.get("agent_id")
            name = agent if isinstance(agent, str) and agent else f"agent_{agents:03d}"
            if "requests" not in raw:
                raise TraceFormatError(at, "missing field 'requests' (a subagent entry holds its own)")
            _tester_requests(raw["requests"], f"{at}.requests", f"{session}/{name}", scope, t, out, block_size)
            continue
        api_time = _number(raw, "api_time", at, default=-1.0)
        hash_ids, n_in, n_out = _hash_ids(raw, at), _int(raw, "in", at), _int(raw, "out", at)
        own.append((t, hash_ids, _length(n_in, "in", at, 0, len(hash_ids), block_size),
                    _length(n_out, "out", at, 0, None, block_size), None if api_time < 0 else api_time))
    own.sort(key=lambda r: r[0])
    for k, (t, hash_ids, n_in, n_out, api_time) in enumerate(own):
        if api_time is not None and k + 1 < len(own):  # a turn ends before its session's next begins
            api_time = min(api_time, own[k + 1][0] - t)
        out.append(TraceRequest(t, session, scope, hash_ids, n_in, n_out, api_time))


def read_kv_cache_tester(docs: Iterable[tuple[str, bytes | str]]) -> ParsedTrace:
    """kv-cache-tester traces: (name, JSON text) per file, each one conversation starting at 0."""
    requests: list[TraceRequest] = []
    block_size: int | None = None
    used: set[str] = set()
    for name, text in docs:
        prefix = f"{name}: " if name else ""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
            raise TraceFormatError(name, f"not valid JSON ({msg}; a kv-cache-tester trace is one JSON "
                                         "document)") from None
        if not isinstance(doc, dict) or "requests" not in doc:
            raise TraceFormatError(name, "not a kv-cache-tester trace (a JSON object with 'requests')")
        size = doc.get("block_size", 64)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise TraceFormatError(name, f"field 'block_size' must be a positive integer, not {size!r:.40}")
        if block_size is not None and size != block_size:
            raise TraceFormatError(name, f"block_size {size} differs from the other traces' {block_size}")
        block_size = size
        scope_kind = doc.get("hash_id_scope", "local")
        if scope_kind not in ("local", "per_context", "global"):
            raise TraceFormatError(name, f"unknown hash_id_scope {scope_kind!r}; known: local, global")
        session = doc.get("id") if isinstance(doc.get("id"), str) and doc.get("id") else (
            Path(name).stem if name else "trace")
        base, n = session, 1
        while session in used:  # two files with one id are still two conversations
            n += 1
            session = f"{base}~{n}"
        used.add(session)
        scope = "" if scope_kind == "global" else session
        _tester_requests(doc["requests"], f"{prefix}requests", session, scope, 0.0, requests, size)
    requests.sort(key=lambda r: r.t)
    return ParsedTrace("kv-cache-tester", block_size or 64, requests)


def load_trace(path: Path, fmt: str) -> ParsedTrace:
    """Read ``path`` in ``fmt`` (mooncake or kv-cache-tester; a kv-cache-tester directory is
    every ``*.json`` in it, in name order). Raises OSError or TraceFormatError."""
    if fmt == "mooncake":
        with path.open("rb") as stream:
            return read_mooncake(read_lines(stream))
    if fmt == "kv-cache-tester":
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
            if not files:
                raise TraceFormatError(str(path), "no *.json trace in this directory")
            return read_kv_cache_tester((p.name, p.read_bytes()) for p in files)
        return read_kv_cache_tester([("", path.read_bytes())])
    raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")


# ----- ops -----


class BlockTokens:
    """Synthetic token ids: each (scope, hash id) a fixed run of ``block`` ids, every other run fresh."""

    def __init__(self, block: int):
        self.block = block
        self.next_id = 1
        self.runs: dict[tuple[str, int], int] = {}

    def fresh(self, n: int) -> list[int]:
        start, self.next_id = self.next_id, self.next_id + n
        return list(range(start, start + n))

    def prompt(self, scope: str, hash_ids: tuple[int, ...], length: int) -> list[int]:
        """``length`` tokens: the blocks' runs (the last one cut short if the prompt ends inside
        it), then fresh ids past the last block."""
        b, runs, tokens = self.block, self.runs, []
        for h in hash_ids[: -(-length // b) if b else 0]:
            start = runs.get((scope, h))
            if start is None:
                start = runs[(scope, h)] = self.next_id
                self.next_id += b
            tokens.extend(range(start, start + b))
        del tokens[length:]
        if len(tokens) < length:
            tokens.extend(self.fresh(length - len(tokens)))
        return tokens


@dataclass(frozen=True)
class TimedOp:
    t: float
    """Seconds from the trace's start."""
    op: Op


def scaled_block(block_size: int, scale: int) -> int:
    if scale < 1 or block_size % scale:
        raise ValueError(f"--scale {scale} does not divide the trace's {block_size}-token blocks "
                         "(use a divisor of it, e.g. 1, 2, 4, 8)")
    return block_size // scale


def timed_ops(trace: ParsedTrace, scale: int = 1, close_sessions: bool = True) -> Iterator[TimedOp]:
    """The trace as radixtop ops in time order, built as they are consumed (one prompt's tokens
    at a time). A begin carries ``reuse``: the tokens of its prompt that its own session's
    previous request had (so a miss on them is KV the cache no longer held)."""
    tokens = BlockTokens(scaled_block(trace.block_size, scale))
    last: dict[str, int] = {r.session: i for i, r in enumerate(trace.requests)}
    previous: dict[str, tuple[tuple[int, ...], int]] = {}
    counts: dict[str, int] = {}
    pending: list[tuple[float, int, int, Op]] = []  # (t, 0 finish / 1 close, seq, op)
    for i, req in enumerate(trace.requests):
        while pending and pending[0][0] <= req.t:
            t, _, _, op = heapq.heappop(pending)
            yield TimedOp(t, op)
        n_in = -(-req.input_length // scale)
        prompt = tokens.prompt(req.scope, req.hash_ids, n_in)
        output = tokens.fresh(-(-req.output_length // scale))
        reuse = 0
        if req.session in previous:
            before, before_len = previous[req.session]
            shared = 0
            for a, b in zip(before, req.hash_ids):
                if a != b:
                    break
                shared += 1
            reuse = min(shared * tokens.block, before_len, n_in)
        previous[req.session] = (req.hash_ids, n_in)
        k = counts[req.session] = counts.get(req.session, 0) + 1
        fields = {"input": prompt, "session": req.session, "reuse": reuse}
        ends = close_sessions and last[req.session] == i
        if not req.duration:
            yield TimedOp(req.t, Op(i + 1, "request", {**fields, "output": output}))
            if ends:
                yield TimedOp(req.t, Op(i + 1, "close", {"session": req.session}))
            continue
        rid = f"{req.session}#{k}"
        yield TimedOp(req.t, Op(i + 1, "begin", {**fields, "id": rid}))
        done = req.t + req.duration
        heapq.heappush(pending, (done, 0, i, Op(i + 1, "finish", {"id": rid, "output": output})))
        if ends:
            heapq.heappush(pending, (done, 1, i, Op(i + 1, "close", {"session": req.session})))
    while pending:
        t, _, _, op = heapq.heappop(pending)
        yield TimedOp(t, op)
