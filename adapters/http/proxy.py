"""Which proxy a radixtop HTTP client goes through: never one for a loopback server (its requests
carry the bearer token); for any other host, the proxy variables and NO_PROXY as curl reads them.

httpx's own reading of the environment proxied loopback too, and matched NO_PROXY differently
from curl (``example.com`` did not cover ``www.example.com``; no CIDR ranges)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx


def transport_for(url: str) -> httpx.HTTPTransport:
    """An httpx transport for a client of ``url``'s server: direct, or through ``proxy_for(url)``.
    (A client given a transport reads no proxy from the environment itself.)"""
    return httpx.HTTPTransport(proxy=proxy_for(url))


def proxy_for(url: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The proxy for requests to ``url``, or None. Never for a loopback host (localhost, a name
    under .localhost, 127.0.0.0/8, ::1). Else, as curl: ``http_proxy`` (lower case only: an
    upper-case HTTP_PROXY can be set by a request's Proxy header in CGI), ``https_proxy`` or
    ``HTTPS_PROXY``, then ``all_proxy`` or ``ALL_PROXY``; none if ``no_proxy`` or ``NO_PROXY``
    names the host. An empty variable counts as unset."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if is_loopback_host(host):
        return None
    scheme = parts.scheme.lower()
    names = [f"{scheme}_proxy"] + ([] if scheme == "http" else [f"{scheme}_proxy".upper()]) + ["all_proxy", "ALL_PROXY"]
    proxy = next((environ[name] for name in names if environ.get(name)), None)
    if proxy is None or _bypassed(host, _first(environ, "no_proxy", "NO_PROXY")):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _first(environ: Mapping[str, str], *names: str) -> str:
    return next((environ[name] for name in names if environ.get(name)), "")


def is_loopback_host(host: str) -> bool:
    """localhost, a name under .localhost, 127.0.0.0/8, ::1 (or an IPv4-mapped loopback)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _bypassed(host: str, no_proxy: str) -> bool:
    """Whether curl's NO_PROXY rules send ``host`` directly: entries separated by commas or
    spaces, case-insensitive; ``*`` alone for every host; a name covers itself and every name
    below it (a leading dot is ignored); an IP address or CIDR range covers the addresses in it."""
    entries = no_proxy.replace(",", " ").split()
    if entries == ["*"]:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in entries:
        entry = entry.lower().strip("[]")
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = entry.lstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False
