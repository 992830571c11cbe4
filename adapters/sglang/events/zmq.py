"""SGLang's and vLLM's KV-event stream over ZMQ: find a server's publisher (``discover``), and
``KVEventsAdapter``, the event tree (``adapter.EventTreeAdapter``) of one DP rank, subscribed with
gaps filled from the publisher's replay socket."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.model import Geometry
from radixtop.adapters.sglang.events.adapter import EventTreeAdapter
from radixtop.adapters.sglang.events.wire import DecodeError, decode_batch

log = logging.getLogger(__name__)
END_SEQ = -1
"""The replay socket's end-of-replay marker (sequence -1, signed)."""
SUB_HWM = 100_000
"""Batches the subscriber queues before ZMQ drops (a drop is a gap, filled from the replay)."""

def rank_endpoint(endpoint: str, dp_rank: int = 0, local: bool = True) -> str:
    """``dp_rank``'s address for a server configured with ``endpoint``: SGLang's and vLLM's
    publishers offset the port by the rank (``tcp://h:5557`` is rank 0, ``:5558`` rank 1;
    ``inproc://x`` becomes ``inproc://x_dp1``). ``local``: a wildcard host (``*``, ``0.0.0.0``,
    where a server binds) is reached as ``127.0.0.1``."""
    if dp_rank < 0:
        raise BadRequest(f"dp_rank must be >= 0, got {dp_rank}")
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BadRequest(f"a tcp endpoint is tcp://host:port, got {endpoint!r}")
        host = "127.0.0.1" if local and host in ("*", "0.0.0.0") else host
        return f"tcp://{host}:{int(port) + dp_rank}"
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}" if dp_rank else endpoint
    if endpoint.startswith("ipc://") and dp_rank == 0:
        return endpoint
    raise BadRequest(f"unsupported KV-events endpoint {endpoint!r} for DP rank {dp_rank} "
                     "(use tcp://host:port; ipc:// only for rank 0)")


WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class Publisher:
    """A server's KV-event publisher as its ``/server_info`` describes it (rank 0's endpoints;
    rank r's ports are these plus r)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    dp_size: int
    block_size: int | None


def _tcp(host: str, port: Any, url_host: str) -> str | None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    if not host or host in WILDCARD_HOSTS:  # where the server binds: reached at the URL's host
        host = url_host
    return f"tcp://{host}:{port}"


def discover(url: str, api_key: str | None = None, timeout: float = 5.0) -> Publisher:
    """The KV-event publisher of the SGLang server at ``url``, from ``/server_info``'s
    ``kv_events`` block (sgl-project/sglang#25844: ``publisher``, ``endpoint_host``,
    ``endpoint_port_base``, ``topic``, ``block_size``, ``dp_size`` and, from 0.5.2x,
    ``replay_endpoint_port_base``; a wildcard host is the URL's). Where the block has no replay
    port (0.5.16), it comes from the ``kv_events_config`` beside it. BadRequest, in one line,
    where the server cannot be read or publishes no KV events over tcp."""
    import httpx

    base = url.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"a server URL is http(s)://host:port, got {url!r}")
    url_host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = httpx.get(f"{base}/server_info", headers=headers, timeout=timeout)
        reply.raise_for_status()
        info = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise BadRequest(f"cannot read {base}/server_info: {type(exc).__name__}: {exc}") from None
    block = info.get("kv_events") if isinstance(info, dict) else None
    if not isinstance(block, dict):
        raise BadRequest(f"{base} publishes no KV events (its /server_info has no kv_events block): start it "
                         "with --kv-events-config '{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'")
    if block.get("publisher") != "zmq":
        raise BadRequest(f"{base} publishes KV events with {block.get('publisher')!r}, not zmq")
    endpoint = _tcp(str(block.get("endpoint_host") or ""), block.get("endpoint_port_base"), url_host)
    if endpoint is None:
        raise BadRequest(f"{base}/server_info's kv_events block has no usable endpoint: {block}")
    replay = None
    if "replay_endpoint_port_base" in block:
        replay = _tcp(str(block.get("endpoint_host") or ""), block["replay_endpoint_port_base"], url_host)
    else:  # 0.5.16: the replay port only in the launch argument
        try:
            config = json.loads(info.get("kv_events_config") or "{}")
            configured = str(config.get("replay_endpoint") or "")
        except (TypeError, ValueError, AttributeError):
            configured = ""
        if configured.startswith("tcp://"):
            host, _, port = configured[len("tcp://"):].rpartition(":")
            replay = _tcp(host, int(port) if port.isdigit() else None, url_host)
    dp_size, block_size = block.get("dp_size"), block.get("block_size")
    return Publisher(endpoint, replay, str(block.get("topic") or ""),
                     dp_size if isinstance(dp_size, int) and dp_size > 0 else 1,
                     block_size if isinstance(block_size, int) else None)


class KVEventsAdapter(EventTreeAdapter):
    """The tree of one DP rank's KV-event stream, subscribed over ZMQ."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 dp_rank: int = 0, bytes_per_token: int = 0, geometry: Geometry | None = None,
                 capacity_tokens: int = 0, medium: str = "GPU", bind: bool = False,
                 name: str | None = None, tokenizer: Any = None, replay_timeout: float = 2.0):
        """``endpoint``/``replay_endpoint``: the server's ``--kv-events-config`` ``endpoint`` and
        ``replay_endpoint`` (rank 0's; the rank's port offset is applied here). ``bind``: bind
        instead of connect, for a server whose publisher connects (a non-wildcard endpoint).
        The rest as :class:`EventTreeAdapter`."""
        endpoint = rank_endpoint(endpoint, dp_rank, local=not bind)
        super().__init__(name=name or f"kv-events rank {dp_rank} @ {endpoint}", endpoint=endpoint,
                         replay_endpoint=rank_endpoint(replay_endpoint, dp_rank) if replay_endpoint else None,
                         dp_rank=dp_rank, bytes_per_token=bytes_per_token, geometry=geometry,
                         capacity_tokens=capacity_tokens, medium=medium, tokenizer=tokenizer)
        self.replay_timeout = replay_timeout
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, SUB_HWM)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        try:
            (self._sub.bind if bind else self._sub.connect)(self.endpoint)
        except zmq.ZMQError as exc:
            self._sub.close()
            self._ctx.term()
            raise BadRequest(f"cannot {'bind' if bind else 'connect'} {self.endpoint}: {exc}") from None
        self._thread = threading.Thread(target=self._run, name=f"kv-events-rank{dp_rank}", daemon=True)
        self._thread.start()

    @classmethod
    def for_ranks(cls, endpoint: str, dp_size: int, replay_endpoint: str | None = None,
                  **kwargs: Any) -> list[KVEventsAdapter]:
        """One adapter (one tree) per DP rank ``0 .. dp_size-1``."""
        return [cls(endpoint, replay_endpoint, dp_rank=rank, **kwargs) for rank in range(dp_size)]

    def release(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if not self._ctx.closed:
            self._ctx.term()

    def __enter__(self) -> KVEventsAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ----- the subscriber thread -----

    def _run(self) -> None:
        sub = self._sub
        try:
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                while not self._stop.is_set():
                    try:
                        frames = sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) != 3:
                        self._count("bad_batches")
                        continue
                    self._receive(int.from_bytes(frames[1], "big", signed=True), frames[2])
        finally:
            sub.close(linger=0)

    def _receive(self, seq: int, payload: bytes) -> None:
        try:
            if seq <= self._last_seq:  # sequences count from 0 again: a new publisher
                self._restart()
            if seq > self._last_seq + 1:
                self._fill_gap(seq)
            self._apply(seq, payload)
        except Exception as exc:  # a bug here must not stop the stream; the tree is suspect
            log.exception("kv-events: applying batch %d failed", seq)
            with self._lock:
                self._last_seq, self._complete = seq, False
                self._last_error = f"batch {seq}: {type(exc).__name__}: {exc}"

    def _fill_gap(self, end: int) -> None:
        """Apply the missed batches up to ``end`` from the replay socket; what it lacks is missed.

        The replay starts one batch early: if the publisher's batch at our last sequence is not
        the one we applied (another ``ts``), a new publisher took the port and counted past our
        sequence, so the tree restarts from its first batch."""
        start = self._last_seq + 1
        got = self._replay(max(start - 1, 0), end)
        if start > 0 and got and got[0][0] == start - 1:
            _, payload = got.pop(0)
            try:
                same = decode_batch(payload).ts == self._last_ts
            except DecodeError:
                same = True  # cannot tell: assume the same publisher
            if not same:
                self._restart()
                start, got = 0, self._replay(0, end)
        expected = start
        for seq, payload in got:
            if seq < expected:
                continue
            if seq > expected:
                self._missed(seq - expected)
            self._apply(seq, payload)
            self._count("replayed_batches")
            expected = seq + 1
        if expected < end:
            self._missed(end - expected)

    def _replay(self, start: int, end: int) -> list[tuple[int, bytes]]:
        """The buffered batches ``start .. end-1`` (SGLang's and vLLM's ROUTER protocol: send the
        start sequence as 8 big-endian bytes; get ``seq, payload`` frames, then seq -1; SGLang
        0.5.23 puts the topic before the sequence, as its live stream does)."""
        if self.replay_endpoint is None:
            return []
        self._count("replays")
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        got: list[tuple[int, bytes]] = []
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout
            while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                if not dealer.poll(int(left * 1000) + 1):
                    break
                frames = dealer.recv_multipart()
                if len(frames) not in (3, 4):  # SGLang 0.5.19+ sends the topic too: "", topic, seq, payload
                    continue
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    return got
                if start <= seq < end:
                    got.append((seq, frames[-1]))
            with self._lock:
                self._last_error = f"replay from {self.replay_endpoint} timed out"
            return got
        finally:
            dealer.close(linger=0)


KvEventsAdapter = KVEventsAdapter
"""The name before 0.2 (kept for one release)."""
