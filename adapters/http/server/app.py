"""The admin API as an app: ``create_app(adapter, token, audit)``, its routers behind its edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.http.params import MAX_ID
from radixtop.adapters.http.server import actions, reads
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.server.budget import CpuBudget
from radixtop.adapters.http.server.deps import Served
from radixtop.adapters.http.server.edge import (
    MAX_HEAVY_READS,
    UNGUARDED,
    Admission,
    Bind,
    Outermost,
    Tokens,
    check_token_strength,
    check_token_text,
)
from radixtop.adapters.http.server.errors import add_exception_handlers
from radixtop.adapters.http.server.metrics import metrics_registry
from radixtop.adapters.http.wire import WIRE_VERSION


def create_app(adapter: CacheAdapter, token: str, audit: AuditLog, *, host: str = "127.0.0.1",
               read_token: str | None = None, max_heavy_reads: int = MAX_HEAVY_READS,
               fleet: Callable[[], Any] | None = None, proof_key: bytes | None = None,
               budget: CpuBudget | None = None) -> FastAPI:
    """The admin API over ``adapter``, for a server bound to ``host``.
    Every POST needs ``Authorization: Bearer <token>`` and is audited, allowed or refused; on a
    bind that is not loopback every request but /healthz needs ``token`` or ``read_token`` (which
    only reads); a loopback bind answers to loopback names only. Read-only is the adapter's to
    enforce, not the server's. (``serve`` also refuses a short action token; this factory, used
    by tests, does not.) ``fleet``: where ``GET /v1/fleet`` gets the fleet view it answers (a
    ``FleetPoller.poll``); None: there is no such route. ``proof_key``: what ``/healthz`` proves it
    holds to a ``Radixtop-Challenge`` (the demo's parent checks who answers before it sends a token).
    ``budget``: the CPU this process may take for reads (``budget.CpuBudget``; None: no bound)."""
    check_token_text(token)
    if read_token is not None:  # (new, so no test relies on a short one: held to serve's rule here)
        check_token_text(read_token, "read token")
        check_token_strength(read_token, "read token")
    if read_token is not None and read_token == token:
        raise ValueError("the read token must differ from the action token")
    bind, tokens = Bind(host), Tokens(token, read_token, proof_key)
    app = _AdminApi(
        title="radixtop admin API",
        summary="Read and act on a radix KV cache: stats, tree, sessions, close, evict, flush.",
        version=str(WIRE_VERSION),
        docs_url=None, redoc_url=None,  # their pages load scripts from a public CDN
    )
    app.state.served = Served(adapter, audit, bind, tokens, metrics_registry(adapter), fleet)
    app.add_middleware(Admission, bind=bind, tokens=tokens, max_heavy_reads=max_heavy_reads, budget=budget)
    app.add_middleware(Outermost)
    add_exception_handlers(app)
    # The routers' routes join the app's own table, as include_router would not: FastAPI keeps an
    # included router as one entry there, and app.routes is to list every route the app answers.
    for router in (actions.router, reads.router, *([reads.fleet] if fleet is not None else [])):
        app.router.routes.extend(router.routes)
    return app


class _AdminApi(FastAPI):
    """FastAPI, with its schema's integer bounds published exactly and, on a bind that is not
    loopback, the 401 that ``Admission`` answers a read without a token."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            _exact_int_bounds(schema)
            if not self.state.served.bind.loopback:
                _document_read_refusals(schema)
        return self.openapi_schema


def _document_read_refusals(schema: dict[str, Any]) -> None:
    """Where ``Admission`` asks reads for a token (every route but UNGUARDED's; the actions check
    their own, and document it), each read operation lists 401 among its answers, in order, with
    the error body as its 400 has it (every operation documents a 400: ``errors.documented``)."""
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method != "post" and path not in UNGUARDED:
                answers = operation["responses"]
                answers["401"] = {**answers["400"], "description": "Unauthorized"}
                operation["responses"] = dict(sorted(answers.items()))


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
