"""radixtop's side of a probe's hand-over: the frames of encoded KV-event batches a probe in the
server's process sends (``adapters.sglang.probe``), applied to an :class:`EventTreeAdapter` on a
thread of radixtop's own process, where no read or upkeep takes the server's GIL.

A frame the probe dropped (it never waits for this side) is a gap: the tree counts the batches
missed and says it is incomplete (the Rust core keeps no history to replay; a later full resync is
the probe's to offer). The probe's end closing (the server exited) stops the thread, and the tree
says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.gpu_backend.owner.handover import Frame, MirrorEnd, ProbeGone

log = logging.getLogger("radixtop.events")

EVENTS = 1
"""The kind of a frame of one encoded ``KVEventBatch`` (the probe's ``EventsProbe`` sends them)."""


class HandoverEvents:
    """Applies the event frames from ``end`` to ``tree`` on a thread of its own until the probe's
    end closes or :meth:`close`."""

    where = "in radixtop's process beside the server"
    """Where the events are applied (for a capabilities' reason)."""

    def __init__(self, tree: EventTreeAdapter, end: MirrorEnd, on_gone: Callable[[], None] | None = None,
                 on_other: Callable[[Frame], None] | None = None) -> None:
        """``on_gone``: called (on this thread) once the probe's end closed; ``on_other``: each
        frame that is not of events (a reply to a command), on this thread, in its order among
        the events (so what the events before it did is in the tree when it is handled)."""
        self.tree = tree
        self.end = end
        self.on_gone = on_gone
        self.on_other = on_other
        self.gone = False
        """The probe's end closed (the server exited, or its probe stopped)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixtop-handover", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        end, tree = self.end, self.tree
        while not self._stop.is_set():
            try:
                frame = end.receive(timeout=0.2)
            except ProbeGone:
                self.gone = True
                log.info("radixtop: the probe's end closed (the server exited): the tree stops here")
                if self.on_gone is not None:
                    self.on_gone()
                return
            if frame is None:
                continue
            if frame.lost:  # (whatever frame comes after the gap: a reply, too)
                tree.missed(frame.lost)
            if frame.kind != EVENTS:
                if self.on_other is not None:
                    self.on_other(frame)
                continue
            try:
                tree.apply(frame.seq, frame.payload)
            except Exception as exc:  # the thread must outlive a batch it cannot apply
                log.exception("radixtop: applying KV-event batch %d failed", frame.seq)
                tree.skipped(frame.seq, f"batch {frame.seq}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.end.close()
