"""The admin API's reads: a router of its GET routes over the adapter, and one of ``/v1/fleet``.

On a bind that is not loopback ``Admission`` lets a read through with either token (/healthz with
none) before any route runs: an unknown route, /openapi.json and the heavy reads' slots included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixtop.adapters.base import (
    CHILD_ORDERS,
    MAX_CHAIN,
    MAX_CONTAINS,
    MAX_DEPTH,
    MAX_HISTORY_PAGE,
    MAX_PAGE,
    MAX_PATHS,
    MAX_READS,
    READ_PARAMS,
    SESSION_ORDERS,
)
from radixtop.adapters.doctor import IDLE_AFTER_S
from radixtop.adapters.errors import BadRequest, TargetTimeout, TargetUnreachable
from radixtop.adapters.http.params import (
    MAX_ID,
    encode_results,
    parse_node_id,
    parse_node_ids,
    parse_reads,
    parse_tokens,
)
from radixtop.adapters.http.schemas import (
    AuditPageOut,
    CapabilitiesOut,
    ChainOut,
    ChangesOut,
    ChildrenPageOut,
    DiagnosisOut,
    EncodeOut,
    HealthOut,
    HistoryPageOut,
    MatchOut,
    NodeDetailOut,
    PathsOut,
    ReadOut,
    SessionDetailOut,
    SessionsPageOut,
    SessionWhyOut,
    StatsOut,
    SubtreeOut,
    ThenOut,
    WhyOut,
)
from radixtop.adapters.http.server.answers import ahead_of_reads, call, json_response, logger
from radixtop.adapters.http.server.deps import Adapter, Journal, Served, SessionId, State
from radixtop.adapters.http.server.edge import CHALLENGE_HEADER, MAX_CHALLENGE, PROOF_HEADER
from radixtop.adapters.http.server.errors import TARGET_ERRORS, documented
from radixtop.adapters.http.server.metrics import render_metrics
from radixtop.adapters.http.server.protocol import MAX_URL
from radixtop.adapters.http.wire import encode_export_columns, error_to_body
from radixtop.adapters.model import Capabilities

EXPORT_CHUNK_ROWS = 1000
"""A size the export tests span; the server passes none: adapters chunk by ``export_ndjson``'s default."""
MAX_BLOCK_ID = 2**64 - 1
"""The largest id a node of the tree then has: on a KV-event stream, a block's (its hash as 64 bits)."""
MAX_IDLE_AFTER_S = 10**9
"""The doctor's largest ``idle_after_s``: finite, so that the schema publishes a bound."""
NODE_ID_PATTERN = r"^(root|[0-9]{1,19})$"
"""A node id as the schema publishes it (``params.parse_node_id`` also holds it below 2**63)."""
TOKENS_PATTERN = r"^\s*([0-9]{1,19}\s*(,\s*[0-9]{1,19}\s*)*)?$"
"""A match's token list as the schema publishes it (``params.parse_tokens`` enforces it)."""
IDS_PATTERN = r"^\s*(root|[0-9]{1,19})\s*(,\s*(root|[0-9]{1,19})\s*)*$"
"""A list of node ids as the schema publishes it (``params.parse_node_ids`` enforces it)."""

# The reads' parameters: bounds and shapes published in the schema, enforced here or by the adapter.
Offset = Annotated[int, Query(ge=0, le=MAX_ID, description="Rows to skip.")]
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"At most this many rows (1-{MAX_PAGE}).")]
NodeId = Annotated[str, PathParam(description="'root', or a node id (a non-negative integer below 2**63).",
                                  json_schema_extra={"pattern": NODE_ID_PATTERN})]

MAX_ENCODE_CHARS = 16_000
"""The longest text ``/v1/encode`` takes (its token ids must fit a match's URL)."""

router = APIRouter()
"""Every read but the fleet's."""
fleet = APIRouter()
"""``/v1/fleet``, in an app given a fleet to watch (``radixtop serve --fleet``) only."""


@router.get("/v1/capabilities", response_model=CapabilitiesOut,
            summary="What this target can do", responses=documented(*TARGET_ERRORS))
def capabilities(adapter: Adapter, state: State, request: Request) -> Response:
    return json_response(for_token(call(adapter.capabilities), state, request))


def for_token(caps: Capabilities, state: Served, request: Request) -> Capabilities:
    """``caps`` as they are for the request's token: read-only, and why, where the server would
    refuse its every action (no token, the read-only token, a wrong one that a loopback bind
    lets read), so a face hides the actions before anyone confirms one. A target that is
    read-only itself says its own reason, whatever the token."""
    why = "" if caps.read_only else state.tokens.why_not_act(request.headers)
    return replace(caps, read_only=True, reason=why) if why else caps


@router.get("/v1/stats", response_model=StatsOut, summary="Cache totals (tokens and bytes)",
            responses=documented(*TARGET_ERRORS))
def stats(adapter: Adapter) -> Response:
    return json_response(call(adapter.stats).to_dict())  # with its byte figures


@router.get("/v1/nodes/{node_id}", response_model=NodeDetailOut,
            summary="One node and a page of its token ids ('root' names the root)",
            responses=documented(404, 422, *TARGET_ERRORS))
def node(adapter: Adapter, node_id: NodeId, token_offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
         token_limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 256) -> Response:
    return json_response(call(adapter.node, parse_node_id(node_id), token_offset, token_limit))


@router.get("/v1/nodes/{node_id}/children", response_model=ChildrenPageOut,
            summary="A page of a node's children", responses=documented(404, 422, *TARGET_ERRORS))
def children(adapter: Adapter, node_id: NodeId, offset: Offset = 0, limit: PageLimit = 100,
             order: str = Query("bytes", description="bytes, recency or tokens",
                                json_schema_extra={"enum": list(CHILD_ORDERS)})) -> Response:
    return json_response(call(adapter.children, parse_node_id(node_id), offset, limit, order))


@router.get("/v1/nodes/{node_id}/subtree", response_model=SubtreeOut,
            summary="A node and its largest descendants, levels deep, read at one moment",
            responses=documented(429, 404, 422, *TARGET_ERRORS))
def subtree(adapter: Adapter, node_id: NodeId, depth: Annotated[int, Query(ge=1, le=MAX_DEPTH)] = 3,
            limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 10,
            order: str = Query("bytes", description="bytes, recency or tokens",
                               json_schema_extra={"enum": list(CHILD_ORDERS)}),
            min_bytes: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> Response:
    return json_response(call(adapter.subtree, parse_node_id(node_id), depth, limit, order, min_bytes))


@router.get("/v1/nodes/{node_id}/chain", response_model=ChainOut,
            summary="The run of single children below a node, in one read",
            responses=documented(429, 404, 422, *TARGET_ERRORS))
def chain(adapter: Adapter, node_id: NodeId, limit: Annotated[int, Query(ge=1, le=MAX_CHAIN)] = 10_000) -> Response:
    return json_response(call(adapter.chain, parse_node_id(node_id), limit))


@router.get("/v1/sessions", response_model=SessionsPageOut, summary="A page of sessions",
            responses=documented(429, 422, *TARGET_ERRORS))
def sessions(adapter: Adapter,
             order: str = Query("exclusive_bytes",
                                description=", ".join(SESSION_ORDERS) + " (each biggest, newest or "
                                            "open first; ids A to Z)",
                                json_schema_extra={"enum": list(SESSION_ORDERS)}),
             offset: Offset = 0, limit: PageLimit = 100,
             contains: str = Query("", max_length=MAX_CONTAINS,
                                   description="only sessions whose id contains this (any case), or "
                                               "whose state it names (open, closed)"),
             reverse: bool = Query(False, description="the order read from its other end")) -> Response:
    return json_response(call(adapter.sessions, order, offset, limit, contains, reverse))


@router.get("/v1/sessions/{session_id:anytext}", response_model=SessionDetailOut,
            summary="One session and the nodes it holds",
            responses=documented(429, 404, 405, 422, *TARGET_ERRORS))
def session(adapter: Adapter, session_id: SessionId, request: Request) -> Response:
    if request.scope.get("raw_path", b"").endswith(b"/close"):
        # .../ID/close as written (not an id ending in an encoded '%2Fclose'): the close action,
        # asked with GET or HEAD; the other methods find its route's 405 themselves
        raise StarletteHTTPException(405, headers={"Allow": "POST"})
    return json_response(call(adapter.session, session_id))


@router.get("/v1/match", response_model=MatchOut,
            summary="Longest cached prefix of a token list (read-only)",
            responses=documented(429, 422, *TARGET_ERRORS))
def match(adapter: Adapter, tokens: str = Query("", description="comma-separated token ids, e.g. 1,2,3",
                                                json_schema_extra={"pattern": TOKENS_PATTERN})) -> Response:
    return json_response(call(adapter.match, parse_tokens(tokens)))


@router.get("/v1/why", response_model=WhyOut | SessionWhyOut,
            summary="Why a prompt missed: its cached part now, where it leaves the cached path, and what of "
                    "the rest was cached before, when and why it left; or a session's story: its requests' "
                    "hits over time, and what it held that left, when and why",
            responses=documented(429, 404, 422, 501, *TARGET_ERRORS))
def why(adapter: Adapter, tokens: str = Query("", description="comma-separated token ids, e.g. 1,2,3",
                                              json_schema_extra={"pattern": TOKENS_PATTERN}),
        session: str | None = Query(None, min_length=1,
                                    description="a session's id (instead of tokens): its story")) -> Response:
    if session is not None:
        if tokens:
            raise BadRequest("give tokens or session, not both")
        return json_response(call(adapter.why_session, session))
    return json_response(call(adapter.why, parse_tokens(tokens)))


@router.get("/v1/history", response_model=HistoryPageOut,
            summary="The history of the tree as a journal, from a reader's place: the nodes that left it, "
                    "and sessions' requests (radixtop record)",
            responses=documented(429, 422, 501, *TARGET_ERRORS))
def history(adapter: Adapter,
            after: int = Query(0, ge=0, le=MAX_ID, description="the last removal read (0: from the first kept)"),
            served_after: int = Query(0, ge=0, le=MAX_ID, description="the last request read"),
            limit: int = Query(MAX_HISTORY_PAGE, ge=1, le=MAX_HISTORY_PAGE,
                               description=f"at most this many of each (1-{MAX_HISTORY_PAGE})")) -> Response:
    return json_response(call(adapter.history, after, served_after, limit))


@router.get("/v1/then", response_model=ThenOut,
            summary="The tree at a past moment, told from the tree now: what left since (when, why, whose) and "
                    "what was stored since",
            responses=documented(429, 422, 501, *TARGET_ERRORS))
def then(adapter: Adapter,
         at: float | None = Query(None, allow_inf_nan=False, description="the moment, in seconds since the epoch "
                                  "(neither at nor ago: as far back as the history reaches)"),
         ago: float | None = Query(None, ge=0, allow_inf_nan=False,
                                   description="the moment, as seconds before now (instead of at)")) -> Response:
    if at is not None and ago is not None:
        raise BadRequest("give at or ago, not both")
    return json_response(call(adapter.then, time.time() - ago if ago is not None else at))


@router.get("/v1/then/children", response_model=ChildrenPageOut,
            summary="A page of a node's children in the tree at a past moment, the largest subtree then first: "
                    "those still in the tree (their figures then; holders, locks and hits then not kept: null) "
                    "and those that left since (left_at, left_cause, left_by)",
            responses=documented(404, 422, 429, 501, *TARGET_ERRORS))
def then_children(adapter: Adapter,
                  at: float | None = Query(None, allow_inf_nan=False, description="the moment, in seconds since "
                                           "the epoch (neither at nor ago: as far back as the history reaches)"),
                  ago: float | None = Query(None, ge=0, allow_inf_nan=False,
                                            description="the moment, as seconds before now (instead of at)"),
                  node: int = Query(0, ge=0, le=MAX_BLOCK_ID, description="the node whose children (0: the root; "
                                    "on a KV-event stream, a block's id, below 2**64)"),
                  offset: Offset = 0, limit: PageLimit = 100) -> Response:
    if at is not None and ago is not None:
        raise BadRequest("give at or ago, not both")
    return json_response(call(adapter.then_children, time.time() - ago if ago is not None else at, node, offset,
                              limit))


@router.get("/v1/encode", response_model=EncodeOut,
            summary="A text as the target's tokenizer makes it token ids (for a search by text)",
            responses=documented(429, 422, *TARGET_ERRORS))
def encode(adapter: Adapter, text: str = Query("", max_length=MAX_ENCODE_CHARS,
                                               description="the text, e.g. the start of a prompt")) -> Response:
    return json_response({"tokens": call(adapter.encode, text)})


@router.get("/v1/paths", response_model=PathsOut,
            summary="The paths from the root to a set of nodes, read at one moment",
            responses=documented(429, 422, *TARGET_ERRORS))
def paths(adapter: Adapter, node_ids: str = Query(description=f"1 to {MAX_PATHS} comma-separated node ids, e.g. 7,12",
                                                  json_schema_extra={"pattern": IDS_PATTERN})) -> Response:
    return json_response(call(adapter.paths, parse_node_ids(node_ids)))


@router.get("/v1/changes", response_model=ChangesOut, summary="Node ids changed since a version",
            responses=documented(422, *TARGET_ERRORS))
def changes(adapter: Adapter, since: Annotated[int, Query(ge=0, le=MAX_ID)]) -> Response:
    return json_response(call(adapter.changes, since))


@router.get("/v1/doctor", response_model=DiagnosisOut,
            summary="The leak doctor: memory nobody can use now, what it means, and what frees it",
            responses=documented(429, 422, *TARGET_ERRORS))
def doctor(adapter: Adapter, idle_after_s: Annotated[float, Query(ge=0, le=MAX_IDLE_AFTER_S, description=(
        "a session unused this many seconds that still holds memory is a finding"))] = IDLE_AFTER_S) -> Response:
    return json_response(call(adapter.diagnose, idle_after_s).to_dict())


@router.get("/v1/read", response_model=ReadOut,
            summary="Several reads in one request (how a dashboard polls)",
            description="``reads``: a JSON list of reads, each ``op`` plus that read's own route's "
                        "parameters, such as ``[{\"op\": \"stats\"}, {\"op\": \"children\", "
                        "\"node_id\": \"root\"}]``. Ops: " + ", ".join(READ_PARAMS) + ". Answers each "
                        "read's result (``ok``) or error (``error``, ``status``) in order; an adapter "
                        "that owns its cache's thread reads them all in one hold of it.",
            responses=documented(429, 422, *TARGET_ERRORS))
def read(adapter: Adapter, state: State, request: Request,
         reads: str = Query(description=f"A JSON list of 1 to {MAX_READS} reads.", max_length=MAX_URL)) -> Response:
    parsed = parse_reads(reads)
    results = [for_token(r, state, request) if isinstance(r, Capabilities) else r
               for r in call(adapter.read_many, parsed)]
    return json_response(encode_results(parsed, results))


@router.get("/v1/export", summary="The whole tree as NDJSON: a header line, then one line per node",
            response_class=StreamingResponse, responses={**documented(429, 422, *TARGET_ERRORS), 200: {
                "description": "ndjson: a JSON header line, then one JSON line per node; columns: a JSON "
                               "header line, then raw little-endian int64 columns, then the holders as JSON",
                "content": {"application/x-ndjson": {"schema": {"type": "string"}},
                            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
def export(adapter: Adapter, format: str = Query("ndjson", pattern="^(ndjson|columns)$",
                                                 description="ndjson: a line per node; columns: raw int64 "
                                                             "columns")) -> StreamingResponse:
    if format == "columns":
        columns = call(adapter.export_columns)
        return StreamingResponse(encode_export_columns(columns), media_type="application/octet-stream")
    header, chunks = call(_header_and_rest, adapter.export_ndjson)
    return StreamingResponse(_ndjson(header, chunks), media_type="application/x-ndjson")


@router.get("/v1/audit", response_model=AuditPageOut, summary="Audited actions, newest first",
            responses=documented(422))
def audit_page(audit: Journal, limit: PageLimit = 100, offset: Offset = 0) -> Response:
    entries = call(audit.tail, limit, offset)
    return json_response({"offset": offset, "limit": limit, "entries": entries})


@router.get("/healthz", response_model=HealthOut, summary="Whether the target answers",
            responses=documented(422, 503))
async def healthz(adapter: Adapter, state: State,
                  challenge: str | None = Header(None, alias=CHALLENGE_HEADER, max_length=MAX_CHALLENGE,
                                                 description="Answered in a Radixtop-Proof header by a server "
                                                             "started with a proof key (the embedded demo's)")
                  ) -> Response:
    try:
        st = await ahead_of_reads(adapter.stats)
        read_only = (await ahead_of_reads(adapter.capabilities)).read_only
        answer = json_response({"status": "ok", "target": st.target, "version": st.version, "read_only": read_only})
    except (TargetUnreachable, TargetTimeout) as exc:
        answer = json_response(error_to_body(exc), 503)
    if (proof := state.tokens.proof(challenge)) is not None:
        answer.headers[PROOF_HEADER] = proof
    return answer


@router.get("/metrics", summary="Prometheus metrics (read from the target at scrape time)",
            response_class=Response, responses={**documented(503, 504), 200: {
                "description": "The Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics(state: State) -> Response:
    content, media_type = call(render_metrics, state.registry)
    return Response(content, media_type=media_type)


@fleet.get("/v1/fleet", summary="Every worker and DP rank of the fleet this server watches (a poll at most "
           "a second old, or the last one at once while a poll runs); from Dynamo, the prefixes cached twice",
           responses=documented())
async def fleet_view(state: State) -> Response:
    view = await anyio.to_thread.run_sync(call, state.fleet)
    if isinstance(view, Future):  # the first poll, not ended yet: awaited holding no thread
        view = await asyncio.wrap_future(view)
    return json_response(view.to_dict())


def _header_and_rest(export: Callable[[], Iterable[str]]) -> tuple[str, Iterator[str]]:
    """The export's header line, which takes its snapshot (so a failure is still a status code),
    and an iterator of the chunks after it."""
    chunks = iter(export())
    return next(chunks), chunks


def _ndjson(header: str, chunks: Iterator[str]) -> Iterator[str]:
    """The header line, then the adapter's chunks; memory bounded by a chunk, not the tree."""
    yield header
    try:
        yield from chunks
    except Exception as exc:  # headers are sent: the client sees fewer rows than node_count
        logger.error("export stopped early: %s: %s", type(exc).__name__, exc)
