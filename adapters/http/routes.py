"""An inference server's own HTTP routes, read by an adapter (SGLang's, vLLM's): each request within
a deadline and a size cap (``bounded``), failures as the contract's errors, and the few lines of
Prometheus text an adapter needs (``parse_metrics``)."""

from __future__ import annotations

import math
import re
from typing import Any, NoReturn

import httpx

from radixtop.adapters.errors import AdapterError, BadRequest, Unauthorized
from radixtop.adapters.http.bounded import bounded_client, exchange
from radixtop.adapters.http.wire import MAX_COUNT

MAX_REPLY_BYTES = 16 * 2**20
"""The most one reply of a server's routes may take (a /metrics of 64 ranks' histograms is ~5 MiB)."""

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = list[tuple[dict[str, str], float]]


def parse_metrics(text: str, names: tuple[str, ...]) -> dict[str, Samples]:
    """The samples of ``names`` in Prometheus text: ``{name: [(labels, value)]}``. Only those
    lines are parsed (a server's /metrics runs to thousands of histogram lines). A sample that
    is not a count (NaN, an infinity, a negative, over 2**63) is left out, as if not sent."""
    out: dict[str, Samples] = {name: [] for name in names}
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in out:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value) and 0 <= value <= MAX_COUNT:
            out[m.group(1)].append((dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def server_url(base_url: str) -> str:
    """``base_url`` as ``scheme://host:port`` without a trailing slash (``http://`` where none is given)."""
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise BadRequest(f"{base_url!r} is not an http:// or https:// URL")
    return url


class ServerRoutes:
    """One server's routes: ``send`` one request, ``get_json``, ``fail`` with the server's own
    message. ``api_key`` goes as a Bearer token; ``server``: what the messages call it (SGLang,
    vLLM); ``refused``: what a 401/403 tells the user to do."""

    def __init__(self, base_url: str, *, api_key: str | None, timeout: float, server: str, refused: str,
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        self.url, self.timeout, self.max_reply_bytes = server_url(base_url), timeout, max_reply_bytes
        self.server, self.refused = server, refused
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # never through a proxy to a loopback server (the key would go with it); others as curl
        self.client = bounded_client(self.url, timeout, headers)

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request within ``timeout`` (or the read's deadline) and ``max_reply_bytes``;
        transport failures and refused credentials as the contract's errors."""
        response = exchange(self.client, self.client.build_request(method, path, **kwargs),
                            timeout=self.timeout, what=self.url, max_bytes=self.max_reply_bytes)
        if response.status_code in (401, 403):
            raise Unauthorized(f"{self.url}{path}: {self.server} refused the request (HTTP "
                               f"{response.status_code}); {self.refused}")
        return response

    def fail(self, response: httpx.Response) -> NoReturn:
        """AdapterError with the server's own message (OpenAI-style ``{"error": {"message"}}`` or
        FastAPI's ``{"detail"}``), cut to one short line."""
        path, text = response.request.url.path, response.text.strip()
        try:
            body = response.json()
            error = body.get("error")
            error = error.get("message") if isinstance(error, dict) else error
            text = str(error or body.get("detail") or text)
        except (ValueError, AttributeError):
            pass
        raise AdapterError(f"{self.url}{path}: HTTP {response.status_code} {response.reason_phrase}: "
                           f"{text[:300]}")

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any | None:
        """The JSON body of a GET; None when the route does not exist (404)."""
        response = self.send("GET", path, params=params)
        if response.status_code == 404:
            return None
        if not response.is_success:
            self.fail(response)
        try:
            return response.json()
        except ValueError:
            raise AdapterError(f"{self.url}{path} answered something that is not JSON: "
                               f"{response.text[:200]!r}") from None

    def get_text(self, path: str) -> str | None:
        """The body of a GET as text; None when the route does not exist (404)."""
        response = self.send("GET", path)
        if response.status_code == 404:
            return None
        if not response.is_success:
            self.fail(response)
        return response.text

    def close(self) -> None:
        self.client.close()
