"""The admin API's parameters as the contract's arguments, parsed in one place for server and client.

Node ids, token lists, flags, and ``GET /v1/read``'s reads: several in one request
(``CacheAdapter.read_many``), which is how a dashboard polls.

``reads`` is a JSON list; each item names a read (``op``) and takes the same parameters, with
the same bounds and defaults, as that read's own route::

    [{"op": "stats"}, {"op": "changes", "since": 41},
     {"op": "children", "node_id": "root", "limit": 100}, {"op": "node", "node_id": 7}]

The answer lists, in order, ``{"ok": <what the route answers>}`` or ``{"error": {...},
"status": <what the route would have answered>}``: one unknown node does not fail the others.
A malformed list fails as a whole (422), as does the target itself (503, 504).
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

import orjson

from radixtop.adapters.base import (
    CHILD_ORDERS,
    MAX_CHAIN,
    MAX_CONTAINS,
    MAX_DEPTH,
    MAX_MATCH_TOKENS,
    MAX_PAGE,
    MAX_PATHS,
    MAX_READS,
    READ_PARAMS,
    SESSION_ORDERS,
    Read,
)
from radixtop.adapters.errors import AdapterError, BadRequest
from radixtop.adapters.http.wire import PayloadTooLarge, error_to_body
from radixtop.adapters.model import ROOT_ID

MAX_ID = 2**63 - 1
"""The largest id or offset the API takes: a signed 64-bit integer's."""
DIGITS = re.compile(r"[0-9]{1,19}")
"""A node or token id as text: ASCII digits only (int() would also take '٣'), at most 19 of them."""
TRUE = frozenset({"1", "true", "yes", "on"})
"""What ``parse_bool`` reads as true (any case, spaces around)."""
FALSE = frozenset({"0", "false", "no", "off", ""})
"""What it reads as false (an empty value too); anything else is a BadRequest."""


def parse_node_id(raw: str) -> int:
    """``root`` or a non-negative integer (ASCII digits, below 2**63)."""
    if raw == "root":
        return ROOT_ID
    if DIGITS.fullmatch(raw) is None or int(raw) > MAX_ID:
        raise BadRequest(f"node id must be 'root' or a non-negative integer, got {raw[:40]!r}")
    return int(raw)


def parse_tokens(raw: str) -> list[int]:
    """Comma-separated non-negative token ids; at most MAX_MATCH_TOKENS of them."""
    if not raw.strip():
        return []
    if raw.count(",") >= MAX_MATCH_TOKENS:
        raise PayloadTooLarge(f"at most {MAX_MATCH_TOKENS} tokens in a match")
    tokens = []
    for part in raw.split(","):
        part = part.strip()
        if DIGITS.fullmatch(part) is None or int(part) > MAX_ID:
            raise BadRequest(f"tokens must be comma-separated non-negative integers, got {part[:40]!r}")
        tokens.append(int(part))
    return tokens


def parse_node_ids(raw: str) -> list[int]:
    """Comma-separated node ids (``root`` or non-negative integers); 1 to MAX_PATHS of them."""
    parts = raw.split(",")
    if len(parts) > MAX_PATHS or not raw.strip():
        raise BadRequest(f"node_ids must be 1 to {MAX_PATHS} comma-separated node ids")
    return [parse_node_id(part.strip()) for part in parts]


def parse_bool(name: str, raw: str | None) -> bool:
    """A flag's text (TRUE or FALSE; absent is false), or BadRequest naming ``name``."""
    value = (raw or "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise BadRequest(f"{name} must be true or false, got {raw[:40]!r}")


def _int(low: int, high: int):
    def parse(where: str, value: Any) -> int:
        if type(value) is not int or not low <= value <= high:  # bool is not an int here
            raise BadRequest(f"{where} must be an integer from {low} to {high}, got {_show(value)}")
        return value
    return parse


def _choice(choices: tuple[str, ...]):
    def parse(where: str, value: Any) -> str:
        if value not in choices:
            raise BadRequest(f"{where} must be one of {', '.join(choices)}, got {_show(value)}")
        return value
    return parse


def _node_id(where: str, value: Any) -> int:
    if type(value) is int and 0 <= value <= MAX_ID:
        return value
    if isinstance(value, str):
        try:
            return parse_node_id(value)
        except BadRequest:
            pass
    raise BadRequest(f"{where} must be 'root' or a node id (an integer from 0 to {MAX_ID}), got {_show(value)}")


def _bool(where: str, value: Any) -> bool:
    if type(value) is not bool:
        raise BadRequest(f"{where} must be true or false, got {_show(value)}")
    return value


def _contains(where: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_CONTAINS:
        raise BadRequest(f"{where} must be text of at most {MAX_CONTAINS} characters, got {_show(value)}")
    return value


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, got {_show(value)}")
    return value


def _tokens(where: str, value: Any) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_MATCH_TOKENS or not all(
            type(t) is int and 0 <= t <= MAX_ID for t in value):
        raise BadRequest(f"{where} must be a list of at most {MAX_MATCH_TOKENS} token ids "
                         f"(integers from 0 to {MAX_ID}), got {_show(value)}")
    return value


def _node_ids(where: str, value: Any) -> list[int]:
    if isinstance(value, list) and 1 <= len(value) <= MAX_PATHS:
        try:
            return [_node_id(where, v) for v in value]
        except BadRequest:
            pass
    raise BadRequest(f"{where} must be a list of 1 to {MAX_PATHS} node ids ('root' or integers from 0 to "
                     f"{MAX_ID}), got {_show(value)}")


_REQUIRED = object()
_PAGE_LIMIT = _int(1, MAX_PAGE)
# op -> parameter -> (parser, default); the parameters in READ_PARAMS's order
_SPECS: dict[str, dict[str, tuple[Any, Any]]] = {
    "capabilities": {},
    "stats": {},
    "children": {"node_id": (_node_id, _REQUIRED), "offset": (_int(0, MAX_ID), 0),
                 "limit": (_PAGE_LIMIT, 100), "order": (_choice(CHILD_ORDERS), "bytes")},
    "chain": {"node_id": (_node_id, _REQUIRED), "limit": (_int(1, MAX_CHAIN), 10_000)},
    "subtree": {"node_id": (_node_id, _REQUIRED), "depth": (_int(1, MAX_DEPTH), 3),
                "limit": (_PAGE_LIMIT, 10), "order": (_choice(CHILD_ORDERS), "bytes"),
                "min_bytes": (_int(0, MAX_ID), 0)},
    "node": {"node_id": (_node_id, _REQUIRED), "token_offset": (_int(0, MAX_ID), 0),
             "token_limit": (_PAGE_LIMIT, 256)},
    "sessions": {"order": (_choice(SESSION_ORDERS), "exclusive_bytes"), "offset": (_int(0, MAX_ID), 0),
                 "limit": (_PAGE_LIMIT, 100), "contains": (_contains, ""), "reverse": (_bool, False)},
    "session": {"session_id": (_text, _REQUIRED)},
    "match": {"tokens": (_tokens, _REQUIRED)},
    "paths": {"node_ids": (_node_ids, _REQUIRED)},
    "changes": {"since": (_int(0, MAX_ID), _REQUIRED)},
}
assert {op: tuple(spec) for op, spec in _SPECS.items()} == READ_PARAMS


_SHOW = reprlib.Repr()  # (Python 3.11's takes no arguments)
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 2, 30, 30, 4, 4


def _show(value: Any) -> str:
    """A short repr of what was sent, however deep or long it is."""
    return _SHOW.repr(value)[:60]


def parse_reads(raw: str) -> list[Read]:
    """The ``reads`` parameter as the contract's reads, or BadRequest naming what is wrong."""
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest('reads must be a JSON list, such as [{"op": "stats"}]') from None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_READS:
        raise BadRequest(f'reads must be a JSON list of 1 to {MAX_READS} reads, such as [{{"op": "stats"}}]')
    return [parse_read(i, item) for i, item in enumerate(items)]


def parse_read(i: int, item: Any) -> Read:
    """Item ``i`` of the list: a read and its arguments in READ_PARAMS's order, or BadRequest."""
    if not isinstance(item, dict):
        raise BadRequest(f'read {i} must be an object such as {{"op": "stats"}}, got {_show(item)}')
    op = item.get("op")
    spec = _SPECS.get(op) if isinstance(op, str) else None
    if spec is None:
        raise BadRequest(f"read {i}: op must be one of {', '.join(_SPECS)}, got {_show(op)}")
    unknown = sorted(set(item) - {"op", *spec})
    if unknown:
        raise BadRequest(f"read {i} ({op}): unknown parameter {unknown[0][:40]!r}; "
                         f"it takes {', '.join(spec) or 'none'}")
    args = []
    for name, (parse, default) in spec.items():
        if name in item:
            args.append(parse(f"read {i} ({op}): {name}", item[name]))
        elif default is _REQUIRED:
            raise BadRequest(f"read {i} ({op}): {name} is required")
        else:
            args.append(default)
    return op, tuple(args)


def encode_results(reads: list[Read], results: list[Any]) -> dict[str, Any]:
    """``read_many``'s results as the route answers them (views as their routes send them)."""
    out: list[dict[str, Any]] = []
    for (op, _), result in zip(reads, results, strict=True):
        if isinstance(result, AdapterError):
            out.append({**error_to_body(result), "status": result.http_status})
        else:
            out.append({"ok": result.to_dict() if op == "stats" else result})  # stats: with bytes
    return {"results": out}
