"""The hand-over between a probe in a server's process and radixtop's process beside it
(``gpu_backend.owner.handover``): frames in order, numbered; a probe that never waits and never
holds more than its bound when the mirror falls behind, and says how many frames were lost and
where; a mirror killed (a real process, ``kill -9``) leaves the probe down, not raising."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from radixtop.gpu_backend.owner.handover import (
    FRAME_MAX,
    HEADER,
    MirrorEnd,
    ProbeEnd,
    ProbeGone,
    pair,
)


def ends(buffer: int = 64 << 10, backlog: int = 256 << 10) -> tuple[ProbeEnd, MirrorEnd]:
    probe, mirror = pair(buffer)
    return ProbeEnd(probe, backlog_bytes=backlog), MirrorEnd(mirror)


def drain(mirror: MirrorEnd) -> list:
    frames = []
    while (frame := mirror.receive(timeout=0.05)) is not None:
        frames.append(frame)
    return frames


def test_frames_arrive_whole_in_order_with_their_numbers_and_kinds():
    probe, mirror = ends()
    payloads = [bytes([i % 256]) * (i * 37) for i in range(50)]
    for i, payload in enumerate(payloads):
        assert probe.send(i % 3, payload)
    frames = drain(mirror)
    assert [f.payload for f in frames] == payloads
    assert [(f.seq, f.kind, f.lost) for f in frames] == [(i, i % 3, 0) for i in range(50)]
    assert probe.sent == 50 and probe.dropped == 0 and mirror.lost == 0


def test_a_mirror_that_does_not_read_never_makes_the_probe_wait_and_the_backlog_stays_bounded():
    """The socket's buffer fills, then the backlog up to its bound, then frames are dropped: each
    send returns at once (the probe's socket never blocks: a blocking one would hang this test)."""
    probe, mirror = ends(buffer=64 << 10, backlog=256 << 10)
    assert probe.sock.getblocking() is False
    payload = b"x" * 4000
    results = [probe.send(1, payload) for _ in range(2000)]  # 8 MB: far past buffer and backlog
    assert results[0] and not results[-1]
    assert probe.dropped > 0 and probe.held <= 256 << 10 and probe.most_held <= 256 << 10
    assert probe.seq == 2000 and probe.sent + len(probe._backlog) + probe.dropped == 2000


def test_after_a_gap_the_backlog_comes_in_order_and_the_next_frame_says_how_many_were_lost():
    probe, mirror = ends(buffer=64 << 10, backlog=64 << 10)
    payload = b"y" * 4000
    while probe.send(0, payload):  # the buffer, then the backlog, fill
        pass
    dropped_first = probe.seq - 1  # the frame just dropped
    for _ in range(4):
        assert not probe.send(0, payload)  # 5 dropped in all
    first = drain(mirror)
    assert [f.seq for f in first] == list(range(len(first))) and all(f.lost == 0 for f in first)
    while probe.flush():  # the backlog, oldest first, as the mirror reads
        first += drain(mirror)
    first += drain(mirror)
    assert [f.seq for f in first] == list(range(dropped_first))
    assert probe.send(7, b"after")
    (after,) = drain(mirror)
    assert (after.seq, after.kind, after.payload, after.lost) == (dropped_first + 5, 7, b"after", 5)
    assert mirror.lost == probe.dropped == 5


def test_a_frame_over_the_limit_is_refused_and_numbers_nothing():
    probe, _ = ends()
    with pytest.raises(ValueError, match="at most"):
        probe.send(0, b"z" * (FRAME_MAX + 1))
    assert probe.seq == 0


def test_commands_come_to_the_probe_without_waiting():
    probe, mirror = ends()
    assert probe.commands() == []
    mirror.send(2, b"close s1")
    mirror.send(3, b"evict 100")
    got = probe.commands()
    assert [(f.seq, f.kind, f.payload) for f in got] == [(0, 2, b"close s1"), (1, 3, b"evict 100")]
    assert probe.commands() == []


def test_the_mirror_closing_leaves_the_probe_down_dropping_at_once():
    probe, mirror = ends(buffer=64 << 10, backlog=64 << 10)
    while probe.send(0, b"w" * 4000):
        pass
    mirror.close()
    assert probe.flush() == 0 and probe.down and probe.held == 0
    assert not probe.send(0, b"more") and probe.commands() == []


def test_the_probe_closing_tells_the_mirror_it_is_gone():
    probe, mirror = ends()
    probe.send(0, b"last")
    probe.close()
    assert mirror.receive(timeout=1).payload == b"last"
    with pytest.raises(ProbeGone):
        mirror.receive(timeout=1)


def test_a_mirror_process_killed_mid_stream_leaves_the_probe_down_and_the_server_going():
    """A real process reads the frames (its socket passed as a file descriptor, as the plugin
    starts radixtop's process); ``kill -9`` of it under a stream of frames: every later send
    returns False at once, nothing raises, and the probe holds nothing."""
    probe_sock, mirror_sock = pair(64 << 10)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import socket, sys
            sock = socket.socket(fileno={mirror_sock.fileno()})
            sys.stdout.write("ready\\n"); sys.stdout.flush()
            while sock.recv({HEADER.size + FRAME_MAX}):
                pass
        """)],
        pass_fds=(mirror_sock.fileno(),), stdout=subprocess.PIPE, text=True,
    )
    mirror_sock.close()  # the child holds the only copy now
    try:
        assert child.stdout.readline() == "ready\n"
        probe = ProbeEnd(probe_sock, backlog_bytes=128 << 10)
        for _ in range(200):
            probe.send(0, b"v" * 2000)
            probe.flush()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        for _ in range(200):  # sends go on as the server's loop would: none waits or raises
            probe.send(0, b"v" * 2000)
            probe.flush()
        assert probe.down and probe.held == 0 and not probe.send(0, b"v")
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def test_a_frame_sent_while_the_backlog_holds_others_goes_behind_them():
    probe, mirror = ends(buffer=64 << 10, backlog=256 << 10)
    while not probe._backlog:
        probe.send(0, b"u" * 4000)
    probe.send(0, b"u" * 4000)  # two in the backlog
    got = drain(mirror)  # the socket's buffer empty, the backlog not
    assert probe.send(5, b"new")
    got += drain(mirror)
    while probe.flush():
        got += drain(mirror)
    got += drain(mirror)
    assert [f.seq for f in got] == list(range(probe.seq)) and got[-1].payload == b"new"


def test_a_probe_that_only_takes_commands_sees_the_mirror_gone():
    probe, mirror = ends()
    mirror.close()
    assert probe.commands() == [] and probe.down


def test_the_largest_frame_a_small_buffer_takes_arrives_whole_and_a_larger_one_is_refused():
    """The kernel caps a socket's buffer (``net.core.wmem_max``: 208 KiB by default), and a
    message over what it takes fails outright (EMSGSIZE), never in part: the probe's end says
    what one frame may carry on its socket, and the layer above splits to that."""
    probe, mirror = ends(buffer=64 << 10)
    assert 1024 < probe.frame_max < FRAME_MAX
    big = bytes(range(256)) * (probe.frame_max // 256) + b"z" * (probe.frame_max % 256)
    assert probe.send(3, big) and probe.dropped == 0 and not probe.down
    (got,) = drain(mirror)
    assert got.payload == big and got.kind == 3
    with pytest.raises(ValueError, match="at most"):
        probe.send(3, big + b"!")
    assert probe.send(4, b"after") and drain(mirror)[0].payload == b"after" and not probe.down


def test_a_gap_before_a_frame_that_is_not_events_still_leaves_the_tree_incomplete():
    """A burst overflows the backlog, the server goes idle, and the next frame through is a reply
    to a call: the batches lost before it are counted all the same (the tree says incomplete)."""
    import time

    from radixtop.adapters.events.adapter import EventTreeAdapter
    from radixtop.adapters.events.handover import HandoverEvents

    probe, mirror = ends(buffer=64 << 10, backlog=16 << 10)
    while probe.send(9, b"r" * 4000):  # (frames of another kind: no batch applied, only numbers)
        pass
    lost = probe.dropped
    tree = EventTreeAdapter(name="t")
    others = []
    handover = HandoverEvents(tree, mirror, on_other=others.append)
    try:
        while probe.flush():
            time.sleep(0.01)
        assert probe.send(4, b"reply")
        deadline = time.monotonic() + 10
        while not others or others[-1].payload != b"reply":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        st = tree.status()
        assert lost > 0 and st.missed_batches == lost and not st.complete
    finally:
        handover.close()
        probe.close()
