"""The admin API's wire schema: view types to JSON-able dicts and back, and the error body.

Shared by the HTTP server and client so that a client rebuilds objects equal to the server's.
Plain Python only (no fastapi, no pydantic): the client must stay light.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Iterator
from functools import cache
from typing import Annotated, Any, Literal, TypeVar, Union

from radixtop.adapters.errors import ERRORS_BY_CODE, AdapterError, BadRequest, Unauthorized
from radixtop.adapters.model import (
    CAUSES,
    HASH,
    AuditEntry,
    Capabilities,
    ChainView,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    Diagnosis,
    EvictResultView,
    FlushResultView,
    HistoryPage,
    MatchView,
    NodeDetail,
    PathsView,
    SessionDetail,
    SessionsPage,
    SessionWhyView,
    Stats,
    SubtreeView,
    ThenView,
    WhyView,
    moment_end,
)

V = TypeVar("V")

WIRE_VERSION = 2
"""The admin API's wire version (its OpenAPI ``info.version``). 2 (radixtop 0.2): the pool in
SGLang's leak-check words (``docs/api.md``); version 1's stats keys are still sent until 0.3
(``Stats.to_dict``: ``free_tokens`` and ``free_bytes``, the available ones; ``running_tokens``,
the unevictable less ``protected``), and a version 1 reply is still read (``stats_from_dict``).
In version 1 ``protected_tokens`` was every unevictable token; it is SGLang's ``protected`` now."""

# Codes the HTTP edge uses for conditions that are not adapter errors (routing, sizes).
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
PAYLOAD_TOO_LARGE = "payload_too_large"
BAD_HOST = "bad_host"  # 400: a Host the server is not bound to (DNS rebinding)
CROSS_ORIGIN = "cross_origin"  # 403: a request from a web page of another origin
BUSY = "busy"  # 429: heavy reads at their limit; Retry-After says when to ask again


class WireError(AdapterError):
    """A reply that does not follow the wire schema."""


class PayloadTooLarge(AdapterError):
    """A request over one of the API's size limits (its URL, head, body or a match's tokens)."""

    code = PAYLOAD_TOO_LARGE
    http_status = 413


MAX_COUNT = 2**63 - 1
"""The largest count a target may send (an int64: what the API itself can send back)."""


def is_count(value: Any) -> bool:
    """A whole number of things: an int (never a bool) in 0 .. MAX_COUNT."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def count(value: Any, what: str) -> int:
    """``value`` if it is a count (``is_count``), else WireError naming ``what``."""
    if not is_count(value):
        raise WireError(f"{what} is {_shown(value)}, not a count (a whole number from 0 to 2**63-1)")
    return value


def hash64(value: Any, what: str) -> int:
    """``value`` if it is a whole number from 0 to 2**64-1 (``model.NodeOrBlock``: a block's hash
    names what left a KV-event stream's tree), else WireError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise WireError(f"{what} is {_shown(value)}, not an id (a whole number from 0 to 2**64-1)")
    return value


def finite(value: Any, what: str) -> float:
    """``value`` as a float if it is a finite number (never a bool), else WireError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WireError(f"{what} is {_shown(value)}, not a finite number")
    return float(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


@cache
def _field_types(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(
        (f.name, hints[f.name],
         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls) if f.init
    )


def _convert(tp: Any, value: Any, what: str) -> Any:
    """``value`` as type ``tp`` or WireError naming ``what``: every int a count, every float
    finite, a bool only where a bool belongs, a string where a string does."""
    origin = typing.get_origin(tp)
    if value is None:
        if origin in (Union, types.UnionType) and type(None) in typing.get_args(tp):
            return None
        raise WireError(f"{what} is null")
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(inner[0], value, what) if len(inner) == 1 else value
    if origin is Annotated:
        base, *marks = typing.get_args(tp)
        return hash64(value, what) if HASH in marks else _convert(base, value, what)
    if dataclasses.is_dataclass(tp):
        return from_wire(tp, value, what)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise WireError(f"{what}: expected a list, got {type(value).__name__}")
        return tuple(_convert(args[0], v, f"{what}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise WireError(f"{what}: expected an object, got {type(value).__name__}")
        key_type, value_type = typing.get_args(tp)
        return {_convert(key_type, k, f"{what} key"): _convert(value_type, v, f"{what}[{k!r}]")
                for k, v in value.items()}
    if origin is Literal:
        if value not in typing.get_args(tp) or not isinstance(value, str):
            raise WireError(f"{what} is {_shown(value)}, not one of {', '.join(typing.get_args(tp))}")
        return value
    if tp is int:
        return count(value, what)
    if tp is float:
        return finite(value, what)
    if tp is bool:
        if not isinstance(value, bool):
            raise WireError(f"{what} is {_shown(value)}, not true or false")
        return value
    if tp is str and not isinstance(value, str):
        raise WireError(f"{what} is {_shown(value)}, not a string")
    return value


def from_wire(cls: type[V], data: Any, what: str = "") -> V:
    """Rebuild a view of type ``cls`` (nested views and tuples included) from its dict.

    Keys the type does not know are ignored (``Stats`` sends derived ``*_bytes`` figures);
    a missing required key, a non-object or a value of the wrong type (``_convert``: a string,
    a float, a bool, a negative or a NaN where a count belongs) is a ``WireError``.
    """
    if not isinstance(data, dict):
        raise WireError(f"expected an object for {what or cls.__name__}, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for name, tp, required in _field_types(cls):
        if name in data:
            kwargs[name] = _convert(tp, data[name], f"{what}.{name}" if what else name)
        elif required:
            raise WireError(f"{cls.__name__} reply lacks {name!r}")
    return cls(**kwargs)


def capabilities_from_dict(d: dict[str, Any]) -> Capabilities:
    return from_wire(Capabilities, d)


def stats_from_dict(d: dict[str, Any]) -> Stats:
    if isinstance(d, dict) and "available_tokens" not in d and "free_tokens" in d:
        # a radixtop before 0.2 (a fleet may mix versions): its free tokens are the available
        # ones, its protected every unevictable one; the split of those is unknown
        d = {**d, "available_tokens": d["free_tokens"], "protected_tokens": None, "session_held_tokens": None,
             "uncached_tokens": None, "unevictable_tokens": d["protected_tokens"]}
    return from_wire(Stats, d)


def children_page_from_dict(d: dict[str, Any]) -> ChildrenPage:
    return from_wire(ChildrenPage, d)


def subtree_from_dict(d: dict[str, Any]) -> SubtreeView:
    return from_wire(SubtreeView, d)


def chain_from_dict(d: dict[str, Any]) -> ChainView:
    return from_wire(ChainView, d)


def paths_from_dict(d: dict[str, Any]) -> PathsView:
    return from_wire(PathsView, d)


def node_detail_from_dict(d: dict[str, Any]) -> NodeDetail:
    return from_wire(NodeDetail, d)


def sessions_page_from_dict(d: dict[str, Any]) -> SessionsPage:
    return from_wire(SessionsPage, d)


def session_detail_from_dict(d: dict[str, Any]) -> SessionDetail:
    return from_wire(SessionDetail, d)


def match_from_dict(d: dict[str, Any]) -> MatchView:
    view = from_wire(MatchView, d)
    if view.matched_tokens > view.query_tokens or view.partial_tokens > view.matched_tokens:
        raise WireError(f"{view.matched_tokens} of {view.query_tokens} tokens matched "
                        f"({view.partial_tokens} of them in a partial node): not a match")
    return view


def why_from_dict(d: dict[str, Any]) -> WhyView:
    view = from_wire(WhyView, d)
    if view.cached_tokens > view.query_tokens or view.diverges_at != view.cached_tokens:
        raise WireError(f"{view.cached_tokens} of {view.query_tokens} tokens cached, diverging at "
                        f"{view.diverges_at}: not an answer")
    at = view.cached_tokens
    for lost in view.lost:
        if not at <= lost.start < lost.end <= view.query_tokens:
            raise WireError(f"tokens {lost.start}-{lost.end} lost, after {at} of {view.query_tokens}: not in order")
        at = lost.end
    return view


def session_why_from_dict(d: dict[str, Any], session_id: str | None = None) -> SessionWhyView:
    view = from_wire(SessionWhyView, d)
    if session_id is not None and view.session_id != session_id:
        raise WireError(f"asked for session {session_id!r}, answered for {view.session_id!r}")
    if view.requests is not None:
        if view.requests_kept is None or len(view.requests) > view.requests_kept:
            raise WireError(f"{len(view.requests)} requests shown of {view.requests_kept} kept: not an answer")
        for r in view.requests:
            if r.cached_tokens > r.prompt_tokens:
                raise WireError(f"a request of {r.prompt_tokens} tokens with {r.cached_tokens} cached: not an answer")
    if set(view.lost_tokens) - set(CAUSES):
        raise WireError(f"lost tokens by unknown causes: {sorted(view.lost_tokens)}")
    for loss in view.lost:
        if loss.tokens < loss.nodes or loss.nodes < 1 or loss.tokens > view.lost_tokens.get(loss.cause, 0):
            raise WireError(f"a loss of {loss.tokens} tokens in {loss.nodes} nodes: not an answer")
    return view


def history_page_from_dict(d: dict[str, Any], after: int, served_after: int) -> HistoryPage:
    """A page of the journal, its numbers checked: in order, from past the reader's place, within
    the count."""
    view = from_wire(HistoryPage, d)
    for what, items, first, count, place in (("removed", view.removed, view.removed_first, view.removed_count, after),
                                             ("served", view.served or (), view.served_first, view.served_count,
                                              served_after)):
        seqs = [item.seq for item in items]
        if seqs != list(range(first, first + len(seqs))) or (seqs and (first <= place or seqs[-1] > count)):
            raise WireError(f"{what} numbered {seqs[:1]}..{seqs[-1:]} after {place} of {count}: not a page")
    return view


def then_from_dict(d: dict[str, Any]) -> ThenView:
    """The tree at a moment, its figures checked: then = now - stored since + left since, the causes
    known and summing to what left, no branch larger than its side."""
    view = from_wire(ThenView, d)
    if view.tokens_then != view.tokens_now - view.stored_tokens + view.left_tokens or min(
            view.tokens_then, view.left_tokens, view.stored_tokens) < 0:
        raise WireError(f"{view.tokens_then} tokens then, {view.tokens_now} now, {view.stored_tokens} stored and "
                        f"{view.left_tokens} left since: they do not add up")
    if set(view.left_by_cause) - set(CAUSES) or sum(view.left_by_cause.values()) != view.left_tokens:
        raise WireError(f"left since by {sorted(view.left_by_cause)}: not {view.left_tokens} tokens by known causes")
    for side, branches, count, tokens in (("left", view.left, view.left_branches, view.left_tokens),
                                          ("stored", view.stored, view.stored_branches, view.stored_tokens)):
        if len(branches) > count or sum(b.tokens for b in branches) > tokens or any(
                b.nodes < 1 or b.tokens < b.nodes or b.last_at < b.first_at for b in branches):
            raise WireError(f"{len(branches)} {side} branches of {count}, {tokens} tokens: not an answer")
    if view.sessions is not None and (
            view.sessions_active is None or view.sessions_open is None or view.sessions_since is None
            or len(view.sessions) > view.sessions_active
            or view.sessions_open > view.sessions_active
            or any(x.cached_tokens > x.prompt_tokens or x.last_cached_tokens > x.last_prompt_tokens
                   or x.last_at >= moment_end(view.at) for x in view.sessions)):  # (told as of its ms's end)
        raise WireError(f"{len(view.sessions)} sessions then of {view.sessions_active} ({view.sessions_open} open), "
                        "hits over prompts or ops after the moment: not an answer")
    if view.memory is None:
        if view.memory_sessions is not None:
            raise WireError(f"{view.memory_sessions} sessions' memory then, and none told: not an answer")
    elif (view.memory_sessions is None or len(view.memory) > view.memory_sessions
            or view.memory_since is None or view.memory_since > view.at
            or len({x.session_id for x in view.memory}) != len(view.memory)
            or any(not (x.tagged_nodes or x.exclusive_tokens or x.shared_tokens) for x in view.memory)):
        raise WireError(f"{len(view.memory)} sessions' memory then of {view.memory_sessions} (known since "
                        f"{view.memory_since}), twice one, or one that held nothing then: not an answer")
    return view


def changes_from_dict(d: dict[str, Any]) -> Changes:
    return from_wire(Changes, d)


def close_plan_from_dict(d: dict[str, Any]) -> ClosePlanView:
    return from_wire(ClosePlanView, d)


def close_result_from_dict(d: dict[str, Any]) -> CloseResultView:
    return from_wire(CloseResultView, d)


def evict_result_from_dict(d: dict[str, Any]) -> EvictResultView:
    return from_wire(EvictResultView, d)


def flush_result_from_dict(d: dict[str, Any]) -> FlushResultView:
    return from_wire(FlushResultView, d)


def diagnosis_from_dict(d: dict[str, Any]) -> Diagnosis:
    return from_wire(Diagnosis, d)


def audit_entry_from_dict(d: dict[str, Any]) -> AuditEntry:
    return from_wire(AuditEntry, d)


def export_row_from_dict(d: dict[str, Any]) -> dict[str, Any]:
    """An export line as the in-process adapter yields it (``holders`` back to a tuple)."""
    if "holders" in d and isinstance(d["holders"], list):
        d["holders"] = tuple(d["holders"])
    return d


# ----- errors -----


MAX_MESSAGE = 1000


def json_default(value: Any) -> Any:
    """What orjson does not know in a view or an answer (it encodes the dataclasses itself)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "item"):  # a numpy or torch scalar from an adapter
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def error_body(code: str, message: str) -> dict[str, Any]:
    """The error body; a message over MAX_MESSAGE characters (one naming a 10 kB session id) keeps
    its start and its end, which says what went wrong."""
    if len(message) > MAX_MESSAGE:
        message = f"{message[:700]} ... {message[-(MAX_MESSAGE - 705):]}"
    return {"error": {"code": code, "message": message}}


def error_to_body(exc: AdapterError) -> dict[str, Any]:
    return error_body(exc.code, exc.message)


def error_from_body(status: int, body: Any) -> AdapterError:
    """The typed error an error reply stands for (by its code; by its status if the code is
    not an adapter error's)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return WireError(f"HTTP {status} without an error body")
    code, message = error.get("code"), error["message"]
    cls = ERRORS_BY_CODE.get(code) if isinstance(code, str) else None
    if cls is not None:
        return cls(message)
    if status == 401:
        return Unauthorized(message)
    if status in (400, 413, 422):
        return BadRequest(message)
    return AdapterError(f"HTTP {status}: {message}")


# ----- the columnar export: a JSON header line, then raw little-endian int64 columns, then the
# holders as JSON; encoding costs a memory copy per column, not a line per node -----


def encode_export_columns(export: Any) -> Iterator[bytes]:
    import sys
    from array import array

    from radixtop.adapters.model import EXPORT_COLUMNS, ROOT_ID

    holders = json.dumps({str(k): list(v) for k, v in export.holders.items()}, separators=(",", ":")).encode()
    header = {"version": export.version, "bytes_per_token": export.bytes_per_token,
              "node_count": export.node_count, "root_id": ROOT_ID, "columns": list(EXPORT_COLUMNS),
              "dtype": "<i8", "holders_bytes": len(holders)}
    yield json.dumps(header, separators=(",", ":")).encode() + b"\n"
    for name in EXPORT_COLUMNS:
        column = export.columns[name]
        if not isinstance(column, array) or column.typecode != "q":
            column = array("q", column)
        if sys.byteorder != "little":
            column = array("q", column)
            column.byteswap()
        yield column.tobytes()
    yield holders


def decode_export_columns(body: bytes) -> Any:
    """Rebuild ExportColumns from ``encode_export_columns``'s bytes; raises WireError."""
    import sys
    from array import array

    from radixtop.adapters.model import EXPORT_COLUMNS, ExportColumns

    end = body.find(b"\n")
    if end < 0:
        raise WireError("the columnar export has no header line")
    header = json.loads(body[:end])
    if not isinstance(header, dict):
        raise WireError("the columnar export's header is not an object")
    for name in ("node_count", "holders_bytes", "version", "bytes_per_token"):
        count(header.get(name), f"the columnar export's {name}")
    n = header["node_count"]
    if header.get("dtype") != "<i8" or header.get("columns") != list(EXPORT_COLUMNS):
        raise WireError(f"unknown columnar export layout: {header.get('columns')} {header.get('dtype')}")
    offset = end + 1
    columns = {}
    for name in EXPORT_COLUMNS:
        column = array("q")
        column.frombytes(body[offset : offset + 8 * n])
        if len(column) != n:
            raise WireError(f"the columnar export ended inside column {name!r}")
        if sys.byteorder != "little":
            column.byteswap()
        columns[name] = column
        offset += 8 * n
    raw = body[offset : offset + header["holders_bytes"]]
    if len(raw) != header["holders_bytes"]:
        raise WireError("the columnar export ended inside the holders")
    holders = {int(k): tuple(v) for k, v in json.loads(raw).items()}
    return ExportColumns(header["version"], header["bytes_per_token"], columns, holders)
