"""SGLang's and vLLM's KV-event stream over ZMQ: ``KVEventsAdapter``, the event tree
(``adapter.EventTreeAdapter``) of one DP rank, subscribed with gaps filled from the publisher's
replay socket; ``rank_endpoint``, a DP rank's address."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import zmq

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.wire import DecodeError, decode_batch
from radixtop.adapters.model import Geometry

log = logging.getLogger(__name__)
END_SEQ = -1
"""The replay socket's end-of-replay marker (sequence -1, signed)."""
SUB_HWM = 100_000
"""Batches the subscriber queues before ZMQ drops (a drop is a gap, filled from the replay)."""
MAX_BATCH_BYTES = 64 * 2**20
"""The largest message radixtop takes from a publisher (ZMQ's MAXMSGSIZE: a bigger one cuts the
peer off, and the socket reconnects; what it carried is a gap). A real batch is a few KB to a few MB."""

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


class KVEventsAdapter(EventTreeAdapter):
    """The tree of one DP rank's KV-event stream, subscribed over ZMQ."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 dp_rank: int = 0, bytes_per_token: int = 0, geometry: Geometry | None = None,
                 capacity_tokens: int = 0, medium: str = "GPU", bind: bool = False,
                 name: str | None = None, tokenizer: Any = None, replay_timeout: float = 2.0,
                 max_batch_bytes: int = MAX_BATCH_BYTES):
        """``endpoint``/``replay_endpoint``: the server's ``--kv-events-config`` ``endpoint`` and
        ``replay_endpoint`` (rank 0's; the rank's port offset is applied here). ``bind``: bind
        instead of connect, for a server whose publisher connects (a non-wildcard endpoint).
        ``max_batch_bytes``: the largest message taken (``MAX_BATCH_BYTES``). The rest as
        :class:`EventTreeAdapter`."""
        endpoint = rank_endpoint(endpoint, dp_rank, local=not bind)
        super().__init__(name=name or f"kv-events rank {dp_rank} @ {endpoint}", endpoint=endpoint,
                         replay_endpoint=rank_endpoint(replay_endpoint, dp_rank) if replay_endpoint else None,
                         dp_rank=dp_rank, bytes_per_token=bytes_per_token, geometry=geometry,
                         capacity_tokens=capacity_tokens, medium=medium, tokenizer=tokenizer)
        self.replay_timeout, self.max_batch_bytes, self._bind = replay_timeout, max_batch_bytes, bind
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, SUB_HWM)
        self._sub.setsockopt(zmq.MAXMSGSIZE, max_batch_bytes)
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
        # a connecting SUB that ZMQ cut off for a message over MAXMSGSIZE is not retried by ZMQ:
        # its disconnections are watched, and each is answered with a connect of our own
        monitor = None if self._bind else sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if monitor is not None and monitor in ready:
                    self._reconnect(monitor)
                if sub not in ready:
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
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
            sub.close(linger=0)

    def _reconnect(self, monitor: zmq.Socket) -> None:
        """The publisher went away, or ZMQ cut it off (a message over ``max_batch_bytes``): connect
        again (retried until it answers). What was sent meanwhile is a gap, filled from the replay."""
        while True:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
        with contextlib.suppress(zmq.ZMQError):  # not connected any more: nothing to undo
            self._sub.disconnect(self.endpoint)
        self._sub.connect(self.endpoint)
        self._count("reconnects")
        log.info("kv-events: disconnected from %s (the publisher went away, or sent a message over %d bytes); "
                 "connecting again", self.endpoint, self.max_batch_bytes)

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
        dealer.setsockopt(zmq.MAXMSGSIZE, self.max_batch_bytes)
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
