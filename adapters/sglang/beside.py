"""radixtop's process beside an SGLang scheduler (issue 27): the tree, its figures and the admin
API, fed by the scheduler's probe (``adapters.sglang.probe``) over the hand-over, so that no read
and no upkeep takes the scheduler's GIL, and a crash here is not a crash of SGLang.

    python -m radixtop.adapters.sglang.beside --handover-fd N --socket-fd M [--host H]

The process that starts it (the plugin, or a test standing for it) passes two file descriptors:
its end of the hand-over and the admin API's listening socket, bound there (so the port is taken
before this starts, and a port in use fails there). The token comes in ``RADIXTOP_TOKEN`` (never
in argv), with ``RADIXTOP_READ_TOKEN`` and ``RADIXTOP_AUDIT`` as the plugin reads them. The first
frame is ``HELLO`` (JSON: the target's name, DP rank, bytes per token, pool capacity in tokens);
then ``EVENTS`` frames. When the probe's end closes (the scheduler exited, even killed), this
process stops its server and exits: it never outlives the server it watches.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from typing import Any

from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.handover import HandoverEvents
from radixtop.adapters.sglang.probe import HELLO
from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeGone

log = logging.getLogger("radixtop.sglang")

HELLO_TIMEOUT_S = 10.0
"""How long this waits for the probe's first frame before giving up."""


def hello_of(end: MirrorEnd, timeout: float = HELLO_TIMEOUT_S) -> dict[str, Any]:
    """The probe's first frame, read: what the tree needs that the events do not say."""
    frame = end.receive(timeout)
    if frame is None:
        raise TimeoutError(f"no hello from the probe within {timeout:g}s")
    if frame.kind != HELLO:
        raise ValueError(f"the probe's first frame is of kind {frame.kind}, not a hello")
    info = json.loads(frame.payload)
    if not isinstance(info, dict):
        raise ValueError("the probe's hello is not a JSON object")
    return info


def tree_of(info: dict[str, Any]) -> EventTreeAdapter:
    def number(key: str) -> int:
        value = info.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"the probe's hello has a bad {key!r}: {value!r}")
        return value

    name = info.get("name")
    tree = EventTreeAdapter(name=str(name) if isinstance(name, str) and name else "sglang",
                            endpoint="the scheduler's probe", dp_rank=number("dp_rank"),
                            bytes_per_token=number("bytes_per_token"), capacity_tokens=number("capacity_tokens"))
    if number("missed"):  # started again: what the cache stored before is not in this tree
        tree.missed(number("missed"))
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m radixtop.adapters.sglang.beside", description=__doc__.split("\n\n")[0])
    ap.add_argument("--handover-fd", type=int, required=True)
    ap.add_argument("--socket-fd", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from radixtop.adapters.http.server import serve

    end = MirrorEnd(socket.socket(fileno=args.handover_fd))
    listening = socket.socket(fileno=args.socket_fd)
    try:
        tree = tree_of(hello_of(end))
    except (TimeoutError, ValueError, ProbeGone) as exc:
        print(f"radixtop beside: {exc}", file=sys.stderr)
        return 1

    def gone() -> None:  # the scheduler exited: so does this process (serve stops on SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    handover = HandoverEvents(tree, end, on_gone=gone)
    try:
        serve(tree, host=args.host, token=os.environ.get("RADIXTOP_TOKEN") or None,
              audit_path=os.environ.get("RADIXTOP_AUDIT") or None,
              read_token=os.environ.get("RADIXTOP_READ_TOKEN") or None, sock=listening,
              log=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        handover.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
