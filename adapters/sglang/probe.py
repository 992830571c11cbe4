"""The probe: what stays inside SGLang's scheduler process when radixtop's tree lives beside it.

Issue 27's split, its first part: on the Rust tree core (SGLang 0.5.19+'s default) the probe takes
the events the core recorded, once a scheduler loop (``take_events()``, as SGLang's own publisher
does), encodes them as SGLang's own publisher does (a ``KVEventBatch``, ``msgspec`` msgpack: the
wire its ZMQ socket carries) and hands the payload over (``gpu_backend.owner.handover``): never
waiting, never holding more than the hand-over's bound; the mirror beside it applies them to its
tree (``adapters.events.handover``). What the scheduler pays is the take, the encoding and one
non-blocking send; SGLang's publisher pays the take and a queue's put on the scheduler thread, then
the encoding and a ZMQ send on a thread of its own, in the same process.

Frames from the probe: ``HELLO`` first, then ``EVENTS`` (one encoded batch each).
"""

from __future__ import annotations

import json
import time
from typing import Any

from radixtop.gpu_backend.owner.handover import FRAME_MAX, ProbeEnd

EVENTS = 1
"""A frame of one encoded ``KVEventBatch``."""
HELLO = 2
"""The first frame: JSON of what radixtop's side needs that the events do not say (``hello``)."""


def hello(end: ProbeEnd, name: str, dp_rank: int, bytes_per_token: int, capacity_tokens: int) -> bool:
    """Send the first frame: the target's name, its DP rank, its KV bytes per token and its pool's
    capacity in tokens (``adapters.sglang.beside`` reads it before anything else)."""
    info = {"name": name, "dp_rank": dp_rank, "bytes_per_token": bytes_per_token, "capacity_tokens": capacity_tokens}
    return end.send(HELLO, json.dumps(info).encode())


class EventsProbe:
    """Takes a cache's recorded KV events on the scheduler thread and hands them over, encoded."""

    def __init__(self, cache: Any, end: ProbeEnd) -> None:
        import msgspec
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        self.cache = cache
        self.end = end
        self._batch = KVEventBatch
        self._encode = msgspec.msgpack.Encoder().encode
        self.batches = 0
        """Batches numbered so far (each one frame, whether it went or was dropped)."""

    def step(self) -> None:
        """Once a scheduler loop: what waited in the backlog first, then what the core recorded."""
        end = self.end
        if end.held:
            end.flush()
        events = self.cache.take_events()  # (taken even with radixtop's side down: never piled up)
        if events:
            if end.down:  # nobody to send to: numbered and dropped, not encoded
                self.batches += 1
                end.skip()
                return
            self._send(time.time(), events)

    def _send(self, ts: float, events: list[Any]) -> None:
        payload = self._encode(self._batch(ts=ts, events=events))
        if len(payload) > FRAME_MAX and len(events) > 1:  # (a burst: a flush of a large tree) in halves
            half = len(events) // 2
            self._send(ts, events[:half])
            self._send(ts, events[half:])
            return
        self.batches += 1
        if len(payload) > FRAME_MAX:  # one event over the frame: numbered, dropped, seen as lost
            self.end.skip()
            return
        self.end.send(EVENTS, payload)
