"""How the admin API's routes answer (views as JSON, typed errors, a logged 500) and where calls run.

A typed error is answered with its status and error body; any other is a 500 whose cause goes to
the server log only. Actions and /healthz call the adapter in threads of their own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import orjson
from anyio.lowlevel import RunVar
from fastapi.responses import JSONResponse, Response

from radixtop.adapters.errors import AdapterError, Unauthorized
from radixtop.adapters.http.server.logs import SERVER_LOG
from radixtop.adapters.http.wire import error_to_body, json_default

logger = logging.getLogger(SERVER_LOG)

T = TypeVar("T")

PRIORITY_THREADS = 8
"""Worker threads for actions and health, apart from the reads' (anyio's default 40)."""
_PRIORITY: RunVar[anyio.CapacityLimiter] = RunVar("radixtop_priority_threads")


def json_response(payload: Any, status: int = 200) -> Response:
    """A JSON response from a view (a dataclass) or plain data. orjson encodes the views' dataclasses
    directly, with no dict built per row: a page of 1000 sessions costs the server (which shares
    the interpreter with the cache's owner where radixtop runs in process) a fraction of what
    ``to_dict`` plus ``json.dumps`` did. The output is the same JSON."""
    body = orjson.dumps(payload, default=json_default, option=orjson.OPT_NON_STR_KEYS)
    return Response(body, status_code=status, media_type="application/json")


def error_response(exc: AdapterError) -> JSONResponse:
    """A typed error's answer: its status and error body (401 also names the scheme)."""
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    return JSONResponse(error_to_body(exc), status_code=exc.http_status, headers=headers)


def internal(exc: BaseException) -> AdapterError:
    """The 500 for an error that is not a typed one: its cause is logged, never answered."""
    logger.error("admin API request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return AdapterError("internal error (details are in the server log)")


def call(fn: Callable[..., T], *args: Any) -> T:
    """Run an adapter call; an error that is not a typed one becomes a 500 (logged, not shown)."""
    try:
        return fn(*args)
    except AdapterError:
        raise
    except Exception as exc:
        raise internal(exc) from None


async def ahead_of_reads(fn: Callable[..., T], *args: Any) -> T:
    """Run an adapter call for an action or /healthz in a thread of their own: never queued behind
    reads that fill the default thread pool while they wait on the cache's owner."""
    try:
        limiter = _PRIORITY.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(PRIORITY_THREADS)
        _PRIORITY.set(limiter)
    return await anyio.to_thread.run_sync(partial(call, fn, *args), limiter=limiter)
