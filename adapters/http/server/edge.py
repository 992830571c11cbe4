"""The admin API's edge, before any route: which requests it answers at all (the Host it is bound
to, no page of another origin, a token for reads on a public bind, percent-encodings that name one
thing, a URL at most MAX_URL bytes), how many heavy reads run at once, what a token must be, and
the answer to an error no handler took."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from radixtop.adapters.errors import AdapterError, ReadOnly, Unauthorized
from radixtop.adapters.http.server.answers import error_response, internal
from radixtop.adapters.http.server.budget import CpuBudget
from radixtop.adapters.http.server.protocol import MAX_URL, url_too_long
from radixtop.adapters.http.wire import BAD_HOST, BUSY, CROSS_ORIGIN, error_body

MIN_TOKEN_LENGTH = 16
MAX_HEAVY_READS = 4
"""Heavy reads served at once by one server; more are answered 429 at once, never queued. A read
holds its slot until its answer starts: never while a client reads it (slowly or not at all)."""
MAX_EXPORTS = 4
"""Exports streamed at once, each from its own snapshot (a 200k-node tree's is a few MB): more are
answered 429. A slow reader holds one of these, not a heavy-read slot."""
EXPORT = "/v1/export"
RETRY_AFTER_S = 1
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
HEAVY_READS = re.compile(r"/v1/(read|export|match|why|history|then(/children)?|paths|doctor|sessions(/.*)?|nodes/[^/]+/(subtree|chain))", re.S)
"""Reads whose cost follows the cache (a page of sessions, a subtree, a batch, the export, the doctor's walk)."""
UNGUARDED = frozenset({"/healthz"})
"""Answered on a public bind without a token (a probe's)."""
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_in_url(host: str) -> str:
    """``host`` as a URL or a Host header names it: an IPv6 literal in brackets."""
    return f"[{host}]" if ":" in host else host


def check_token_text(token: str, what: str = "token") -> None:
    """ValueError unless ``token`` can travel in a header and match there."""
    if not token:
        raise ValueError(f"the admin API needs a non-empty {what}")
    if not (token.isascii() and token.isprintable()) or token != token.strip():
        # Anything else could never match: HTTP clients send header values as ASCII, and the
        # server strips the value it is sent.
        raise ValueError(f"the admin API {what} must be printable ASCII, with no space at either end")


def check_token_strength(token: str, what: str = "token") -> str:
    """``token`` if it is long enough to stand between a network and the cache; ValueError else."""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the admin API {what} must be at least {MIN_TOKEN_LENGTH} characters "
                         f"(got {len(token)}): make one with `python -c 'import secrets; "
                         "print(secrets.token_urlsafe(24))'`")
    return token


PROOF_HEADER, CHALLENGE_HEADER = "Radixtop-Proof", "Radixtop-Challenge"
MAX_CHALLENGE = 128
PROOF_CONTEXT = b"radixtop healthz proof\0"


def prove(key: bytes, challenge: str) -> str:
    """What a server holding ``key`` answers to ``challenge`` (HMAC-SHA256, hex): a client that
    gave it the key knows who answers before it sends a token. The key is its own, never the
    token (the proof is answered to anyone)."""
    return hmac.new(key, PROOF_CONTEXT + challenge.encode(), "sha256").hexdigest()


class Tokens:
    """The action token and an optional read-only token, compared in constant time. The action
    token is compared once whatever is sent; the read token only when the action token did not
    match. ``proof_key``: a key of the process that started this server, which it proves it holds
    (``/healthz`` with a ``Radixtop-Challenge``)."""

    def __init__(self, action: str, read: str | None = None, proof_key: bytes | None = None) -> None:
        self._action = action.encode()
        self._read = read.encode() if read else None
        self._proof_key = proof_key

    def proof(self, challenge: str | None) -> str | None:
        """The answer to a challenge, where the server has a key (and the challenge is one)."""
        if self._proof_key is None or not challenge or len(challenge) > MAX_CHALLENGE:
            return None
        return prove(self._proof_key, challenge)

    def _given(self, headers: Headers) -> tuple[bytes | None, Unauthorized | None]:
        header = headers.get("authorization")
        if header is None:
            return None, Unauthorized("missing 'Authorization: Bearer <token>' header")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return None, Unauthorized("wrong token")
        return given.strip().encode(), None

    def action_refusal(self, headers: Headers) -> AdapterError | None:
        """Why the request may not act (401, or 403 for the read token), or None."""
        given, refusal = self._given(headers)
        if given is None:
            return refusal
        if hmac.compare_digest(given, self._action):
            return None
        if self._read is not None and hmac.compare_digest(given, self._read):
            return ReadOnly("this token only reads: actions need the action token")
        return Unauthorized("wrong token")

    def why_not_act(self, headers: Headers) -> str:
        """Why an action sent with these headers would be refused, in one sentence (empty: it
        would not be): what ``GET /v1/capabilities`` says to the token it is sent."""
        refusal = self.action_refusal(headers)
        if refusal is None or isinstance(refusal, ReadOnly):
            return refusal.message if refusal is not None else ""
        given = "no token" if headers.get("authorization") is None else "wrong token"
        return f"{given}: actions need the server's token (--token or RADIXTOP_TOKEN)"

    def read_refusal(self, headers: Headers) -> AdapterError | None:
        """Why the request may not read (401), or None: either token reads."""
        refusal = self.action_refusal(headers)
        return None if refusal is None or isinstance(refusal, ReadOnly) else refusal


@dataclass(frozen=True)
class Bind:
    """Where the server listens: what ``Host`` it answers to and whether reads need a token.
    A loopback bind answers to loopback names only (a DNS-rebinding page sends its own name),
    on any port (an SSH tunnel forwards from another one; a page cannot choose the port its
    browser names); any other bind needs a token for every request but /healthz, so it takes
    any Host."""

    host: str

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def names(self) -> frozenset[str]:
        return LOOPBACK_NAMES | {host_in_url(self.host).lower()}

    def accepts(self, host: str | None) -> bool:
        if not self.loopback:
            return True
        if not host:
            return False
        name, _ = _split_host(host.lower())
        return name in self.names()


def _split_host(host: str) -> tuple[str, int | None]:
    """A Host header's name and port (None if it has none); an IPv6 literal keeps its brackets.
    A port that is not a number makes the name empty (no bind answers to that Host)."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        name, port = name + "]", rest[1:] if rest.startswith(":") else None
    else:
        name, sep, port = host.partition(":")
        port = port if sep else None
    if port is not None and not port.isdigit():
        return "", None
    return name.rstrip("."), None if port is None else int(port)


def _bad_percent(raw: bytes) -> bool:
    """A %-escape that is not two hex digits, or escapes that do not decode as UTF-8: both
    alias (%FF and %FE were both read as '\\ufffd')."""
    if b"%" not in raw:
        return False
    if _BAD_ESCAPE.search(raw):
        return True
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _refuse(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


class Admission:
    """ASGI middleware: refuses what the API must not answer, before routing (nothing refused
    here is journaled: no route ran), and holds heavy reads to ``max_heavy_reads`` at once.
    Health and actions are never counted (their threads are their own: see ``answers.ahead_of_reads``)."""

    def __init__(self, app: ASGIApp, bind: Bind, tokens: Tokens, max_heavy_reads: int = MAX_HEAVY_READS,
                 max_exports: int = MAX_EXPORTS, budget: CpuBudget | None = None) -> None:
        self.app, self.bind, self.tokens = app, bind, tokens
        self.max_heavy_reads, self.max_exports = max_heavy_reads, max_exports
        self.budget = budget
        """The CPU this process may take for reads (None: no bound): a read waits for it."""
        self.heavy_reads = self.exports = 0  # only touched on the event loop: no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if self.budget is not None and scope["method"] == "GET" and scope["path"] not in UNGUARDED \
                and self.tokens.action_refusal(Headers(scope=scope)) is not None:  # (the operator's reads go ahead)
            wait = self.budget.wait()
            if wait > self.budget.most_wait_s:
                self.budget.refused += 1
                after = self.budget.retry_after(wait)
                busy = _refuse(429, BUSY, f"this server's CPU for reads ({self.budget.share:g} of a core) is spent: "
                               f"retry after {after} s", headers={"Retry-After": str(after)})
                await busy(scope, receive, send)
                return
            if wait > 0:
                self.budget.waited += 1
                await asyncio.sleep(wait)
        if scope["method"] != "GET" or not HEAVY_READS.fullmatch(scope["path"]):
            await self.app(scope, receive, send)
            return
        export = scope["path"] == EXPORT
        if self.heavy_reads >= self.max_heavy_reads or (export and self.exports >= self.max_exports):
            what = f"{self.max_exports} exports are being sent" if export and self.exports >= self.max_exports \
                else f"{self.max_heavy_reads} heavy reads are running"
            busy = _refuse(429, BUSY, f"{what}: retry after {RETRY_AFTER_S} s", headers={"Retry-After": str(RETRY_AFTER_S)})
            await busy(scope, receive, send)
            return
        self.heavy_reads += 1
        self.exports += export
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.heavy_reads -= 1

        async def send_released(message: Any) -> None:
            if message["type"] == "http.response.start":
                release()  # the read's work is done (an export's snapshot taken): the rest waits on the client
            await send(message)

        try:
            await self.app(scope, receive, send_released)
        finally:
            release()
            self.exports -= export

    def refusal(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if not self.bind.accepts(host):
            shown = repr(host[:100]) if host else "none"
            return _refuse(400, BAD_HOST, f"Host {shown} is not this server's: a server on {self.bind.host} "
                           "answers to localhost, 127.0.0.1 and [::1] (a defence against DNS rebinding)")
        origin = headers.get("origin")
        if origin is not None and _authority(origin) != (host or "").lower():
            return _refuse(403, CROSS_ORIGIN, f"a request from a web page of another origin "
                           f"({origin[:100]!r}) is refused: this API serves its own clients, not pages")
        raw_path = scope.get("raw_path") or scope["path"].encode()
        if _bad_percent(raw_path) or _bad_percent(scope.get("query_string") or b""):
            return _refuse(400, "bad_request", "the URL is not valid percent-encoded UTF-8 (an escape is "
                           "% and two hex digits, and the bytes they make must be UTF-8)")
        if not self.bind.loopback and scope["method"] != "POST" and scope["path"] not in UNGUARDED:
            # (the action routes check their own token, and journal a refusal)
            refused = self.tokens.read_refusal(headers)
            if refused is not None:
                return error_response(refused)
        return None


def _authority(origin: str) -> Any:
    """An Origin's host[:port] as a Host header carries it (no default port), lower case."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    default = {"http": ":80", "https": ":443"}[parts.scheme]
    netloc = parts.netloc.lower()
    return netloc[: -len(default)] if netloc.endswith(default) else netloc


class Outermost:
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
            await error_response(url_too_long())(scope, receive, send)
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
            await error_response(internal(exc))(scope, receive, send)


def _url_length(scope: Scope) -> int:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return len(path) + (1 + len(query) if query else 0)
