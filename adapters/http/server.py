"""The admin API's HTTP server: ``create_app(adapter, token, audit)`` and ``serve`` to run it."""

from __future__ import annotations

import json
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import orjson
from anyio.lowlevel import RunVar
from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from radixtop.adapters.base import (
    CHILD_ORDERS,
    MAX_CHAIN,
    MAX_CONTAINS,
    MAX_DEPTH,
    MAX_MATCH_TOKENS,
    MAX_PAGE,
    MAX_READS,
    READ_PARAMS,
    SESSION_ORDERS,
    CacheAdapter,
)
from radixtop.adapters.doctor import IDLE_AFTER_S
from radixtop.adapters.errors import (
    AdapterError,
    BadRequest,
    TargetTimeout,
    TargetUnreachable,
    Unauthorized,
    Unsupported,
)
from radixtop.adapters.http.audit import AuditLog, AuditUnavailable, Pending
from radixtop.adapters.http.edge import (
    MAX_HEAVY_READS,
    Admission,
    Bind,
    Tokens,
    check_token_strength,
    is_loopback,
)
from radixtop.adapters.http.metrics import metrics_registry, render_metrics
from radixtop.adapters.http.protocol import MAX_URL, PayloadTooLarge, http_protocol, url_too_long
from radixtop.adapters.http.reads import _DIGITS, MAX_ID, encode_results, parse_node_id, parse_reads
from radixtop.adapters.http.schemas import (
    AuditPageOut,
    CapabilitiesOut,
    ChainOut,
    ChangesOut,
    ChildrenPageOut,
    CloseOut,
    ClosePlanOut,
    DiagnosisOut,
    ErrorOut,
    EvictIn,
    EvictOut,
    FlushOut,
    HealthOut,
    MatchOut,
    NodeDetailOut,
    PathsOut,
    ReadOut,
    SessionDetailOut,
    SessionsPageOut,
    StatsOut,
    SubtreeOut,
)
from radixtop.adapters.http.wire import (
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    PAYLOAD_TOO_LARGE,
    WIRE_VERSION,
    encode_export_columns,
    error_body,
    error_to_body,
)
from radixtop.adapters.model import MAX_PATHS, AuditEntry

logger = logging.getLogger(__name__)

T = TypeVar("T")
MAX_BODY = 64 * 1024
EXPORT_CHUNK_ROWS = 1000
NODE_ID_PATTERN = r"^(root|[0-9]{1,19})$"
TOKENS_PATTERN = r"^\s*([0-9]{1,19}\s*(,\s*[0-9]{1,19}\s*)*)?$"
IDS_PATTERN = r"^\s*(root|[0-9]{1,19})\s*(,\s*(root|[0-9]{1,19})\s*)*$"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_STATUS_CODES = {404: NOT_FOUND, 405: METHOD_NOT_ALLOWED, 413: PAYLOAD_TOO_LARGE}


MAX_IDLE_AFTER_S = 10**9
_TARGET_ERRORS = (501, 503, 504)  # what any call to the target can meet: unsupported, unreachable, timeout


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """An operation's documented error answers: its own, and what any request can meet (a Host
    not this server's or a bad percent-encoding: 400; a page of another origin: 403; a URL over
    MAX_URL: 413; a bug: 500). Each with the error body."""
    return {status: {"model": ErrorOut} for status in sorted({*statuses, 400, 403, 413, 500})}


PRIORITY_THREADS = 8
"""Worker threads for actions and health, apart from the reads' (anyio's default 40)."""
_PRIORITY: RunVar[anyio.CapacityLimiter] = RunVar("radixtop_priority_threads")


async def ahead_of_reads(fn: Callable[..., T], *args: Any) -> T:
    """Run an adapter call for an action or /healthz in a thread of their own: never queued behind
    reads that fill the default thread pool while they wait on the cache's owner."""
    try:
        limiter = _PRIORITY.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(PRIORITY_THREADS)
        _PRIORITY.set(limiter)
    return await anyio.to_thread.run_sync(partial(_call, fn, *args), limiter=limiter)


# ----- parameters: bounds and shapes published in the schema, enforced here or by the adapter -----

Offset = Annotated[int, Query(ge=0, le=MAX_ID, description="Rows to skip.")]
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"At most this many rows (1-{MAX_PAGE}).")]
NodeId = Annotated[str, PathParam(description="'root', or a node id (a non-negative integer below 2**63).",
                                  json_schema_extra={"pattern": NODE_ID_PATTERN})]
SessionId = Annotated[str, PathParam(description="A session id: any text, '/' included.")]


class _AnyText(Convertor[str]):
    """A path parameter that takes any text, '/' and line breaks included. Starlette's ``path``
    stops at a line break, so '/v1/sessions/b%0A' was read as session 'b'."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anytext", _AnyText())


def parse_tokens(raw: str) -> list[int]:
    """Comma-separated non-negative token ids; at most MAX_MATCH_TOKENS of them."""
    if not raw.strip():
        return []
    if raw.count(",") >= MAX_MATCH_TOKENS:
        raise PayloadTooLarge(f"at most {MAX_MATCH_TOKENS} tokens in a match")
    tokens = []
    for part in raw.split(","):
        part = part.strip()
        if _DIGITS.fullmatch(part) is None or int(part) > MAX_ID:
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
    value = (raw or "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadRequest(f"{name} must be true or false, got {raw[:40]!r}")


def _encode_default(value: Any) -> Any:
    """What orjson does not know (it encodes the views' dataclasses itself)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "item"):  # a numpy or torch scalar from an adapter
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _json(payload: Any, status: int = 200) -> Response:
    """A JSON response from a view (a dataclass) or plain data. orjson encodes the views' dataclasses
    directly, with no dict built per row: a page of 1000 sessions costs the server (which shares
    the interpreter with the cache's owner where radixtop runs in process) a fraction of what
    ``to_dict`` plus ``json.dumps`` did. The output is the same JSON."""
    body = orjson.dumps(payload, default=_encode_default, option=orjson.OPT_NON_STR_KEYS)
    return Response(body, status_code=status, media_type="application/json")


def _error_response(exc: AdapterError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    return JSONResponse(error_to_body(exc), status_code=exc.http_status, headers=headers)


def _short(text: str, keep: int = 200) -> str:
    """A target as the server log shows it: a 64 KB session id is cut."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def _internal(exc: BaseException) -> AdapterError:
    logger.error("admin API request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return AdapterError("internal error (details are in the server log)")


def _call(fn: Callable[..., T], *args: Any) -> T:
    """Run an adapter call; an error that is not a typed one becomes a 500 (logged, not shown)."""
    try:
        return fn(*args)
    except AdapterError:
        raise
    except Exception as exc:
        raise _internal(exc) from None


@dataclass
class _Record:
    """What one action asked and did, filled in as it goes, for the audit entry."""

    plan: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _check_token_text(token: str, what: str = "token") -> None:
    """ValueError unless ``token`` can travel in a header and match there."""
    if not token:
        raise ValueError(f"the admin API needs a non-empty {what}")
    if not (token.isascii() and token.isprintable()) or token != token.strip():
        # Anything else could never match: HTTP clients send header values as ASCII, and the
        # server strips the value it is sent.
        raise ValueError(f"the admin API {what} must be printable ASCII, with no space at either end")


def create_app(adapter: CacheAdapter, token: str, audit: AuditLog, *, host: str = "127.0.0.1",
               read_token: str | None = None, max_heavy_reads: int = MAX_HEAVY_READS,
               fleet: Callable[[], Any] | None = None) -> FastAPI:
    """The admin API over ``adapter``, for a server bound to ``host``.
    Every POST needs ``Authorization: Bearer <token>`` and is audited, allowed or refused; on a
    bind that is not loopback every request but /healthz needs ``token`` or ``read_token`` (which
    only reads); a loopback bind answers to loopback names only. Read-only is the adapter's to
    enforce, not the server's. (``serve`` also refuses a short action token; this factory, used
    by tests, does not.) ``fleet``: where ``GET /v1/fleet`` gets the fleet view it answers (a
    ``FleetPoller.poll``); None: there is no such route."""
    _check_token_text(token)
    if read_token is not None:  # (new, so no test relies on a short one: held to serve's rule here)
        _check_token_text(read_token, "read token")
        check_token_strength(read_token, "read token")
    if read_token is not None and read_token == token:
        raise ValueError("the read token must differ from the action token")
    bind, tokens = Bind(host), Tokens(token, read_token)
    registry = metrics_registry(adapter)
    read_errors = () if bind.loopback else (401,)
    app = FastAPI(
        title="radixtop admin API",
        summary="Read and act on a radix KV cache: stats, tree, sessions, close, evict, flush.",
        version=str(WIRE_VERSION),
        docs_url=None, redoc_url=None,  # their pages load scripts from a public CDN
    )
    app.add_middleware(Admission, bind=bind, tokens=tokens, max_heavy_reads=max_heavy_reads)
    app.add_middleware(_Edge)
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _exact_int_bounds(default_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    # ----- errors at the edge -----

    @app.exception_handler(AdapterError)
    async def on_adapter_error(request: Request, exc: AdapterError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            where = ".".join(str(part) for part in err.get("loc", ()))
            problems.append(f"{where}: {err.get('msg', 'invalid')}" if where else err.get("msg", "invalid"))
        return _json(error_body(BadRequest.code, "; ".join(problems) or "invalid request"), 422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        message, path = str(exc.detail), request.url.path[:100]
        if exc.status_code == 404:
            message = f"no route {path!r} in this API (its routes are listed at /openapi.json)"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {path!r}"
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(_internal(exc))  # a last resort: _Edge answers errors from the routes

    # ----- actions: authorised, then audited whatever happens -----

    async def read_body(request: Request) -> bytes:
        """The whole body, at most MAX_BODY bytes, whether or not the action takes one: an oversized
        body is refused the same way with or without a Content-Length."""
        length = request.headers.get("content-length")
        if length is not None and length.isascii() and length.isdigit() and int(length) > MAX_BODY:
            raise PayloadTooLarge(f"request body over {MAX_BODY} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    raise PayloadTooLarge(f"request body over {MAX_BODY} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # the client's doing, not a server error: audited as refused
            raise BadRequest("the client went away before it sent the whole body") from None
        return b"".join(chunks)

    async def guarded(request: Request, action: str, target: str,
                      work: Callable[[_Record, bytes], Awaitable[Any]], needs_token: bool = True) -> JSONResponse:
        """Run an action's ``work`` and journal it. An authorised action's intent is journaled
        before ``work`` runs (fail closed: if it cannot be, nothing runs and the answer is 503)
        and its outcome after; a refusal, or a dry run, is journaled once, after."""
        record = _Record()
        client = request.client.host if request.client is not None else "unknown"
        refused_token = tokens.action_refusal(request.headers)
        error: AdapterError | None = None
        pending: Pending | None = None
        try:
            if needs_token and refused_token is not None:
                raise refused_token
            if not needs_token and not bind.loopback and (refused := tokens.read_refusal(request.headers)):
                raise refused
            body = await read_body(request)
            if needs_token:
                intent = AuditEntry(time=time.time(), client=client, action=action, target=target, allowed=True)
                try:
                    pending = await ahead_of_reads(audit.begin, intent)
                except AuditUnavailable as exc:
                    raise AuditUnavailable(f"{exc.message}; nothing was done: an action that cannot be "
                                           "audited is not run") from None
            payload = await work(record, body)
        except AdapterError as exc:
            error = exc
        except Exception as exc:
            error = _internal(exc)
        entry = AuditEntry(
            time=time.time(), client=client, action=action, target=target, allowed=error is None,
            plan=record.plan, result=record.result,
            error=None if error is None else f"{error.code}: {error.message}", extra=record.extra,
        )
        # The journal's entry, mirrored in the debug log (ids as repr: a hostile id stays inert).
        logger.debug("action %s %r from %s: %s", action, _short(target), client,
                     "allowed" if error is None else f"refused ({error.code})")
        try:
            if pending is not None:
                await ahead_of_reads(audit.finish, pending, entry)
            elif not isinstance(error, AuditUnavailable):
                await ahead_of_reads(audit.append, entry, refused_token is None)
        except AuditUnavailable as exc:  # the action has run (or was refused): say so in the log
            logger.error("could not journal the outcome of %s %r from %s: %s", action, _short(target),
                         client, exc.message)
        if error is not None:
            return _error_response(error)
        return _json(payload)

    def parse_json(request: Request, body: bytes) -> Any:
        content_type = request.headers.get("content-type")
        if content_type is None or content_type.partition(";")[0].strip().lower() != "application/json":
            sent = "none" if content_type is None else repr(content_type[:60])
            raise BadRequest(f"body must be JSON sent as Content-Type: application/json (got {sent})")
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise BadRequest('body must be JSON, such as {"tokens": 1000}') from None

    def in_thread(fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return ahead_of_reads(fn, *args)

    dry_run_param = {"parameters": [{
        "name": "dry_run", "in": "query", "required": False,
        "schema": {"type": "boolean", "default": False},
        "description": "Return the plan (what a close would free now) and change nothing.",
    }]}

    @app.post("/v1/sessions/{session_id:anytext}/close", response_model=CloseOut | ClosePlanOut,
              summary="Close a session: its plan and result (only the plan with dry_run=true)",
              responses=_errors(401, 403, 404, 422, *_TARGET_ERRORS), openapi_extra=dry_run_param)
    async def close_session(session_id: SessionId, request: Request) -> JSONResponse:
        raw_dry_run = request.query_params.get("dry_run")

        async def work(record: _Record, body: bytes) -> Any:
            if parse_bool("dry_run", raw_dry_run):
                record.plan = (await in_thread(adapter.plan_close, session_id)).to_dict()
                return record.plan
            # One step where the adapter owns its cache's thread: the result is the plan. A target
            # that can close but not preview answers a null plan (its result says what it saw).
            plan, result = await in_thread(adapter.close_session_planned, session_id)
            record.plan = plan.to_dict() if plan is not None else None
            record.result = result.to_dict()
            return {"plan": record.plan, "result": record.result}

        dry_run = (raw_dry_run or "").strip().lower() in _TRUE
        # A dry run is a read (allowed read-only too): it needs no token, and is audited all the same.
        return await guarded(request, "close_dry_run" if dry_run else "close", f"session:{session_id}", work,
                             needs_token=not dry_run)

    @app.post("/v1/evict", response_model=EvictOut, summary="Evict unlocked LRU leaves",
              responses=_errors(401, 403, 422, *_TARGET_ERRORS),
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": EvictIn.model_json_schema()}}}})
    async def evict(request: Request) -> JSONResponse:
        async def work(record: _Record, body: bytes) -> Any:
            try:
                num_tokens = EvictIn.model_validate(parse_json(request, body)).tokens
            except ValidationError as exc:
                raise BadRequest('body must be {"tokens": N} with N >= 0: '
                                 + "; ".join(e["msg"] for e in exc.errors())) from None
            record.extra["requested_tokens"] = num_tokens
            result = await in_thread(adapter.evict, num_tokens)
            record.result = result.to_dict()
            return record.result

        return await guarded(request, "evict", "cache", work)

    @app.post("/v1/flush", response_model=FlushOut, summary="Evict everything that is evictable",
              responses=_errors(401, 403, *_TARGET_ERRORS))
    async def flush(request: Request) -> JSONResponse:
        async def work(record: _Record, body: bytes) -> Any:
            result = await in_thread(adapter.flush)
            record.result = result.to_dict()
            return record.result

        return await guarded(request, "flush", "cache", work)

    # ----- reads -----

    @app.get("/v1/capabilities", response_model=CapabilitiesOut, summary="What this target can do",
             responses=_errors(*read_errors, *_TARGET_ERRORS))
    def capabilities() -> JSONResponse:
        return _json(_call(adapter.capabilities))

    @app.get("/v1/stats", response_model=StatsOut, summary="Cache totals (tokens and bytes)",
             responses=_errors(*read_errors, *_TARGET_ERRORS))
    def stats() -> JSONResponse:
        return _json(_call(adapter.stats).to_dict())  # with its byte figures

    @app.get("/v1/nodes/{node_id}", response_model=NodeDetailOut,
             summary="One node and a page of its token ids ('root' names the root)",
             responses=_errors(*read_errors, 404, 422, *_TARGET_ERRORS))
    def node(node_id: NodeId, token_offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
             token_limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 256) -> JSONResponse:
        return _json(_call(adapter.node, parse_node_id(node_id), token_offset, token_limit))

    @app.get("/v1/nodes/{node_id}/children", response_model=ChildrenPageOut,
             summary="A page of a node's children", responses=_errors(*read_errors, 404, 422, *_TARGET_ERRORS))
    def children(node_id: NodeId, offset: Offset = 0, limit: PageLimit = 100,
                 order: str = Query("bytes", description="bytes, recency or tokens",
                                    json_schema_extra={"enum": list(CHILD_ORDERS)})) -> JSONResponse:
        return _json(_call(adapter.children, parse_node_id(node_id), offset, limit, order))

    @app.get("/v1/nodes/{node_id}/subtree", response_model=SubtreeOut,
             summary="A node and its largest descendants, levels deep, read at one moment",
             responses=_errors(*read_errors, 429, 404, 422, *_TARGET_ERRORS))
    def subtree(node_id: NodeId, depth: Annotated[int, Query(ge=1, le=MAX_DEPTH)] = 3,
                limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 10,
                order: str = Query("bytes", description="bytes, recency or tokens",
                                   json_schema_extra={"enum": list(CHILD_ORDERS)}),
                min_bytes: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> JSONResponse:
        return _json(_call(adapter.subtree, parse_node_id(node_id), depth, limit, order, min_bytes))

    @app.get("/v1/nodes/{node_id}/chain", response_model=ChainOut,
             summary="The run of single children below a node, in one read",
             responses=_errors(*read_errors, 429, 404, 422, *_TARGET_ERRORS))
    def chain(node_id: NodeId, limit: Annotated[int, Query(ge=1, le=MAX_CHAIN)] = 10_000) -> JSONResponse:
        return _json(_call(adapter.chain, parse_node_id(node_id), limit))

    @app.get("/v1/sessions", response_model=SessionsPageOut, summary="A page of sessions",
             responses=_errors(*read_errors, 429, 422, *_TARGET_ERRORS))
    def sessions(order: str = Query("exclusive_bytes",
                                    description=", ".join(SESSION_ORDERS) + " (each biggest, newest or "
                                                "open first; ids A to Z)",
                                    json_schema_extra={"enum": list(SESSION_ORDERS)}),
                 offset: Offset = 0, limit: PageLimit = 100,
                 contains: str = Query("", max_length=MAX_CONTAINS,
                                       description="only sessions whose id contains this (any case), or "
                                                   "whose state it names (open, closed)"),
                 reverse: bool = Query(False, description="the order read from its other end")) -> JSONResponse:
        return _json(_call(adapter.sessions, order, offset, limit, contains, reverse))

    @app.get("/v1/sessions/{session_id:anytext}", response_model=SessionDetailOut,
             summary="One session and the nodes it holds",
             responses=_errors(*read_errors, 429, 404, 422, *_TARGET_ERRORS))
    def session(session_id: SessionId) -> JSONResponse:
        return _json(_call(adapter.session, session_id))

    @app.get("/v1/match", response_model=MatchOut,
             summary="Longest cached prefix of a token list (read-only)",
             responses=_errors(*read_errors, 429, 422, *_TARGET_ERRORS))
    def match(tokens: str = Query("", description="comma-separated token ids, e.g. 1,2,3",
                                  json_schema_extra={"pattern": TOKENS_PATTERN})) -> JSONResponse:
        return _json(_call(adapter.match, parse_tokens(tokens)))

    @app.get("/v1/paths", response_model=PathsOut,
             summary="The paths from the root to a set of nodes, read at one moment",
             responses=_errors(*read_errors, 422, *_TARGET_ERRORS))
    def paths(node_ids: str = Query(description=f"1 to {MAX_PATHS} comma-separated node ids, e.g. 7,12",
                                    json_schema_extra={"pattern": IDS_PATTERN})) -> JSONResponse:
        return _json(_call(adapter.paths, parse_node_ids(node_ids)))

    @app.get("/v1/changes", response_model=ChangesOut, summary="Node ids changed since a version",
             responses=_errors(*read_errors, 422, *_TARGET_ERRORS))
    def changes(since: Annotated[int, Query(ge=0, le=MAX_ID)]) -> JSONResponse:
        return _json(_call(adapter.changes, since))

    @app.get("/v1/doctor", response_model=DiagnosisOut,
             summary="The leak doctor: memory nobody can use now, what it means, and what frees it",
             responses=_errors(*read_errors, 429, 422, *_TARGET_ERRORS))
    def doctor(idle_after_s: Annotated[float, Query(ge=0, le=MAX_IDLE_AFTER_S, description=(
            "a session unused this many seconds that still holds memory is a finding"))] = IDLE_AFTER_S) -> JSONResponse:
        return _json(_call(adapter.diagnose, idle_after_s).to_dict())

    @app.get("/v1/read", response_model=ReadOut,
             summary="Several reads in one request (how a dashboard polls)",
             description="``reads``: a JSON list of reads, each ``op`` plus that read's own route's "
                         "parameters, such as ``[{\"op\": \"stats\"}, {\"op\": \"children\", "
                         "\"node_id\": \"root\"}]``. Ops: " + ", ".join(READ_PARAMS) + ". Answers each "
                         "read's result (``ok``) or error (``error``, ``status``) in order; an adapter "
                         "that owns its cache's thread reads them all in one step of it.",
             responses=_errors(*read_errors, 429, 422, *_TARGET_ERRORS))
    def read(reads: str = Query(description=f"A JSON list of 1 to {MAX_READS} reads.",
                                max_length=MAX_URL)) -> JSONResponse:
        parsed = parse_reads(reads)
        return _json(encode_results(parsed, _call(adapter.read_many, parsed)))

    @app.get("/v1/export", summary="The whole tree as NDJSON: a header line, then one line per node",
             response_class=StreamingResponse, responses={**_errors(*read_errors, 429, 422, *_TARGET_ERRORS), 200: {
                 "description": "ndjson: a JSON header line, then one JSON line per node; columns: a JSON "
                                "header line, then raw little-endian int64 columns, then the holders as JSON",
                 "content": {"application/x-ndjson": {"schema": {"type": "string"}},
                             "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    def export(format: str = Query("ndjson", pattern="^(ndjson|columns)$",
                                   description="ndjson: a line per node; columns: raw int64 columns")) -> StreamingResponse:
        if format == "columns":
            try:
                columns = adapter.export_columns()
            except NotImplementedError:
                raise Unsupported(f"{adapter.name} cannot export its tree") from None
            except AdapterError:
                raise
            except Exception as exc:
                raise _internal(exc) from None
            return StreamingResponse(encode_export_columns(columns), media_type="application/octet-stream")
        try:
            chunks = iter(adapter.export_ndjson())
            header = next(chunks)  # takes the snapshot here, so a failure is still a status code
        except NotImplementedError:
            raise Unsupported(f"{adapter.name} cannot export its tree") from None
        except AdapterError:
            raise
        except Exception as exc:
            raise _internal(exc) from None
        return StreamingResponse(_ndjson(header, chunks), media_type="application/x-ndjson")

    @app.get("/v1/audit", response_model=AuditPageOut, summary="Audited actions, newest first",
             responses=_errors(*read_errors, 422))
    def audit_page(limit: PageLimit = 100, offset: Offset = 0) -> JSONResponse:
        entries = _call(audit.tail, limit, offset)
        return _json({"offset": offset, "limit": limit, "entries": entries})

    @app.get("/healthz", response_model=HealthOut, summary="Whether the target answers",
             responses=_errors(503))
    async def healthz() -> JSONResponse:
        try:
            st = await ahead_of_reads(adapter.stats)
        except (TargetUnreachable, TargetTimeout) as exc:
            return _json(error_to_body(exc), 503)
        read_only = (await ahead_of_reads(adapter.capabilities)).read_only
        return _json({"status": "ok", "target": st.target, "version": st.version, "read_only": read_only})

    @app.get("/metrics", summary="Prometheus metrics (read from the target at scrape time)",
             response_class=Response, responses={**_errors(*read_errors, 503, 504), 200: {
                 "description": "The Prometheus text exposition format",
                 "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        content, media_type = _call(render_metrics, registry)
        return Response(content, media_type=media_type)

    # ----- the fleet: other workers' caches, aggregated (radixtop serve --fleet; no route without) -----

    if fleet is not None:
        @app.get("/v1/fleet", summary="Every worker and DP rank of the fleet this server watches (a poll "
                 "at most a second old, or the last one at once while a poll runs); from Dynamo, the prefixes "
                 "cached twice",
                 responses=_errors(*read_errors))
        def fleet_view() -> JSONResponse:
            return _json(_call(fleet).to_dict())

    return app


class _Edge:
    """The app's outer layer: refuses a URL over MAX_URL with 413 (whatever server runs the app), and
    answers an unexpected error with the 500 error body itself. Starlette's error middleware would
    answer too, but then re-raise to the server, which drops the keep-alive connection: a client's
    next, unrelated request failed with a connection reset."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _url_length(scope) > MAX_URL:
            await _error_response(url_too_long())(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            if started:  # too late for a status code: the server closes the connection
                raise
            await _error_response(_internal(exc))(scope, receive, send)


def _url_length(scope: Scope) -> int:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return len(path) + (1 + len(query) if query else 0)


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_int_bounds(node: Any) -> None:
    """FastAPI's OpenAPI model holds numeric bounds as floats, so 2**63-1 was published as
    9.223372036854776e18 (that is 2**63, a value the server refuses). Restore integer bounds."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _BOUNDS and isinstance(value, float) and value.is_integer():
                node[key] = MAX_ID if value == float(MAX_ID) else int(value)
            else:
                _exact_int_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _exact_int_bounds(item)


def _ndjson(header: str, chunks: Iterator[str]) -> Iterator[str]:
    """The header line, then the adapter's chunks; memory bounded by a chunk, not the tree."""
    yield header
    try:
        yield from chunks
    except Exception as exc:  # headers are sent: the client sees fewer rows than node_count
        logger.error("export stopped early: %s: %s", type(exc).__name__, exc)


# ----- running it -----


def serve(adapter: CacheAdapter, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          audit_path: Path | str | None = None, log: Callable[[str], Any] = print,
          read_token: str | None = None, fleet: Callable[[], Any] | None = None) -> None:
    """Run the admin API until interrupted (Ctrl-C returns normally). Without a token it listens
    on loopback only and makes one up, printed once here (nowhere else); a token given must be
    at least MIN_TOKEN_LENGTH characters, and so must ``read_token`` (reads on a bind that is not
    loopback need either). A bad token or audit log path raises ValueError and a port that cannot
    be bound OSError, before anything is printed."""
    if token is None and not is_loopback(host):
        raise ValueError(f"refusing to serve the admin API on {host!r} without an explicit token: "
                         "it can close sessions and evict; pass a token, or use 127.0.0.1")
    generated = token is None
    if token is None:
        token = secrets.token_urlsafe(24)
    for value, what in ((token, "token"), (read_token, "read token")):
        if value is not None:
            _check_token_text(value, what)
            check_token_strength(value, what)
    import uvicorn

    audit = AuditLog(audit_path)
    try:
        app = create_app(adapter, token, audit, host=host, read_token=read_token, fleet=fleet)
        sock = _bind(host, port)
        shown = f"[{host}]" if ":" in host else host
        log(f"radixtop admin API for {adapter.name} on http://{shown}:{port}"
            + (f" (audit log: {audit_path})" if audit_path is not None else ""))
        if generated:
            log(f"API token (send as 'Authorization: Bearer <token>'): {token}")
        config = uvicorn.Config(app, http=http_protocol(), log_level="warning", access_log=False)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except KeyboardInterrupt:
            pass  # uvicorn has shut down cleanly; Ctrl-C is how a server is meant to stop
        finally:
            sock.close()
    finally:
        audit.close()


def _bind(host: str, port: int) -> socket.socket:
    """A bound socket, so that a port in use is an OSError here rather than an exit in uvicorn."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
