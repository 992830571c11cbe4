"""The admin API's actions: a router of its POST routes, each an ``AuditedAction`` that ``Audited`` begins.

``Audited`` authorises the action and journals its intent; ``async with`` the action journals its
outcome. A route body is its action: close, evict, flush."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from radixtop.adapters.errors import AdapterError, BadRequest
from radixtop.adapters.http.params import TRUE, parse_bool
from radixtop.adapters.http.schemas import CloseOut, ClosePlanOut, EvictIn, EvictOut, FlushOut
from radixtop.adapters.http.server.answers import ahead_of_reads, internal, json_response, logger
from radixtop.adapters.http.server.audit import AuditLog, AuditUnavailable, Pending
from radixtop.adapters.http.server.deps import Adapter, SessionId, State
from radixtop.adapters.http.server.errors import TARGET_ERRORS, documented
from radixtop.adapters.http.wire import PayloadTooLarge
from radixtop.adapters.model import AuditEntry

MAX_BODY = 64 * 1024
"""Bytes of an action's body at most (evict's is ``{"tokens": N}``); a larger one is refused (413)."""

router = APIRouter()


@dataclass
class AuditedAction:
    """One request for an action, authorised, its body read, and its intent journaled where it needs
    the token. ``async with`` it around the work: what the work sets here (``plan``, ``result``,
    ``extra``) and how it ended (allowed, or the error it raised) is journaled as its outcome before
    the answer goes out."""

    name: str
    target: str
    client: str
    audit: AuditLog
    authorised: bool
    """Whether the request holds the action token: entries from any other are kept apart, bounded."""
    body: bytes = b""
    pending: Pending | None = None
    plan: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    async def __aenter__(self) -> AuditedAction:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        if exc is None:
            await self.journal(None)
        elif isinstance(exc, Exception):  # (a cancellation is not an outcome)
            raise await self.failed(exc) from None
        return False

    async def failed(self, exc: Exception) -> AdapterError:
        """Journal ``exc`` as the outcome; the typed error to answer (any other is a logged 500)."""
        error = exc if isinstance(exc, AdapterError) else internal(exc)
        await self.journal(error)
        return error

    async def journal(self, error: AdapterError | None) -> None:
        """The outcome: it finishes the intent, or is the one entry of a refusal or a dry run (not
        of an intent the journal could not take: then nothing ran, and the answer says so)."""
        entry = AuditEntry(
            time=time.time(), client=self.client, action=self.name, target=self.target, allowed=error is None,
            plan=self.plan, result=self.result,
            error=None if error is None else f"{error.code}: {error.message}", extra=self.extra,
        )
        # The journal's entry, mirrored in the debug log (ids as repr: a hostile id stays inert).
        logger.debug("action %s %r from %s: %s", self.name, _short(self.target), self.client,
                     "allowed" if error is None else f"refused ({error.code})")
        try:
            if self.pending is not None:
                await ahead_of_reads(self.audit.finish, self.pending, entry)
            elif not isinstance(error, AuditUnavailable):
                await ahead_of_reads(self.audit.append, entry, self.authorised)
        except AuditUnavailable as exc:  # the action has run (or was refused): say so in the log
            logger.error("could not journal the outcome of %s %r from %s: %s", self.name, _short(self.target),
                         self.client, exc.message)


class Audited:
    """The dependency that begins an action: authorised, then its intent journaled before it runs
    (fail closed: if it cannot be, nothing runs and the answer is 503). A refusal is journaled
    once, and raised. ``target``: what it acts on, the route's path parameters filled in
    (``session:{session_id}``). ``previews``: ``?dry_run=true`` asks for the plan alone, a read
    (allowed read-only too) that needs no action token and is journaled all the same, as
    ``<name>_dry_run``."""

    def __init__(self, name: str, target: str = "cache", previews: bool = False) -> None:
        self.name, self.target, self.previews = name, target, previews

    async def __call__(self, request: Request, state: State) -> AuditedAction:
        dry_run = self.previews and (request.query_params.get("dry_run") or "").strip().lower() in TRUE
        refused_token = state.tokens.action_refusal(request.headers)
        action = AuditedAction(
            name=f"{self.name}_dry_run" if dry_run else self.name,
            target=self.target.format(**request.path_params),
            client=request.client.host if request.client is not None else "unknown",
            audit=state.audit, authorised=refused_token is None,
        )
        try:
            if not dry_run and refused_token is not None:
                raise refused_token
            if dry_run and not state.bind.loopback and (refused := state.tokens.read_refusal(request.headers)):
                raise refused
            action.body = await read_body(request)
            if not dry_run:
                intent = AuditEntry(time=time.time(), client=action.client, action=action.name,
                                    target=action.target, allowed=True)
                try:
                    action.pending = await ahead_of_reads(state.audit.begin, intent)
                except AuditUnavailable as exc:
                    raise AuditUnavailable(f"{exc.message}; nothing was done: an action that cannot be "
                                           "audited is not run") from None
        except Exception as exc:
            raise await action.failed(exc) from None
        return action


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


def parse_json(request: Request, body: bytes) -> Any:
    """An action's body as JSON, sent as such; BadRequest otherwise."""
    content_type = request.headers.get("content-type")
    if content_type is None or content_type.partition(";")[0].strip().lower() != "application/json":
        sent = "none" if content_type is None else repr(content_type[:60])
        raise BadRequest(f"body must be JSON sent as Content-Type: application/json (got {sent})")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise BadRequest('body must be JSON, such as {"tokens": 1000}') from None


def _short(text: str, keep: int = 200) -> str:
    """A target as the server log shows it: a 64 KB session id is cut."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


DRY_RUN_PARAM = {"parameters": [{
    "name": "dry_run", "in": "query", "required": False,
    "schema": {"type": "boolean", "default": False},
    "description": "Return the plan (what a close would free now) and change nothing.",
}]}
"""``dry_run``, published by hand: the route reads it itself, so that a bad value is a refusal it
journals rather than FastAPI's 422."""

Closing = Annotated[AuditedAction, Depends(Audited("close", "session:{session_id}", previews=True))]
Evicting = Annotated[AuditedAction, Depends(Audited("evict"))]
Flushing = Annotated[AuditedAction, Depends(Audited("flush"))]


@router.post("/v1/sessions/{session_id:anytext}/close", response_model=CloseOut | ClosePlanOut,
             summary="Close a session: its plan and result (only the plan with dry_run=true)",
             responses=documented(401, 403, 404, 422, *TARGET_ERRORS), openapi_extra=DRY_RUN_PARAM)
async def close_session(session_id: SessionId, request: Request, adapter: Adapter, action: Closing) -> Response:
    async with action:
        if parse_bool("dry_run", request.query_params.get("dry_run")):
            action.plan = (await ahead_of_reads(adapter.plan_close, session_id)).to_dict()
            answer = action.plan
        else:
            # One hold where the adapter owns its cache's thread: the result is the plan. A target
            # that can close but not preview answers a null plan (its result says what it saw).
            plan, result = await ahead_of_reads(adapter.close_session_planned, session_id)
            action.plan = plan.to_dict() if plan is not None else None
            action.result = result.to_dict()
            answer = {"plan": action.plan, "result": action.result}
    return json_response(answer)


@router.post("/v1/evict", response_model=EvictOut, summary="Evict unlocked LRU leaves",
             responses=documented(401, 403, 422, *TARGET_ERRORS),
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": EvictIn.model_json_schema()}}}})
async def evict(request: Request, adapter: Adapter, action: Evicting) -> Response:
    async with action:
        try:
            num_tokens = EvictIn.model_validate(parse_json(request, action.body)).tokens
        except ValidationError as exc:
            raise BadRequest('body must be {"tokens": N} with N >= 0: '
                             + "; ".join(e["msg"] for e in exc.errors())) from None
        action.extra["requested_tokens"] = num_tokens
        action.result = (await ahead_of_reads(adapter.evict, num_tokens)).to_dict()
    return json_response(action.result)


@router.post("/v1/flush", response_model=FlushOut, summary="Evict everything that is evictable",
             responses=documented(401, 403, *TARGET_ERRORS))
async def flush(adapter: Adapter, action: Flushing) -> Response:
    async with action:
        action.result = (await ahead_of_reads(adapter.flush)).to_dict()
    return json_response(action.result)
