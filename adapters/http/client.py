"""RadixtopClient: the adapter contract over a remote radixtop admin API (httpx, synchronous)."""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import orjson

from radixtop.adapters.base import (
    READ_PARAMS,
    CacheAdapter,
    Read,
    check_paths,
    check_query,
    check_reads,
)
from radixtop.adapters.errors import AdapterError, BadRequest, TargetTimeout, TargetUnreachable
from radixtop.adapters.http.bounded import MAX_REPLY_BYTES, bounded_client, deadline, exchange
from radixtop.adapters.http.params import parse_read
from radixtop.adapters.http.wire import (
    WireError,
    audit_entry_from_dict,
    capabilities_from_dict,
    chain_from_dict,
    changes_from_dict,
    children_page_from_dict,
    close_plan_from_dict,
    close_result_from_dict,
    count,
    decode_export_columns,
    diagnosis_from_dict,
    error_from_body,
    evict_result_from_dict,
    export_row_from_dict,
    flush_result_from_dict,
    history_page_from_dict,
    is_count,
    match_from_dict,
    node_detail_from_dict,
    paths_from_dict,
    session_detail_from_dict,
    session_why_from_dict,
    sessions_page_from_dict,
    stats_from_dict,
    subtree_from_dict,
    then_from_dict,
    why_from_dict,
)
from radixtop.adapters.model import (
    MAX_HISTORY_PAGE,
    AuditEntry,
    Capabilities,
    ChainView,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    Diagnosis,
    EvictResultView,
    ExportColumns,
    FlushResultView,
    HistoryPage,
    MatchView,
    NodeDetail,
    PathsView,
    SessionDetail,
    SessionsPage,
    SessionWhyView,
    Stats,
    SubtreeView,
    ThenView,
    WhyView,
)

V = TypeVar("V")


def _plain(value: Any) -> Any:
    """An argument as JSON carries it: integer-likes (numpy's too) as ints, token lists as lists."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if not isinstance(value, (bool, str)) and hasattr(value, "__index__"):
        return operator.index(value)
    return value
MAX_MATCH_QUERY_CHARS = 65_000
"""httpx refuses a URL component over 64 KiB, so a match over HTTP takes ~10k-30k token ids."""


MAX_BUSY_WAIT_S = 5.0
"""The longest a 429's Retry-After is waited at once (within the client's timeout)."""
MAX_EXPORT_BYTES = 4 * 2**30
"""The most a columnar export may take (1M nodes take ~60 MiB)."""
EXPORT_DEADLINE_S = 120.0
"""The least time a whole export gets (``timeout`` where that is more): a server takes seconds to
write 1M nodes, and a slow network more."""


class RadixtopClient(CacheAdapter):
    """Talks to ``radixtop serve``'s API and returns the same views and typed errors as the
    adapter behind it. The token goes in every request's Authorization header: a server bound
    to a public address needs it for reads too (its read-only token will do for them). A server
    busy with heavy reads (429) is asked again after its Retry-After, within ``timeout``.
    ``timeout`` is wall clock over a whole call (``bounded``), retries included; a reply over
    ``max_reply_bytes`` is stopped and refused."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0,
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        if not url.startswith(("http://", "https://")):
            raise BadRequest(f"{url!r} is not an http:// or https:// URL")
        if token and not (token.isascii() and token.isprintable()):
            raise BadRequest("the token must be printable ASCII (it is sent in an HTTP header)")
        self.url = url.rstrip("/")
        self.name = self.url
        self.timeout = timeout
        self.max_reply_bytes = max_reply_bytes
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        # (never through a proxy to a loopback server; others as curl: see proxy.proxy_for)
        self._client = bounded_client(self.url, timeout, self._auth)
        self._batch_reads = True
        self._paths_route = True

    def __repr__(self) -> str:
        return f"RadixtopClient({self.url!r})"

    # ----- transport -----

    @contextmanager
    def _transport(self, seconds: float | None = None) -> Iterator[None]:
        """httpx's failures as the contract's: unreachable or timed out, naming the URL."""
        try:
            yield
        except httpx.TimeoutException:
            raise TargetTimeout(f"{self.url} did not answer within {seconds or self.timeout:g} s") from None
        except httpx.InvalidURL as exc:
            raise BadRequest(f"{self.url}: {exc}") from None
        except httpx.TransportError as exc:
            cause = str(exc) or type(exc).__name__
            raise TargetUnreachable(f"cannot reach {self.url}: {cause}") from None

    def _reply(self, response: httpx.Response) -> Any:
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            text = response.text[:200]
            if response.is_success:
                raise WireError(f"{self.url} answered {response.request.url.path} with something "
                                f"that is not JSON: {text!r}") from None
            raise AdapterError(f"{self.url}: HTTP {response.status_code} "
                               f"{response.reason_phrase}: {text}") from None
        if response.status_code == 429:
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
            raise AdapterError(f"{self.url} is busy: {message or 'too many requests'} (HTTP 429, still after "
                               f"{self.timeout:g} s)")
        if not response.is_success:
            raise error_from_body(response.status_code, body)
        return body

    def _send(self, method: str, path: str, stream: bool = False, *, max_bytes: int | None = None,
              seconds: float | None = None, **kwargs: Any) -> httpx.Response:
        """One request, asked again while the server answers 429 (busy with heavy reads) and
        ``timeout`` allows; then the 429 itself is the answer. The whole call, retries included,
        ends within ``seconds`` (default ``timeout``) of wall clock. ``stream``: only the head is
        read (the caller reads the body); else at most ``max_bytes`` of it (``max_reply_bytes``)."""
        seconds = self.timeout if seconds is None else seconds
        with deadline(seconds) as until:  # retries included
            while True:
                request = self._client.build_request(method, path, **kwargs)
                if stream:
                    with self._transport(seconds):
                        response = self._client.send(request, stream=True)
                else:
                    response = exchange(self._client, request, timeout=seconds, what=self.url,
                                        max_bytes=max_bytes or self.max_reply_bytes)
                if response.status_code != 429:
                    return response
                wait = _retry_after(response)
                if time.monotonic() + wait > until:
                    if stream:
                        with self._transport(seconds):
                            response = self._bounded_body(response)
                    return response
                response.close()
                time.sleep(wait)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._reply(self._send(method, path, **kwargs))

    def _view(self, build: Callable[[Any], V], body: Any) -> V:
        try:
            return build(body)
        except WireError as exc:
            raise WireError(f"unexpected reply from {self.url}: {exc.message}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise WireError(f"unexpected reply from {self.url}: {type(exc).__name__}: {exc}") from None

    def _get(self, build: Callable[[Any], V], path: str, **params: Any) -> V:
        return self._view(build, self._request("GET", path, params=params))

    @staticmethod
    def _session_path(session_id: str) -> str:
        return f"/v1/sessions/{quote(session_id, safe='')}"

    # ----- reads -----

    def capabilities(self) -> Capabilities:
        """The server's, as it answers them to this client's token (read-only, and why, for no
        token or its read-only token: it would refuse every action this client sent, so a face
        hides them and says why instead of reporting a refusal late); read-only without a token
        from a server that answers the same to every token too."""
        caps = self._get(capabilities_from_dict, "/v1/capabilities")
        if not self._auth and not caps.read_only:
            caps = replace(caps, read_only=True, reason="no token: actions need the server's token "
                           "(--token or RADIXTOP_TOKEN)")
        return caps

    def stats(self) -> Stats:
        return self._get(stats_from_dict, "/v1/stats")

    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        return self._get(children_page_from_dict, f"/v1/nodes/{int(node_id)}/children",
                         offset=offset, limit=limit, order=order)

    def subtree(self, node_id: int = 0, depth: int = 3, limit: int = 10, order: str = "bytes",
                min_bytes: int = 0) -> SubtreeView:
        return self._get(subtree_from_dict, f"/v1/nodes/{int(node_id)}/subtree",
                         depth=depth, limit=limit, order=order, min_bytes=min_bytes)

    def chain(self, node_id: int, limit: int = 10_000) -> ChainView:
        return self._get(chain_from_dict, f"/v1/nodes/{int(node_id)}/chain", limit=limit)

    def paths(self, node_ids: Sequence[int]) -> PathsView:
        """One ``GET /v1/paths`` (one hold of the target's owner thread). A server from before
        the route answers it 404 unknown-route: then node by node, and it remembers."""
        ids = check_paths(node_ids)
        if self._paths_route:
            response = self._send("GET", "/v1/paths", params={"node_ids": ",".join(map(str, ids))})
            if not (response.status_code == 404 and b'"not_found"' in response.content[:200]):
                return self._view(paths_from_dict, self._reply(response))
            self._paths_route = False
        return super().paths(ids)

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail:
        return self._get(node_detail_from_dict, f"/v1/nodes/{int(node_id)}",
                         token_offset=token_offset, token_limit=token_limit)

    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        return self._get(sessions_page_from_dict, "/v1/sessions", order=order, offset=offset, limit=limit,
                         contains=contains, reverse=reverse)

    def session(self, session_id: str) -> SessionDetail:
        return self._get(session_detail_from_dict, self._session_path(session_id))

    def encode(self, text: str) -> list[int]:
        """The server's tokenizer's ids for ``text`` (Unsupported where it has none)."""
        body = self._request("GET", "/v1/encode", params={"text": text})
        return self._view(lambda b: [count(t, f"tokens[{i}]") for i, t in enumerate(b["tokens"])], body)

    def match(self, tokens: list[int]) -> MatchView:
        return self._get(match_from_dict, "/v1/match", tokens=self._match_query(tokens))

    def why(self, tokens: list[int]) -> WhyView:
        return self._get(why_from_dict, "/v1/why", tokens=self._match_query(tokens))

    def why_session(self, session_id: str) -> SessionWhyView:
        return self._get(lambda d: session_why_from_dict(d, session_id), "/v1/why", session=session_id)

    def history(self, after: int = 0, served_after: int = 0, limit: int = MAX_HISTORY_PAGE) -> HistoryPage:
        return self._get(lambda d: history_page_from_dict(d, after, served_after), "/v1/history", after=after,
                         served_after=served_after, limit=limit)

    def then(self, at: float | None = None) -> ThenView:
        if at is None:
            return self._get(then_from_dict, "/v1/then")
        return self._get(then_from_dict, "/v1/then", at=repr(float(at)))

    def then_children(self, at: float | None, node_id: int = 0, offset: int = 0, limit: int = 100) -> ChildrenPage:
        query: dict[str, Any] = {"node": int(node_id), "offset": offset, "limit": limit}
        if at is not None:
            query["at"] = repr(float(at))
        return self._get(children_page_from_dict, "/v1/then/children", **query)

    @staticmethod
    def _match_query(tokens: list[int]) -> str:
        """The token ids as one URL can carry them, or BadRequest."""
        check_query(tokens)
        query = ",".join(str(int(t)) for t in tokens)
        if len(query) > MAX_MATCH_QUERY_CHARS:
            raise BadRequest(f"{len(tokens)} token ids take {len(query)} characters, over the "
                             f"{MAX_MATCH_QUERY_CHARS} one HTTP match can carry: match a shorter prefix")
        return query

    def changes(self, since: int) -> Changes:
        return self._get(changes_from_dict, "/v1/changes", since=since)

    def diagnose(self, idle_after_s: float = 600.0) -> Diagnosis:
        return self._get(diagnosis_from_dict, "/v1/doctor", idle_after_s=idle_after_s)

    _READ_VIEWS: dict[str, Callable[[Any], Any]] = {
        "capabilities": capabilities_from_dict, "stats": stats_from_dict, "children": children_page_from_dict,
        "subtree": subtree_from_dict,
        "chain": chain_from_dict, "node": node_detail_from_dict, "sessions": sessions_page_from_dict,
        "session": session_detail_from_dict, "match": match_from_dict, "changes": changes_from_dict,
        "paths": paths_from_dict,
    }

    def read_many(self, reads: Sequence[Read]) -> list[Any]:
        """One ``GET /v1/read`` (one hold of the target's owner thread). Each read is checked
        here as the server checks it, so a bad argument is that read's error, not the batch's.
        A server from before the route answers it 404 unknown-route: then one by one, and it
        remembers."""
        checked = check_reads(reads)
        if not self._batch_reads:
            return super().read_many(checked)
        results: list[Any] = [None] * len(checked)
        items: list[dict[str, Any]] = []
        sent: list[int] = []
        for i, (op, args) in enumerate(checked):
            try:
                items.append(self._read_item(i, op, args))
                sent.append(i)
            except BadRequest as exc:
                results[i] = exc
        if not items:
            return results
        response = self._send("GET", "/v1/read", params={"reads": orjson.dumps(items).decode()})
        if response.status_code == 404 and b'"not_found"' in response.content[:200]:  # no such route
            self._batch_reads = False
            return super().read_many(checked)
        answers = self._view(lambda b: b["results"], self._reply(response))
        if not isinstance(answers, list) or len(answers) != len(items):
            raise WireError(f"unexpected reply from {self.url}: {len(items)} reads answered with "
                            f"{len(answers) if isinstance(answers, list) else type(answers).__name__}")
        for i, answer in zip(sent, answers):
            op = checked[i][0]
            results[i] = (self._view(self._READ_VIEWS[op], answer["ok"]) if isinstance(answer, dict) and "ok" in answer
                          else error_from_body(answer.get("status", 500) if isinstance(answer, dict) else 500, answer))
        return results

    def _read_item(self, i: int, op: str, args: tuple[Any, ...]) -> dict[str, Any]:
        """Read ``i`` as /v1/read takes it, or the BadRequest the server would answer."""
        if op == "match" and args:
            self._match_query(args[0])
        item = {"op": op, **{name: _plain(value) for name, value in zip(READ_PARAMS[op], args)}}
        parse_read(i, item)  # the server's own check
        return item

    def export(self) -> Iterator[dict[str, Any]]:
        """The server's NDJSON export, one dict per line as it arrives (a header, then nodes). Its
        head and header line come within ``timeout``; the rows as fast as the server sends them
        (each socket read within ``timeout``): a stream of 1M nodes takes as long as it takes."""
        response = self._send("GET", "/v1/export", stream=True)
        try:
            with self._transport():
                with deadline(self.timeout):
                    if not response.is_success:
                        self._reply(self._bounded_body(response))
                    lines = (line for line in response.iter_lines() if line.strip())
                    first = next(lines, "null")
                header = self._view(json.loads, first)
                if not isinstance(header, dict) or not is_count(header.get("node_count")):
                    raise WireError(f"{self.url}: the export does not start with a header line")
                yield header
                rows = 0
                for line in lines:
                    yield export_row_from_dict(self._view(json.loads, line))
                    rows += 1
                if rows != header["node_count"]:
                    raise AdapterError(f"the export from {self.url} ended after {rows} of "
                                       f"{header['node_count']} nodes")
        finally:
            response.close()

    def _bounded_body(self, response: httpx.Response) -> httpx.Response:
        """A streamed error reply, read up to ``max_reply_bytes``, as a whole reply."""
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > self.max_reply_bytes:
                break
        response.close()
        return httpx.Response(response.status_code, headers={"content-type": response.headers.get("content-type", "")},
                              content=bytes(body[: self.max_reply_bytes]), request=response.request,
                              extensions={"reason_phrase": response.extensions.get("reason_phrase", b"")})

    def export_columns(self) -> ExportColumns:
        """The server's columnar export (one response, int64 columns: no object per node), within
        ``EXPORT_DEADLINE_S`` (or ``timeout`` where more) and ``MAX_EXPORT_BYTES``."""
        response = self._send("GET", "/v1/export", params={"format": "columns"}, max_bytes=MAX_EXPORT_BYTES,
                              seconds=max(self.timeout, EXPORT_DEADLINE_S))
        if not response.is_success:
            self._reply(response)
        return self._view(decode_export_columns, response.content)

    def audit(self, limit: int = 100, offset: int = 0) -> list[AuditEntry]:
        """The server's audit log, newest first (not part of the adapter contract)."""
        body = self._request("GET", "/v1/audit", params={"limit": limit, "offset": offset})
        return self._view(lambda b: [audit_entry_from_dict(e) for e in b["entries"]], body)

    # ----- actions -----

    def plan_close(self, session_id: str) -> ClosePlanView:
        body = self._request("POST", self._session_path(session_id) + "/close", params={"dry_run": "true"})
        return self._view(close_plan_from_dict, body)

    def _act(self, path: str, **kwargs: Any) -> Any:
        """POST an action. Unanswered is not undone: a server that was only slow (or stopped,
        then continued) still carries out what it received, so a timeout says so."""
        try:
            return self._request("POST", path, **kwargs)
        except TargetTimeout as exc:
            raise TargetTimeout(f"{exc.message}; the action may still be done (the audit log "
                                "lists what ran)") from None

    def close_session(self, session_id: str) -> CloseResultView:
        body = self._act(self._session_path(session_id) + "/close")
        return self._view(lambda b: close_result_from_dict(b["result"]), body)

    def evict(self, num_tokens: int) -> EvictResultView:
        return self._view(evict_result_from_dict, self._act("/v1/evict", json={"tokens": num_tokens}))

    def flush(self) -> FlushResultView:
        return self._view(flush_result_from_dict, self._act("/v1/flush"))

    def release(self) -> None:
        self._client.close()


def _retry_after(response: httpx.Response) -> float:
    """A 429's Retry-After in seconds (1 if absent or a date), at most MAX_BUSY_WAIT_S."""
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.05), MAX_BUSY_WAIT_S)
    except ValueError:
        return 1.0
