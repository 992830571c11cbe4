"""The files a fleet is described by: the fleet file (workers, one a line), the map (worker ->
its radixtop URL) and the tokens file (URL -> token, mode 0600). Tokens never come from argv."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from radixtop.adapters.errors import BadRequest

PLUGIN_PORT = 30100
"""The radixtop plugin's admin API port inside SGLang (``RADIXTOP_PORT``, default 30100) for DP
rank 0; rank r serves on that port + r, on ``RADIXTOP_HOST`` (127.0.0.1 unless set). The port
does not follow SGLang's own ``--port``: two SGLang servers on one host need their own
``RADIXTOP_PORT`` each, and a map entry each."""


def normal_url(url: str) -> str:
    """``url`` as keys compare it: a scheme (http:// when none), no trailing slash. BadRequest
    when it is not an http(s) URL with a host."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"{url!r} is not an http:// or https:// URL")
    return text


ENGINES = ("sglang", "vllm")
"""The engines a fleet file names by their own URL (``sglang=URL``, ``vllm=URL``)."""


@dataclass(frozen=True)
class FleetEntry:
    """One line of a fleet file: a radixtop server, or an engine's worker (with its radixtop)."""

    url: str
    kind: str
    """``radixtop`` (the URL is an admin API), or one of ``ENGINES`` (the URL is that engine's own)."""
    radixtop_url: str | None = None
    dp_size: int = 1


MAX_FILE_BYTES = 1 << 20
"""The largest fleet, map or tokens file read (1 MiB: some ten thousand workers)."""


def _small_file(path: Path, what: str, private: bool = False) -> bytes:
    """A small plain file's bytes; BadRequest (one line) for anything else, at once: a FIFO
    (opened without blocking, so no writer is waited for), a device such as /dev/zero, a link
    (``private``: the tokens file), a file over MAX_FILE_BYTES."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if private else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise BadRequest(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BadRequest(f"{what} {path} is not a plain file")
        if private:
            if st.st_uid != os.geteuid():
                raise BadRequest(f"{what} {path} belongs to uid {st.st_uid}, not to you")
            if st.st_mode & 0o077:
                raise BadRequest(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read "
                                 f"it; chmod 600 {path}")
        raw = fh.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise BadRequest(f"{what} {path} is larger than {MAX_FILE_BYTES:,} bytes: is it the right file?")
    return raw


def _lines(path: Path, what: str) -> list[tuple[int, list[str]]]:
    try:
        text = _small_file(path, what).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{path} is not UTF-8 text") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if words:
            out.append((number, words))
    return out


LINE = "URL, sglang=URL or vllm=URL [radixtop=URL] [dp=N]"
"""A fleet file's line, as its errors say it."""


def read_fleet_file(path: Path) -> list[FleetEntry]:
    """Lines of ``URL`` (a radixtop server or plugin), ``sglang=URL`` or ``vllm=URL``, then
    ``[radixtop=URL] [dp=N]`` (an engine's worker: its radixtop where given, else its own routes);
    ``#`` comments."""
    entries: list[FleetEntry] = []
    for number, words in _lines(path, "the fleet file"):
        fields: dict[str, str] = {}
        for word in words:
            key, sep, value = word.partition("=")
            if not sep:
                key, value = "radixtop", word
            if key not in ("radixtop", "dp", *ENGINES) or key in fields or not value:
                raise BadRequest(f"{path}:{number}: expected {LINE}, got {word!r}")
            fields[key] = value
        engines = [k for k in ENGINES if k in fields]
        if len(engines) > 1:
            raise BadRequest(f"{path}:{number}: one of sglang= or vllm= a line, got {' and '.join(engines)}")
        try:
            dp = int(fields.get("dp", "1"))
            if dp < 1:
                raise ValueError
            if engines:
                radixtop = normal_url(fields["radixtop"]) if "radixtop" in fields else None
                entries.append(FleetEntry(normal_url(fields[engines[0]]), engines[0], radixtop, dp))
            else:
                entries.append(FleetEntry(normal_url(fields["radixtop"]), "radixtop", None, 1))
        except ValueError:
            raise BadRequest(f"{path}:{number}: dp= wants a whole number of DP ranks >= 1") from None
        except BadRequest as exc:
            raise BadRequest(f"{path}:{number}: {exc.message}") from None
    if not entries:
        raise BadRequest(f"{path} names no worker")
    return entries


def read_map_file(path: Path) -> dict[str, str]:
    """Lines of ``WORKER RADIXTOP_URL``: WORKER is an engine URL (SMG's ``url``), optionally
    ``@DP`` for one rank, or a Dynamo ``instance_id`` (``id`` or ``id@DP``)."""
    mapping: dict[str, str] = {}
    for number, words in _lines(path, "the map file"):
        if len(words) != 2:
            raise BadRequest(f"{path}:{number}: expected WORKER RADIXTOP_URL")
        worker, url = words
        try:
            base, at, rank = worker.rpartition("@") if "@" in worker else (worker, "", "")
            if at and not rank.isdigit():
                raise BadRequest(f"{worker!r}: the DP rank after @ is not a number")
            key = base if base.isdigit() else normal_url(base)
            mapping[f"{key}@{rank}" if at else key] = normal_url(url)
        except BadRequest as exc:
            raise BadRequest(f"{path}:{number}: {exc.message}") from None
    return mapping


def read_tokens_file(path: Path) -> dict[str, str]:
    """Lines of ``URL TOKEN``: a radixtop URL's bearer token, or an engine's API key (SGLang's
    ``--api-key``, SMG's ``--api-key``). Refused unless a plain file of this user's, readable by
    nobody else (mode 0600 or stricter)."""
    raw = _small_file(path, "the tokens file", private=True)
    tokens: dict[str, str] = {}
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2:  # never echo the line: it holds a token
            raise BadRequest(f"{path}:{number}: expected URL TOKEN")
        try:
            tokens[normal_url(words[0])] = words[1]
        except BadRequest:
            raise BadRequest(f"{path}:{number}: the first word is not an http(s) URL") from None
    return tokens


def plugin_url(worker_url: str, dp_rank: int | None, port: int = PLUGIN_PORT) -> str:
    """Where the radixtop plugin inside the SGLang worker at ``worker_url`` serves DP rank
    ``dp_rank``: the worker's host, ``port`` + the rank (the plugin's ``RADIXTOP_PORT`` rule)."""
    parts = urlsplit(normal_url(worker_url))
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port + (dp_rank or 0)}"


def host_of(endpoint: str) -> str | None:
    """The host of a ZMQ endpoint (``tcp://10.0.0.5:5557``); None for a wildcard or no host."""
    parts = urlsplit(endpoint)
    host = parts.hostname
    return None if not host or host in ("*", "0.0.0.0", "::") else host
