"""The admin API's exception handlers, each answering the error body, and each operation's errors."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixtop.adapters.errors import AdapterError, BadRequest
from radixtop.adapters.http.schemas import ErrorOut
from radixtop.adapters.http.server.answers import error_response, internal, json_response
from radixtop.adapters.http.wire import METHOD_NOT_ALLOWED, NOT_FOUND, PAYLOAD_TOO_LARGE, error_body

TARGET_ERRORS = (501, 503, 504)
"""What any call to the target can meet: unsupported, unreachable, timeout."""
_STATUS_CODES = {404: NOT_FOUND, 405: METHOD_NOT_ALLOWED, 413: PAYLOAD_TOO_LARGE}
"""The codes of Starlette's own refusals (no route, a wrong method, too large): they carry the error body too."""


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """An operation's documented error answers: its own, and what any request can meet (a Host
    not this server's or a bad percent-encoding: 400; a page of another origin: 403; a URL over
    MAX_URL: 413; a bug: 500). Each with the error body."""
    return {status: {"model": ErrorOut} for status in sorted({*statuses, 400, 403, 413, 500})}


async def on_adapter_error(request: Request, exc: AdapterError) -> JSONResponse:
    return error_response(exc)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err.get("loc", ()))
        problems.append(f"{where}: {err.get('msg', 'invalid')}" if where else err.get("msg", "invalid"))
    return json_response(error_body(BadRequest.code, "; ".join(problems) or "invalid request"), 422)


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    message, path = str(exc.detail), request.url.path[:100]
    if exc.status_code == 404:
        message = f"no route {path!r} in this API (its routes are listed at /openapi.json)"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow")
        message = f"{request.method} is not allowed on {path!r}" + (f": use {allowed}" if allowed else "")
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    return error_response(internal(exc))  # a last resort: the Outermost layer answers errors from the routes


def add_exception_handlers(app: FastAPI) -> None:
    """Every error the app answers itself carries the error body, never FastAPI's own."""
    app.add_exception_handler(AdapterError, on_adapter_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
