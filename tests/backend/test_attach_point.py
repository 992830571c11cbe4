"""``probe.AttachPoint`` (``RADIXTOP_BESIDE=attach``, issue 27) over radixtop's own engine's
records, no SGLang needed: the probe waits at a unix socket of mode 0600 and feeds whoever attaches
(the hello, then the whole tree), one at a time; it never rings its bell while nobody is attached;
one that left, even with a frame of its still unread, is not taken for one still there (the next
`radixtop attach` is fed, not refused); a live point is never taken over by a second scheduler, a
stale one is; and its close removes what it made, only that."""

from __future__ import annotations

import os
import socket
import stat
import time

import pytest

from radixtop.adapters.bundled.recorder import BundledRecorder
from radixtop.adapters.sglang import probe as probe_module
from radixtop.adapters.sglang.beside import hello_of
from radixtop.adapters.sglang.probe import HELLO, MORE, AttachPoint
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.owner.handover import MirrorEnd
from radixtop.gpu_backend.scheduler import Scheduler

INFO = {"name": "t", "dp_rank": 0, "bytes_per_token": 256, "capacity_tokens": 256, "tree": "radix", "page_size": 1,
        "sessions": True, "ops": True}


def client(path) -> MirrorEnd:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(path))
    return MirrorEnd(sock)


def steps(point: AttachPoint, n: int = 3) -> None:
    for _ in range(n):
        point.step()
        time.sleep(0.01)


@pytest.fixture
def point(tmp_path, monkeypatch):
    monkeypatch.setattr(probe_module, "ACCEPT_EVERY_S", 0.0)
    monkeypatch.setattr(probe_module, "LOOK_S", 0.0)
    scheduler = Scheduler(get_geometry("tiny"), 256, device="cpu", write_kv=False)
    scheduler.request("r1", [1, 2, 3, 4], [5], "s1")
    made = AttachPoint(scheduler.cache, tmp_path / "probe-1.sock", INFO, sglang=object(),
                       recorder=BundledRecorder(scheduler.cache, scheduler))
    yield made
    made.close()


def test_the_point_feeds_one_at_a_time_and_the_next_after_one_left(point):
    path = point.path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    steps(point)
    assert point._bell is None  # (nobody attached: no bell ringing each step on a closed end)
    first = client(path)
    steps(point)
    hello = first.receive(timeout=2)
    assert hello is not None and hello.kind == HELLO and point._bell is not None
    second = client(path)  # one at a time: refused while the first is there
    steps(point)
    with pytest.raises(ValueError, match=r"refused: radixtop \(pid \d+\) is attached to this scheduler already"):
        hello_of(second, timeout=2)  # (told why: radixtop attach prints it, then exits)
    first.send(MORE, b"")  # a frame the probe has not read yet, then the first leaves
    first.close()
    third = client(path)
    steps(point, 6)
    hello = third.receive(timeout=2)
    assert hello is not None and hello.kind == HELLO, "the next radixtop attach was refused, not fed"
    third.close()
    steps(point, 3)
    assert point._bell is None


def test_a_live_point_is_never_taken_over_and_a_stale_one_is(point, tmp_path):
    scheduler = Scheduler(get_geometry("tiny"), 256, device="cpu", write_kv=False)
    with pytest.raises(RuntimeError, match="another scheduler's probe waits at"):
        AttachPoint(scheduler.cache, point.path, INFO, recorder=BundledRecorder(scheduler.cache, scheduler))
    stale = tmp_path / "probe-2.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left.bind(str(stale))
    left.close()
    other = AttachPoint(scheduler.cache, stale, INFO, recorder=BundledRecorder(scheduler.cache, scheduler))
    try:
        assert stale.exists()
    finally:
        other.close()
    assert not stale.exists()
    point.close()  # (no exception: it binds no port of its own)
    assert not point.path.exists()
