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

import collections
import json
import logging
import time
from typing import Any

from radixtop.adapters.events.handover import EVENTS
from radixtop.adapters.owned.records import CAUSE, OP, Walk, split_long, wrap_after
from radixtop.adapters.sglang.records import admitted_begins, released_request
from radixtop.gpu_backend.history import EVICT_ACTION, FLUSHED
from radixtop.gpu_backend.owner.handover import BACKLOG_BYTES, SOCKET_BUFFER, ProbeEnd

log = logging.getLogger("radixtop.sglang")

# EVENTS (a frame of one encoded ``KVEventBatch``): the kind radixtop's side applies to its tree
HELLO = 2
"""The first frame: JSON of what radixtop's side needs that the events do not say (``hello``)."""
CALL = 3
"""From radixtop's side: JSON ``{"id", "op", "args"}``, one of ``OPS``, run between the scheduler's steps."""
REPLY = 4
"""To radixtop's side: JSON ``{"id", "result"}`` or ``{"id", "error": {"code", "message"}}``, sent
after the events the scheduler recorded before it (an action's own events included)."""
RECORDS = 5
"""To radixtop's side: msgpack of a list of a Python core's change records (``adapters.sglang.records``)."""
CAUSED = 7
"""To radixtop's side (the Rust core's events): JSON ``{"cause", "who"}`` between the events, before
those of an action radixtop asked for (``CAUSES``) and, with an empty cause, after them: its
removals are told apart from SGLang's own evictions for room."""
REFUSED = 9
"""To a ``radixtop attach`` the probe turns away (``AttachPoint``): UTF-8 text, why; its end
closes after it."""
SERVED = 8
"""To radixtop's side (the Rust core's events): msgpack of ``[[session_id, rid, prompt_tokens,
cached_tokens, "begin" | "finish" | "abort", prompt_ids, output_ids, at, begun], ...]``, the
requests SGLang admitted (``begin``: ``records.admitted_begins``, with SGLang's own hit; output_ids
null) and gave back (``records.released_request``; ``begun``: its begin was told at its admission,
else this row tells it too) since the last; their token ids as the bytes of an ``array('q')``,
null where they would not fit a frame or the socket is behind; ``at``: when SGLang admitted it or
gave it back. After that step's events: a session's hits over time beside, and what a recording
replays."""
AGAIN_MOST = 8192
"""The requests' rows or ``OP`` records of frames dropped that wait to be sent again, at most
(without their token ids: SGLang's memory and the encoding's time stay bounded while radixtop's
process is behind); past it the oldest go (under an overload that long the history has its gaps)."""
SERVED_A_FRAME = 1024
"""Requests a ``SERVED`` frame holds at most."""
SERVED_MOST = 65_536
"""``SERVED`` rows the probe keeps for its next step at most: its wraps stay on SGLang's methods
while nobody steps it (radixtop's process down, the probe stopped), and what they keep is
SGLang's memory. Past it a request is not told (a begin not told: its end tells it whole)."""
OPS = ("sync", "stats", "capabilities", "diagnose", "evict", "flush", "close", "state", "resync")
"""What radixtop's side may ask of SGLang itself: ``sync`` (nothing: its reply comes after every
event recorded so far), its own figures, and its own actions; on a Python core, ``state`` (what
the doctor reads of the scheduler) and ``resync`` (the whole tree's records again)."""
ACTIONS = ("evict", "flush", "close", "resync")
CAUSES = {"evict": EVICT_ACTION, "flush": FLUSHED}
"""The actions whose removals the records tell the cause of (``records.CAUSE``: radixtop's
history beside says an operator's evict or flush freed them, not the pool's need)."""
AT_ONCE = ("evict", "flush", "close")
"""Answered while the whole tree is on its way (``RecordsProbe.busy``): their replies carry
SGLang's own counts, nothing radixtop's side reads against its copy; the other calls' replies
(a sync's, the doctor's ``state``) stand for a moment of the tree, and wait until it is whole."""


def hello(end: ProbeEnd, name: str, dp_rank: int, bytes_per_token: int, capacity_tokens: int,
          missed: int = 0, **more: Any) -> bool:
    """Send the first frame: the target's name, its DP rank, its KV bytes per token and its pool's
    capacity in tokens (``adapters.sglang.beside`` reads it before anything else), and ``missed``:
    the batches taken before this process was started (a restart: its tree lacks them); ``more``:
    a Python core's (``tree``: "radix", its ``page_size``, whether it has ``sessions``)."""
    info = {"name": name, "dp_rank": dp_rank, "bytes_per_token": bytes_per_token, "capacity_tokens": capacity_tokens,
            "missed": missed, **more}
    return end.send(HELLO, json.dumps(info).encode())


def _ignored(_name: str, _exc: Exception) -> None:
    """What a request's hook raises: never SGLang's call down for it (that request is not told)."""


def _told_whole(row: tuple) -> tuple:
    """An end row whose begin was never heard: it tells its begin too (``begun`` false)."""
    return (*row[:8], False)


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
        self.served: list[tuple] = []
        """The requests SGLang admitted and gave back since the last step (``SERVED`` rows)."""
        self.begun: set[str] = set()
        """The requests whose begin was told at their admission (``hook_admissions``), until they are given back."""
        self.again: list[tuple] = []
        """End rows of ``SERVED`` frames dropped, sent again once the socket keeps up (``AGAIN_MOST``)."""
        self.events_seq = -1
        """The frame number of the last batch of events numbered (other frames are numbered too:
        a ``SERVED``, a ``CAUSED``, a reply)."""
        self._hook_served(cache)

    def _hook_served(self, cache: Any) -> None:
        """SGLang's ``on_release`` wrapped on the instance: each request it gives back told
        (``released_request``, and when: a row appended)."""
        def released(_result: Any, req: Any, *a: Any, **k: Any) -> None:
            if len(self.served) >= SERVED_MOST:
                self.begun.discard(str(getattr(req, "rid", "")))
                return
            told = released_request(req)
            if told is not None:
                begun = told[1] in self.begun
                self.begun.discard(told[1])
                self.served.append((*told, time.time(), begun))

        wrap_after(cache, "on_release", released, _ignored)

    def restarted(self, end: ProbeEnd) -> None:
        """A new process beside (on ``end``): no request is told as begun to it but those whose
        begin rows are yet to go (what the old one heard of the others is gone with it: their ends
        tell them whole)."""
        self.end = end
        self.begun = {row[1] for row in self.served if row[4] == "begin"}  # (these rows are yet to go)
        self.served = [row if row[4] == "begin" or row[1] in self.begun else _told_whole(row) for row in self.served]
        self.again = [_told_whole(row) for row in self.again]

    def hook_admissions(self, scheduler: Any) -> None:
        """SGLang's ``get_new_batch_prefill`` wrapped on the scheduler's instance: each request it
        admits told then (a ``begin`` row, ``records.admitted_begins``), not when it is given back,
        so the history's ops and a recording's replay run SGLang's requests as concurrently as it
        ran them (where that raises, its requests are told whole at their ends)."""
        def admitted(plan: Any, *a: Any, **k: Any) -> None:
            if len(self.served) >= SERVED_MOST:
                return
            now = time.time()
            for sid, rid, prompt, cached, prompt_ids in admitted_begins(plan, self.begun):
                self.served.append((sid, rid, prompt, cached, "begin", prompt_ids, None, now, False))

        wrap_after(scheduler, "get_new_batch_prefill", admitted, _ignored)

    def step(self) -> None:
        """Once a scheduler loop: what waited in the backlog first, then what the core recorded,
        then the requests given back."""
        end = self.end
        if end.held:
            end.flush()
        events = self.cache.take_events()  # (taken even with radixtop's side down: never piled up)
        if events:
            if end.down:  # nobody to send to: numbered and dropped, not encoded
                self.batches += 1
                self.events_seq = end.seq
                end.skip()
            else:
                self._send(time.time(), events)
        if self.again and not end.held and not end.down:  # (the socket keeps up again)
            self.served[:0], self.again = self.again, []
        if self.served:
            served, self.served = self.served, []
            if not end.down:
                unheard: set[str] = set()
                again = self.again
                for at in range(0, len(served), SERVED_A_FRAME):
                    for row in self._send_served(served[at:at + SERVED_A_FRAME], unheard):
                        if row[4] == "begin":  # (told whole at its end)
                            self.begun.discard(row[1])
                        elif not end.down:  # (an end dropped: sent again, never a begin left running)
                            again.append((*row[:5], None, None, row[7], row[1] not in unheard and row[8]))
                if len(again) > AGAIN_MOST:
                    del again[:-AGAIN_MOST]
            else:  # (begins nobody heard: those requests are told whole at their ends)
                self.begun.difference_update(row[1] for row in served if row[4] == "begin")

    def cleared(self) -> None:
        """SGLang flushed the cache (its ``flush_cache`` answered it did: nothing running, the tree
        reset): an ``AllBlocksCleared`` batch after the flush's own events, which the Rust core
        does not send (it tells each block removed, and none it never told radixtop's side of): a
        tree beside that missed events (radixtop's process started or attached after SGLang's
        first requests) is whole again from here."""
        from sglang.srt.disaggregation.kv_events import AllBlocksCleared

        self._send(time.time(), [AllBlocksCleared()])

    def _send_served(self, rows: list[tuple], unheard: set[str] | None = None) -> list[tuple]:
        """``rows`` in a ``SERVED`` frame, in halves where over a frame; a request alone over one
        without its token ids, and not told where it still is (an id of a megabyte). While the
        socket is behind (frames wait in the backlog) the rows go without their ids: a frame the
        backlog cannot take is a gap in the tree's events, and requests' ids are not worth one.
        The rows of the frames dropped (the backlog full) are returned; ``unheard`` gets the ids of
        the begins among them (and of a begin not told), and a later end row of one of them tells
        its begin too."""
        if unheard is None:
            unheard = set()
        if unheard:
            rows = [_told_whole(row) if row[4] != "begin" and row[1] in unheard else row for row in rows]
        if self.end.held:
            rows = [(*row[:5], None, None, *row[7:]) for row in rows]
        payload = self._encode(rows)
        if len(payload) <= self.end.frame_max:
            if self.end.send(SERVED, payload):
                return []
            unheard.update(row[1] for row in rows if row[4] == "begin")
            return rows
        if len(rows) > 1:
            half = len(rows) // 2
            dropped = self._send_served(rows[:half], unheard)
            return dropped + self._send_served(rows[half:], unheard)
        if rows[0][5] is not None or rows[0][6] is not None:
            return self._send_served([(*rows[0][:5], None, None, *rows[0][7:])], unheard)
        if rows[0][4] == "begin":  # (an id of a megabyte: never told, nor its end as begun)
            unheard.add(rows[0][1])
            self.begun.discard(rows[0][1])
        return []

    def _send(self, ts: float, events: list[Any]) -> None:
        payload = self._encode(self._batch(ts=ts, events=events))
        most = self.end.frame_max
        if len(payload) > most and len(events) > 1:  # (a burst, a long prefill) in halves
            half = len(events) // 2
            self._send(ts, events[:half])
            self._send(ts, events[half:])
            return
        self.batches += 1
        self.events_seq = self.end.seq
        if len(payload) > most:  # one event over the frame: numbered, dropped, seen as lost
            self.end.skip()
            return
        self.end.send(EVENTS, payload)


SEND_EVERY_S = 0.05
"""A Python core's records wait in the recorder at most this long between sends (a read's sync
sends them at once: its reply comes after them)."""
SEND_RECORDS = 2048
"""... or until this many wait."""
PENDING_MOST = 200_000
"""The changes that may wait behind the whole tree's last frames (the scheduler process's memory:
~100-200 bytes each); past them radixtop's process is stopped and started again later."""
PENDING_BYTES = 64 << 20
"""The whole tree's frames that may wait, encoded and not yet sent (the scheduler process's
memory); past them radixtop's process is stopped and started again later."""
SNAPSHOT_CHUNK = 512
"""Records of the whole tree a frame (halved where over a frame)."""
SNAPSHOT_STEP_S = 0.001
"""The scheduler's time a step for the whole tree while it is on its way: its walk (``Walk``),
the encoding and the sends (each send only where the socket took the one before)."""
SNAPSHOT_NODES = 4096
"""Nodes walked a step at most (fewer where ``SNAPSHOT_STEP_S`` passed)."""
MORE = 6
"""From radixtop's side, while the whole tree is on its way: it took frames of it (one ``MORE``
for what it took at once; and once when it is up and reading, ``STARTING_S``). It wakes a
scheduler that sleeps on idle (``--sleep-on-idle``: its poller waits on the hand-over's socket),
so the walk goes on at the idle scheduler's pace, not one step a second; the probe reads it and
drops it."""


class RecordsProbe:
    """Hands over a Python core's change records (``records.ChangeRecorder``), once a scheduler
    loop: one msgpack encoding of the list, one non-blocking send (halves where over a frame; a
    prompt longer than a frame in ``PART`` records). What it could not send is counted lost and
    radixtop's side asks for the whole tree again (``resync``)."""

    def __init__(self, recorder: Any, end: ProbeEnd) -> None:
        import msgspec

        self.recorder = recorder
        self.end = end
        self._encode = msgspec.msgpack.Encoder().encode
        self.batches = 0
        self._sent_at = 0.0
        self._walk: Walk | None = None
        self._unframed: list[tuple] = []
        """The whole tree's records walked and not yet encoded (its end: thousands, over steps)."""
        self._out_bytes = 0
        self._chunk = SNAPSHOT_CHUNK
        self._out: collections.deque[bytes] = collections.deque()
        """The whole tree's next frames, encoded (one chunk's: at most a long prompt's parts)."""
        self._again: list[tuple] = []
        """The ``OP`` records of frames dropped (the backlog full), sent again with the next: the
        whole tree sent again mends the copy's gap, not the requests' begins and ends."""

    def restarted(self, end: ProbeEnd) -> None:
        """A new process beside (on ``end``): no request is told as begun to it but those whose
        begin records are yet to go (their ends tell the others whole), and no end of one whose
        begin only the old one heard."""
        self.end = end
        records = self.recorder.records
        if type(records) is list:  # (not a stopped recorder's, that keeps nothing)
            waiting = self._again + records
            begins = {record[3] for record in waiting if record[0] == OP and record[1] == "begin"}
            self.recorder.begun.intersection_update(begins)
            records[:] = [record for record in waiting
                          if record[0] != OP or record[1] not in ("finish", "abort") or record[3] in begins]
        self._again = []

    def start(self) -> None:
        """At (re)start, and for a resync: the whole tree, walked a slice a step (``Walk``: what
        SGLang changes meanwhile goes in it, as the nodes are then) and sent as the socket takes
        it; never more than one frame waits in the backlog, so none is dropped."""
        if self._walk is not None:
            self._walk.stop()
        self._walk = Walk(self.recorder)
        self._chunk = SNAPSHOT_CHUNK
        self._drop_frames()
        self.stream()

    def _drop_frames(self) -> None:
        self._unframed = []
        self._out.clear()
        self._out_bytes = 0

    @property
    def busy(self) -> bool:
        """The whole tree is on its way: radixtop's calls but ``AT_ONCE``'s wait (a reply would
        overtake it)."""
        return self._walk is not None

    def stream(self) -> None:
        """One step of the whole tree: the changes since the last one, then as much of the walk
        as ``SNAPSHOT_STEP_S`` allows, its records encoded at once (frames of bytes wait, not
        tuples: nothing of the walk outlives the step for the garbage collector to go through),
        each frame sent where the socket took the one before."""
        walk, end = self._walk, self.end
        if walk is None:
            return
        started = time.monotonic()
        if not end.down:
            ends = started + SNAPSHOT_STEP_S
            self._frames(walk.step(most=0), ends)
            self._send_walked()
            until = started + SNAPSHOT_STEP_S * 0.6  # (the walk's part; the encoding of its records the rest)
            first = True  # (a slice a step at least, however short the time)
            while not walk.done and not self._unframed and not self._out and not end.held and not end.down \
                    and (first or time.monotonic() < until):
                first = False
                self._frames(walk.step(most=SNAPSHOT_NODES, until=until), ends)
                self._send_walked()
        if end.down or (walk.done and not self._unframed and not self._out):
            walk.stop()
            self._walk = None
            self._drop_frames()

    def _frames(self, records: list[tuple], until: float) -> None:
        """The walk's records as frames (``SNAPSHOT_CHUNK`` records a frame, halved where over), a
        frame at least, then until ``time.monotonic()`` passes ``until``; the rest the next step."""
        records = self._unframed + records if self._unframed else records
        out, most, at = self._out, self.end.frame_max, 0
        while at < len(records):
            if at and time.monotonic() > until:
                break
            size = self._chunk
            chunk = records[at : at + size]
            payload = self._encode(chunk)
            if len(payload) > most and len(chunk) > 1:  # fewer records a frame from now on
                self._chunk = max(1, size // 2)
                continue
            at += len(chunk)
            if len(payload) > most:  # one record over a frame: in parts
                parts = [self._encode([part]) for part in split_long(chunk[0], most // 2)]
            else:
                parts = [payload]
            out.extend(parts)
            self._out_bytes += sum(len(part) for part in parts)
            self._chunk = min(SNAPSHOT_CHUNK, size * 2)  # (back up: one long prompt shrinks one chunk)
        self._unframed = records[at:] if at < len(records) else []

    def _send_walked(self) -> None:
        end, out = self.end, self._out
        while out and not end.held and not end.down:
            payload = out.popleft()
            self._out_bytes -= len(payload)
            self.batches += 1
            end.send(RECORDS, payload)

    def step(self, now: bool = False) -> None:
        """Once a scheduler loop: the whole tree's next slice while it is on its way; then the
        records sent where ``SEND_EVERY_S`` passed since the last send, or ``SEND_RECORDS`` of
        them wait, or ``now`` (a reply goes next: after them); otherwise they wait in the
        recorder (a send costs the scheduler ~20-30 us: one a step was ~0.8% of it, 5 ms steps)."""
        end = self.end
        if end.held:
            end.flush()
        if self._walk is not None:
            self.stream()
            if self._walk is not None:
                waiting = len(self.recorder.records) + len(self._unframed)
                if self._out_bytes > PENDING_BYTES or waiting > PENDING_MOST:  # its side too slow for this server
                    log.warning("radixtop: its process beside the scheduler took the tree too slowly (%.1f MiB of it and "
                                "%d changes waiting): stopped, and started again later", self._out_bytes / (1 << 20),
                                waiting)
                    self._walk.stop()
                    self._walk = None
                    self._drop_frames()
                    self.recorder.take()
                    end.close()
                return
        records = self.recorder.records
        if not records and not self._again:
            return
        started = time.monotonic()
        if not now and len(records) < SEND_RECORDS and started - self._sent_at < SEND_EVERY_S and not end.down:
            return
        self._sent_at = started
        records = self.recorder.take()
        if end.down:
            self.batches += 1
            end.skip()
            self._again = []
            return
        if self._again and not end.held:  # (the socket keeps up again)
            records, self._again = self._again + records, []
        self._send(records)

    def _send(self, records: list[tuple]) -> None:
        most = self.end.frame_max
        payload = self._encode(records)
        if len(payload) > most:
            if len(records) > 1:
                half = len(records) // 2
                self._send(records[:half])
                self._send(records[half:])
                return
            parts = split_long(records[0], most // 2)
            if len(parts) > 1:
                for part in parts:
                    self._send([part])
                return
        self.batches += 1
        if len(payload) > most:
            self.end.skip()
            return
        if not self.end.send(RECORDS, payload) and not self.end.down:  # (sent again without their ids)
            self._again.extend((*record[:4], None, *record[5:]) for record in records if record[0] == OP)
            if len(self._again) > AGAIN_MOST:
                del self._again[:-AGAIN_MOST]


class CoreOps:
    """What radixtop's process asks of SGLang itself where the tree is a Python core's and lives
    beside (``adapters.sglang.mirror``): SGLang's own totals and counters, its close, evict and
    flush, and what the doctor reads of the scheduler; run on the scheduler's thread between its
    steps (``BesideProcess._answer``). No index, no ledger here: those are kept beside."""

    def __init__(self, cache: Any, name: str, closer: Any, buckets: Any = None, running_requests: Any = None,
                 waiting_requests: Any = None, model: str = "") -> None:
        from radixtop.adapters.sglang.counters import kv_geometry, observe
        from radixtop.adapters.sglang.trees import tree_for

        self.cache = cache
        self.name = name
        self.tree = tree_for(cache)
        self.allocator = cache.token_to_kv_pool_allocator
        kv_pool = self.allocator.get_kvcache() if hasattr(self.allocator, "get_kvcache") else None
        self.geometry = kv_geometry(kv_pool, self.tree.page_size, model)
        self.bpt = self.geometry.bytes_per_token
        self._close = closer or self.tree.release_session
        self._buckets = buckets
        self.running_requests = running_requests
        self.waiting_requests = waiting_requests
        self.version = 0
        self.closes = self.freed_by_close_tokens = self.evicted_tokens = 0
        self.prompt_tokens = self.cached_tokens = 0
        observe(cache, self)  # SGLang's own evictions, requests and closes, counted as they happen

    def _changed(self) -> None:
        self.version += 1

    def release(self) -> None:
        pass

    def stats(self) -> Any:
        """SGLang's totals (no node or session counts: those are the mirror's)."""
        from radixtop.adapters.sglang.inproc import totals

        return totals(self)

    sync = stats
    """A ``sync``'s reply: SGLang's totals as of that step (the reads it brings up to that step
    take them from it, a stats read among them with no call of its own)."""

    def close(self, session_id: str) -> dict[str, int]:
        """Close as SGLang's /close_session does; the slots it freed."""
        before = int(self.allocator.available_size())
        self._close(session_id)
        return {"freed_tokens": int(self.allocator.available_size()) - before}

    def evict(self, num_tokens: int) -> Any:
        from radixtop.adapters.model import EvictResultView

        tokens, nodes = self.tree.evict_counted(num_tokens)
        self._changed()
        return EvictResultView(num_tokens, tokens, nodes, tokens * self.bpt)

    def flush(self) -> Any:
        from radixtop.adapters.model import FlushResultView

        tokens, nodes = self.tree.evict_counted(self.tree.evictable_size())
        self._changed()
        locked = self.tree.protected_size()
        message = (f"freed {tokens:,} tokens; {locked:,} stay locked by running requests"
                   if locked else f"freed {tokens:,} tokens")
        return FlushResultView(tokens, nodes, tokens * self.bpt, True, message)

    def state(self) -> dict[str, Any]:
        """What the doctor reads of the scheduler: the pool, the nodes the running requests lock
        (their ids, and sessions), the waiting queue's length and head."""
        from radixtop.adapters.sglang.doctor import head_need

        held = self.running_requests() if self.running_requests is not None else None
        waiting = self.waiting_requests() if self.waiting_requests is not None else None
        head = waiting[0] if waiting else None
        return {
            "capacity": int(self.allocator.size), "available": int(self.allocator.available_size()),
            "evictable": self.tree.evictable_size(),
            "holders": None if held is None else [
                [_node_id(getattr(r, "last_node", None)), getattr(r, "session_id", None)] for r in held],
            "waiting": None if waiting is None else len(waiting),
            "head": None if head is None else [str(getattr(head, "rid", "?")), head_need(head)],
            "buckets": self._buckets() if self._buckets is not None else None,
        }


def _op_of(payload: bytes) -> Any:
    try:
        call = json.loads(payload)
        return call.get("op") if isinstance(call, dict) else None
    except ValueError:
        return None


def _node_id(node: Any) -> int | None:
    """A request's last node's id (0.5.17+'s unified cache keeps the id itself)."""
    return node if isinstance(node, int) else getattr(node, "id", None)


RESTART_FIRST_S = 0.5
"""The wait before radixtop's process is started again after it went down; doubled each time
it goes down again within ``RESTART_QUIET_S``, up to ``RESTART_MOST_S``."""
RESTART_MOST_S = 30.0
RESTART_QUIET_S = 60.0
START_TRIES = 5
"""Starts in a row after which a process beside that went down each time before it said it was
up (an import error, a setting it refuses) is not started again: the probe raises, saying why
(each start walks the whole tree on the scheduler's thread, and would forever)."""
LOOK_S = 0.5
"""How often the scheduler's loop looks whether radixtop's process is still there (a waitpid)."""
STALLED_S = 10.0
"""radixtop's process that has taken no frame for this long while frames were dropped for it
(alive but not reading: hung) is killed, and started again."""
STARTING_S = 60.0
"""... this long, until it was first heard from (its imports take seconds on a loaded machine;
the whole tree's first frames fill the socket before it reads one: found at 1M nodes, where it
was killed while starting)."""


class CallBell:
    """Rings when radixtop's process sent a call: a thread of the scheduler's process that waits
    in ``poll`` on the hand-over's socket (the GIL released), sets ``rung`` and waits until the
    scheduler's step took the calls (``heard``). So the step looks at one attribute, not the
    socket, and a call costs a wake of this thread (the dashboard: about one a second)."""

    def __init__(self, sock: Any, wake: Any = None) -> None:
        """``wake``: called when it rings (an owner that sleeps between steps: radixtop's engine)."""
        import select
        import threading

        self.rung = False
        self._wake = wake
        self._sock = sock
        self._heard = threading.Event()
        self._stop = threading.Event()
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._thread = threading.Thread(target=self._run, name="radixtop-probe-bell", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready = self._poll.poll(1000)
            except (OSError, ValueError):
                return
            if not ready or self._stop.is_set():
                continue
            self._heard.clear()
            self.rung = True
            if self._wake is not None:
                self._wake()
            self._heard.wait(1.0)  # (the step takes them; a closed end rings once a second at most)

    def heard(self) -> None:
        self._heard.set()

    def stop(self) -> None:
        self._stop.set()
        self._heard.set()


class BesideProcess:
    """radixtop's process next to this scheduler (``adapters.sglang.beside``) and the probe that
    feeds it, on the scheduler thread: ``step`` once a loop. Where that process dies, closes its
    end or hangs, the probe drops at once (the scheduler never waits), and the process is started
    again after a back-off, told how many batches it missed (its tree says it is incomplete until
    the cache is flushed). The admin API's listening socket is bound here and kept, so the port
    stays taken across restarts."""

    HUNG = "killed"
    """What is done with radixtop's process that takes no frame (the log says it)."""

    def __init__(self, cache: Any, listening: Any, host: str, info: dict[str, Any], env: dict[str, str],
                 buffer: int = SOCKET_BUFFER, backlog: int = BACKLOG_BYTES, sglang: Any = None,
                 poller: Any = None, recorder: Any = None, wake: Any = None) -> None:
        """``info``: ``hello``'s; ``env``: radixtop's process's environment (its token in it);
        ``buffer`` and ``backlog``: the hand-over's bounds (``gpu_backend.owner.handover``);
        ``sglang``: what answers radixtop's side's calls on this thread (an
        ``SGLangInProcessAdapter`` with no owner queue: this is the scheduler's thread); ``poller``:
        the ``zmq.Poller`` a scheduler that sleeps on idle waits in (``--sleep-on-idle``): the
        hand-over's socket joins it, so a call from radixtop's side wakes it; ``recorder``: a
        Python core's ``records.ChangeRecorder`` (its records are handed over, the whole tree's at
        each start), where the Rust core's events are not what is handed over; ``wake``: wakes an
        owner that sleeps between its steps when a call comes (radixtop's own engine)."""
        self.recorder = recorder
        self.wake = wake
        self.cache = cache
        self.sglang = sglang
        self.poller = poller
        self._polled: Any = None
        self.buffer, self.backlog = buffer, backlog
        self.listening = listening
        self.host = host
        self.info = info
        self.env = env
        self.child: Any = None
        self.probe: EventsProbe | RecordsProbe | None = None
        self.starts = 0
        self._retry_at = 0.0
        self._wait = RESTART_FIRST_S
        self._down_at: float | None = None
        self._unheard = 0
        """Starts in a row that went down before they were up (``START_TRIES``)."""
        self._sent_seen = self._dropped_seen = 0
        self._progress_at = 0.0
        self._look_at = 0.0
        self._bell: CallBell | None = None
        self._calls: collections.deque[tuple[Any, bytes]] = collections.deque()
        """radixtop's calls taken and not yet answered, each with its op (read once, as it is taken:
        those that wait while the whole tree is sent are looked at every step)."""
        self._start()

    def _start(self) -> None:
        import subprocess
        import sys

        from radixtop.gpu_backend.owner.handover import pair

        mine, theirs = pair(self.buffer)
        fds = (theirs.fileno(), self.listening.fileno())
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-P", "-m", "radixtop.adapters.sglang.beside", "--handover-fd", str(fds[0]),
                 "--socket-fd", str(fds[1]), "--host", self.host],
                pass_fds=fds, env=self.env, stdin=subprocess.DEVNULL)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        missed = self._started(mine)
        if self.starts > 1 and isinstance(self.probe, RecordsProbe):
            log.warning("radixtop: its process beside the scheduler started again (pid %d), with the whole tree",
                        self.child.pid)
        elif self.starts > 1:
            log.warning("radixtop: its process beside the scheduler started again (pid %d; %d batches of KV events "
                        "before it are not in its tree)", self.child.pid, missed)

    def _started(self, mine: Any) -> int:
        """The probe handing over on ``mine`` from now on (radixtop's process at its other end):
        the hello, then the whole tree (a Python core's) or the events from now (the Rust core's);
        the batches of events the last one missed."""
        missed = self.probe.batches if self.probe is not None else 0
        self._calls.clear()  # (the last process's: nobody waits for their replies)
        self._heard = False
        """radixtop's process sent something (a call, a ``MORE``): it is up and reading."""
        end = ProbeEnd(mine, backlog_bytes=self.backlog)
        if self.sglang is not None:
            if self._bell is not None:
                self._bell.stop()
            self._bell = CallBell(mine, self.wake)
        self._unpoll()
        if self.poller is not None:
            import zmq

            self.poller.register(mine.fileno(), zmq.POLLIN)
            self._polled = mine.fileno()
        hello(end, missed=missed if self.recorder is None else 0, **self.info)
        if self.probe is None:
            self.probe = EventsProbe(self.cache, end) if self.recorder is None else RecordsProbe(self.recorder, end)
        else:
            self.probe.end.close()
            self.probe.restarted(end)
        if isinstance(self.probe, RecordsProbe):  # the tree as it is now, then its changes
            self.probe.start()
        self.starts += 1
        self._sent_seen, self._progress_at, self._dropped_seen = end.sent, time.monotonic(), end.dropped
        return missed

    def step(self) -> None:
        """Once a scheduler loop, kept short (it runs cold, after the scheduler's own work: each
        thing it looks at costs microseconds): the probe's step; radixtop's calls, where the bell
        rang; every ``LOOK_S``, whether radixtop's process is there and reading."""
        probe = self.probe
        recorder = self.recorder
        if recorder is not None and recorder.failed is not None:
            raise RuntimeError(recorder.failed)  # (the plugin stops radixtop's process: SGLang goes on)
        probe.step()  # type: ignore[union-attr]
        bell = self._bell
        if bell is not None and (bell.rung or self._calls):
            self._take_calls(bell)
        now = time.monotonic()
        if now >= self._look_at:
            self._look(now)

    def _take_calls(self, bell: CallBell) -> None:
        probe = self.probe
        end = probe.end  # type: ignore[union-attr]
        calls = self._calls
        if bell.rung:
            bell.rung = False
            if not end.down:
                frames = end.commands(64)
                self._heard = self._heard or bool(frames)
                calls.extend((_op_of(f.payload), f.payload) for f in frames if f.kind == CALL)
            bell.heard()
        if getattr(probe, "busy", False):  # the whole tree on its way: the actions now, the rest after it
            for call in [c for c in calls if c[0] in AT_ONCE]:
                calls.remove(call)
                if end.down:
                    return
                self._answer(call[1])
            return
        while calls and not end.down:
            self._answer(calls.popleft()[1])

    def _look(self, now: float) -> None:
        """Whether radixtop's process is gone (also while nothing was sent: an idle server),
        down (started again when due), or alive but not reading (hung: killed)."""
        end = self.probe.end  # type: ignore[union-attr]
        if not end.down:
            self._look_at = now + LOOK_S
            if self.child.poll() is not None:
                end.close()
        if end.down:
            self._look_at = now  # (looked at each step until it is started again)
            self._restart_when_due(now)
        elif end.sent != self._sent_seen:  # it took frames since the last look: going
            self._sent_seen, self._progress_at, self._dropped_seen = end.sent, now, end.dropped
        elif (end.held or end.dropped != self._dropped_seen) and \
                now - self._progress_at > (STALLED_S if self._heard else STARTING_S):
            # frames waiting or dropped, none taken for that long: alive but not reading (hung)
            log.warning("radixtop: its process beside the scheduler took no frame for %.0f s: %s",
                        now - self._progress_at, self.HUNG)
            self.child.kill()  # its end closes: the probe sees it down at its next send
            self._progress_at = now

    def _answer(self, payload: bytes) -> None:
        """One call from radixtop's side, run here (the scheduler's thread, between its steps);
        the reply goes after what the call's own action recorded."""
        import orjson

        from radixtop.adapters.errors import AdapterError
        from radixtop.adapters.http.wire import error_body, error_to_body, json_default

        ident: Any = None
        op = None
        end = self.probe.end  # type: ignore[union-attr]
        try:
            call = json.loads(payload)
            ident, op, args = call["id"], call["op"], call.get("args") or {}
            if op not in OPS or not isinstance(args, dict):
                raise ValueError(f"no such call: {op!r}")
            if op == "resync" and isinstance(self.probe, RecordsProbe):
                self.probe.start()  # (after what was recorded before: the tree as it is now)
                result = None
            elif op in CAUSES and self.recorder is not None:  # (its removals told for what they are)
                records = self.recorder.records
                records.append((CAUSE, CAUSES[op], "radixtop's evict" if op == "evict" else "radixtop's flush"))
                try:
                    result = getattr(self.sglang, op)(**args)
                finally:
                    records.append((CAUSE, "", ""))
            elif op in CAUSES and isinstance(self.probe, EventsProbe):  # the Rust core: the same, as frames
                self.probe.step()  # (the events before it are SGLang's own)
                who = "radixtop's evict" if op == "evict" else "radixtop's flush"
                end.send(CAUSED, json.dumps({"cause": CAUSES[op], "who": who}).encode())
                try:
                    result = getattr(self.sglang, op)(**args)
                finally:
                    self.probe.step()
                    end.send(CAUSED, b'{"cause": "", "who": ""}')
                if op == "flush" and getattr(result, "flushed", False):
                    self.probe.cleared()
            else:
                sync = getattr(self.sglang, "sync", None) if op == "sync" else None
                result = sync() if sync is not None else None if op == "sync" else getattr(self.sglang, op)(**args)
            body = orjson.dumps({"id": ident, "result": result}, default=json_default, option=orjson.OPT_NON_STR_KEYS)
            if len(body) > end.frame_max:
                raise ValueError(f"the answer to {op!r} is {len(body):,} bytes, over a frame")
        except AdapterError as exc:
            body = orjson.dumps({"id": ident, **error_to_body(exc)})
        except Exception as exc:  # a bad call, or SGLang raising: an answer, never a scheduler down
            try:
                body = orjson.dumps({"id": ident, **error_body("internal", f"{type(exc).__name__}: {exc}")})
            except TypeError:  # an id that is not JSON
                body = orjson.dumps({"id": None, **error_body("internal", "a call that is not JSON")})
        if isinstance(self.probe, RecordsProbe):
            self.probe.step(now=True)  # every record before the reply, the action's own included
        elif op in ACTIONS:
            self.probe.step()  # type: ignore[union-attr]  # what the action recorded goes first
        end.send(REPLY, body)

    def _restart_when_due(self, now: float) -> None:
        if self._down_at is None:  # just went down
            code = self.child.poll() if self.child is not None else None
            self._unheard = 0 if self._heard else self._unheard + 1
            if self._unheard >= START_TRIES:
                if code is None:
                    self.child.kill()
                raise RuntimeError(
                    f"radixtop's process beside the scheduler went down {self._unheard} times in a row before it "
                    f"was up (last: {'still running: killed' if code is None else f'exit {code}'}; what it printed "
                    "is above in this log): not started again")
            quiet = self._retry_at and now - self._retry_at > RESTART_QUIET_S
            self._wait = RESTART_FIRST_S if quiet or not self._retry_at else min(self._wait * 2, RESTART_MOST_S)
            self._down_at, self._retry_at = now, now + self._wait
            self._unpoll()  # (a closed end reads as ready forever: the idle scheduler would spin)
            log.warning("radixtop: its process beside the scheduler went down (%s); SGLang goes on, and it is "
                        "started again in %.1f s", "still running: killed" if code is None else f"exit {code}",
                        self._wait)
            if code is None:
                self.child.kill()
            return
        if now < self._retry_at:
            return
        if self.child is not None and self.child.poll() is None:
            return  # (killed, not yet gone)
        self._down_at = None
        try:
            self._start()
        except Exception as exc:  # cannot start a process now: tried again after the next wait
            log.warning("radixtop: cannot start its process beside the scheduler (%s: %s); trying again in %.1f s",
                        type(exc).__name__, exc, self._wait)
            self._down_at = now
            self._retry_at = now + self._wait

    def _unpoll(self) -> None:
        if self._polled is not None:
            try:
                self.poller.unregister(self._polled)
            except KeyError:
                pass
            self._polled = None

    def close(self) -> None:
        self._unpoll()
        if self._bell is not None:
            self._bell.stop()
        if self.recorder is not None:
            self.recorder.stop()
        if self.probe is not None:
            self.probe.end.close()
        if self.child is not None:
            self.child.terminate()
            try:
                self.child.wait(5)
            except Exception:
                self.child.kill()
                self.child.wait(5)
        if self.listening is not None:
            self.listening.close()


ACCEPT_EVERY_S = 0.1
"""``AttachPoint``: how often a scheduler with nobody attached looks for a ``radixtop attach``
(one non-blocking ``accept``; a scheduler asleep on idle is woken by the connection itself)."""


class AttachedPeer:
    """What ``AttachPoint`` knows of the radixtop process attached to it (``radixtop attach``):
    its pid (the socket's peer), whether it left, and a ``kill`` that only lets it go (it is the
    operator's process, not this one's to end): as ``BesideProcess`` reads a child it started."""

    def __init__(self, sock: Any, pid: int) -> None:
        self.sock, self.pid = sock, pid
        self._left = False

    def poll(self) -> int | None:
        """0 once it left (its end hung up, even with frames of its still unread), else None."""
        import select

        if not self._left:
            try:
                watch = select.poll()
                watch.register(self.sock.fileno(), select.POLLRDHUP | select.POLLHUP)
                self._left = any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
                                 for _, events in watch.poll(0))
            except (OSError, ValueError):
                self._left = True
        return 0 if self._left else None

    def kill(self) -> None:
        import socket

        self._left = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    terminate = kill

    def wait(self, timeout: float | None = None) -> int:
        return 0


class AttachPoint(BesideProcess):
    """``RADIXTOP_BESIDE=attach``: the probe, with no radixtop process of its own; one the operator
    starts (``radixtop attach PATH``, under their own supervision) connects to ``path``, a unix
    socket only this user can reach (mode 0600; a peer of another uid is refused), and gets the
    hello, then the whole tree (a Python core's) or the events from then on (the Rust core's), as
    a process the plugin starts would. One at a time: another is refused while one is attached.
    When it leaves, dies or hangs (let go), the probe drops what it would send, SGLang goes on,
    and the next ``radixtop attach`` is taken: nothing here starts or restarts a process."""

    HUNG = "let go (the next radixtop attach is taken)"

    def __init__(self, cache: Any, path: Any, info: dict[str, Any], **kwargs: Any) -> None:
        import os
        import socket


        if os.path.exists(path):
            other = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                other.connect(str(path))
            except OSError:  # (one a scheduler that died left: nobody listens there)
                os.unlink(path)
            else:
                raise RuntimeError(f"another scheduler's probe waits at {path}: give each server its own "
                                   "RADIXTOP_PORT")
            finally:
                other.close()
        point = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:  # (in the user's private directory, mode 0700: only this user reaches it meanwhile)
            point.bind(str(path))
            os.chmod(path, 0o600)
            self._inode = os.stat(path).st_ino
        except BaseException:
            point.close()
            raise
        point.listen(4)
        point.setblocking(False)
        self.path, self.point = path, point
        self._accept_at = 0.0
        super().__init__(cache, None, "", info, {}, **kwargs)

    def _start(self) -> None:
        if self.child is None:  # (the first start, before anyone attached: an end already closed)
            from radixtop.gpu_backend.owner.handover import pair

            mine, theirs = pair(self.buffer)
            theirs.close()
            self.child = AttachedPeer(mine, 0)
            self._started(mine)
            self.starts -= 1  # (nobody came yet)
            self.probe.end.close()  # type: ignore[union-attr]
            self._unbell()
            return
        self._started(self.child.sock)
        kind = "the whole tree" if isinstance(self.probe, RecordsProbe) else "the KV events from now on"
        log.warning("radixtop: a radixtop process (pid %d) attached to this scheduler at %s; it gets %s",
                    self.child.pid, self.path, kind)

    @staticmethod
    def _refuse(sock: Any, why: str) -> None:
        """Tell a connection why it is turned away (one frame, never waited for), then close it."""
        from radixtop.gpu_backend.owner.handover import HEADER

        try:
            sock.setblocking(False)
            sock.send(HEADER.pack(0, REFUSED) + why.encode())
        except OSError:
            pass
        sock.close()

    def _unbell(self) -> None:
        """No bell while nobody is attached (a closed end reads as ready: it would ring each step)."""
        if self._bell is not None:
            self._bell.stop()
            self._bell = None

    def _accepted(self) -> Any:
        """A connection waiting at the point (a peer of another uid refused), or None."""
        import os
        import socket
        import struct

        try:
            sock, _ = self.point.accept()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            log.warning("radixtop: the attach point %s cannot accept (%s)", self.path, exc)
            return None
        try:
            pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        except OSError:
            sock.close()
            return None
        if uid != os.geteuid():
            log.warning("radixtop: refused a radixtop attach from uid %d (pid %d) at %s: not this user", uid, pid,
                        self.path)
            self._refuse(sock, f"refused: this scheduler's probe runs as uid {os.geteuid()}, and takes only its "
                               f"own user's radixtop (not uid {uid})")
            return None
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, self.buffer)
            except OSError:
                pass
        return sock, pid

    def _look(self, now: float) -> None:
        super()._look(now)
        if not self.probe.end.down:  # type: ignore[union-attr]  # (one at a time: another is let go)
            other = self._accepted()
            if other is not None:
                log.warning("radixtop: refused a radixtop attach (pid %d) at %s: radixtop (pid %d) is attached",
                            other[1], self.path, self.child.pid)
                self._refuse(other[0], f"refused: radixtop (pid {self.child.pid}) is attached to this scheduler "
                                       "already (one at a time)")

    def _restart_when_due(self, now: float) -> None:
        if self._down_at is None:  # just left (or nobody came yet)
            self._down_at = now
            self._unbell()
            self._unpoll()  # (a closed end reads as ready forever: the idle scheduler would spin)
            if self.poller is not None:  # (a radixtop attach wakes an idle scheduler)
                import zmq

                self.poller.register(self.point.fileno(), zmq.POLLIN)
                self._polled = self.point.fileno()
            if self.starts:
                self.child.kill()
                log.warning("radixtop: the radixtop process attached to this scheduler (pid %d) left; SGLang goes "
                            "on, and the next radixtop attach at %s is taken", self.child.pid, self.path)
        if now < self._accept_at:
            return
        self._accept_at = now + ACCEPT_EVERY_S
        taken = self._accepted()
        if taken is None:
            return
        self._down_at = None
        self.child.sock.close()
        self.child = AttachedPeer(*taken)
        self.probe.end.close()  # type: ignore[union-attr]
        try:
            self._start()
        except Exception as exc:  # (that one let go; the next is taken)
            log.warning("radixtop: a radixtop attach (pid %d) could not be fed (%s: %s)", self.child.pid,
                        type(exc).__name__, exc)
            self.child.kill()
            self.probe.end.close()  # type: ignore[union-attr]
            self._down_at = None  # (as one that left: its bell and its poll undone at the next step)

    def close(self) -> None:
        import os

        super().close()
        self.point.close()
        try:
            if os.stat(self.path).st_ino == self._inode:  # (its own: not another's made since)
                os.unlink(self.path)
        except OSError:
            pass
