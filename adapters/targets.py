"""One constructor per kind of target that the commands and the fleet's probe both open (over HTTP)."""

from __future__ import annotations

from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.model import Geometry
from radixtop.adapters.sglang.routes import SGLangRoutesAdapter


def open_radixtop(url: str, token: str | None = None, timeout: float = 10.0) -> RadixtopClient:
    """radixtop's admin API at ``url`` (``radixtop serve``, or SGLang's radixtop plugin), sending
    ``token`` with every request; BadRequest for a URL or token that cannot be sent."""
    return RadixtopClient(url, token=token, timeout=timeout)


def open_sglang_routes(url: str, api_key: str | None = None, dp_rank: int | None = None, timeout: float = 5.0,
                       geometry: Geometry | None = None) -> SGLangRoutesAdapter:
    """A plain SGLang server's own routes at ``url`` (totals, close, flush; no tree), for DP rank
    ``dp_rank`` (None: the whole server), with its ``--api-key``; BadRequest for a bad URL or rank."""
    return SGLangRoutesAdapter(url, api_key=api_key, dp_rank=dp_rank, timeout=timeout, geometry=geometry)
