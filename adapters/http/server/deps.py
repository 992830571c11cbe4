"""What the admin API's routes are given: the app's own state as dependencies, and the session id.

``create_app`` keeps the adapter, the journal, the edge and the metrics on ``app.state``: the
routers are the module's, the same for every app."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi import Path as PathParam
from prometheus_client import CollectorRegistry
from starlette.convertors import Convertor, register_url_convertor

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.server.edge import Bind, Tokens


@dataclass(frozen=True)
class Served:
    """One app's own: what it serves, where it journals actions, and who may do what."""

    adapter: CacheAdapter
    audit: AuditLog
    bind: Bind
    tokens: Tokens
    registry: CollectorRegistry
    fleet: Callable[[], Any] | None


# The dependencies are coroutines: they run on the event loop, so a sync route takes one worker
# thread, as it did with no dependency.


async def _served(request: Request) -> Served:
    return request.app.state.served


async def _adapter(request: Request) -> CacheAdapter:
    return request.app.state.served.adapter


async def _audit(request: Request) -> AuditLog:
    return request.app.state.served.audit


Adapter = Annotated[CacheAdapter, Depends(_adapter)]
Journal = Annotated[AuditLog, Depends(_audit)]
State = Annotated[Served, Depends(_served)]


class _AnyText(Convertor[str]):
    """A path parameter that takes any text, '/' and line breaks included. Starlette's ``path``
    stops at a line break, so '/v1/sessions/b%0A' was read as session 'b'."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anytext", _AnyText())  # before a route names it: {session_id:anytext}

SessionId = Annotated[str, PathParam(description="A session id: any text, '/' included.")]
