"""radixtop's side of ``bench_core_events.py``, in a process of its own: the tree kept from the
probe's hand-over (``handover FD``: the socket passed as a file descriptor) or from SGLang's own
ZMQ publisher (``zmq ENDPOINT``). On stdin ``sync N``: once batch N is applied, prints its tree's
total tokens (``-1`` where it was not applied within 60 s)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    how, where = sys.argv[1], sys.argv[2]
    if how == "handover":
        from radixtop.adapters.events.adapter import EventTreeAdapter
        from radixtop.adapters.events.handover import HandoverEvents
        from radixtop.gpu_backend.owner.handover import MirrorEnd

        tree = EventTreeAdapter(name="beside")
        HandoverEvents(tree, MirrorEnd(socket.socket(fileno=int(where))))
    else:
        from radixtop.adapters.events.zmq import KVEventsAdapter

        tree = KVEventsAdapter(where)
    print("ready", flush=True)
    for line in sys.stdin:
        word, _, seq = line.partition(" ")
        if word == "seq":  # the last batch applied so far
            print(tree.status().last_seq, flush=True)
        elif word == "sync":
            ok = tree.wait_for_seq(int(seq), 60)
            print(tree.stats().total_tokens if ok else -1, flush=True)


if __name__ == "__main__":
    main()
