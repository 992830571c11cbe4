"""The hand-over between a probe inside a server's process and radixtop's process beside it.

The probe runs on the server's owner thread (SGLang's scheduler): what it captured goes to the
mirror as numbered frames, and it must never wait for the mirror, nor grow without bound when the
mirror falls behind or dies. One ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair carries both ways: a
frame is one message (sent whole or not at all, so a frame is never cut), the kernel's buffer
holds what the mirror has not read yet, and the probe's end never blocks.

* :class:`ProbeEnd` (the server's side): ``send`` a frame now, or keep it in a bounded backlog
  (``backlog_bytes``) while the socket's buffer is full, sent first by the next ``flush``; past
  the bound the frame is dropped and counted. Each frame has the next number whether it goes or
  not, so the mirror sees how many it lost and where. A mirror gone (its end closed, its process
  killed) leaves the probe ``down``: every later send is dropped at once, the backlog freed.
  ``commands`` takes what the mirror asked for (actions to run between steps), never waiting.
* :class:`MirrorEnd` (radixtop's side): ``receive`` the next frame (with ``lost``: the frames
  dropped just before it), or None after ``timeout``; :class:`ProbeGone` when the server's end
  closed (the server exited). ``send`` a command to the probe.

Each end numbers its own frames from 0. Frames are at most ``FRAME_MAX`` bytes of payload: the
layer above splits what it encodes. Pure Python (``socket``), no thread of its own.
"""

from __future__ import annotations

import errno
import select
import socket
import struct
import threading
from collections import deque
from typing import NamedTuple

HEADER = struct.Struct("<QB")
"""A frame's number (uint64, each end's own, from 0) and kind (a byte the layer above defines)."""
FRAME_MAX = 1 << 20
"""The most payload bytes in one frame, where the socket's buffer holds that much (a message must
fit in it whole: ``ProbeEnd.frame_max`` is what this socket takes, often less: the kernel caps the
buffer at ``net.core.wmem_max``, 208 KiB by default)."""
BACKLOG_BYTES = 8 << 20
"""What a probe keeps at most while the socket's buffer is full, before it drops frames."""
SOCKET_BUFFER = 4 << 20
"""The socket buffer asked for, each way (the kernel may cap it at ``net.core.wmem_max``)."""


class ProbeGone(ConnectionError):
    """The server's end of the hand-over closed: the server (or its probe) is gone."""


class Frame(NamedTuple):
    seq: int
    kind: int
    payload: bytes
    lost: int
    """Frames the other end numbered before this one that never came (dropped while this end fell
    behind): the layer above resyncs from here."""


def pair(buffer: int = SOCKET_BUFFER) -> tuple[socket.socket, socket.socket]:
    """A connected pair for a probe (first) and a mirror (second), each buffer ``buffer`` bytes."""
    probe, mirror = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (probe, mirror):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, buffer)
            except OSError:  # (capped, never refused on Linux; kept as the kernel gives it)
                pass
    return probe, mirror


class ProbeEnd:
    """The server's end: nothing here waits (the socket is non-blocking)."""

    def __init__(self, sock: socket.socket, backlog_bytes: int = BACKLOG_BYTES) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.frame_max = frame_max(sock)
        self._readable = select.poll()
        self._readable.register(sock.fileno(), select.POLLIN)
        """The most payload bytes one frame may have on this socket (the layer above splits)."""
        self.backlog_bytes = backlog_bytes
        self._backlog: deque[tuple[bytes, bytes]] = deque()
        self._held = 0  # bytes in the backlog
        self._buffer = bytearray(HEADER.size + FRAME_MAX + 1)  # (+1: a longer message is seen as one)
        self.seq = 0
        """The number the next frame gets."""
        self.sent = 0
        self.dropped = 0
        """Frames numbered and never sent (the backlog full, or the mirror down)."""
        self.most_held = 0
        """The most bytes the backlog held at once."""
        self.down = False
        """The mirror's end closed: every send is dropped from now on."""

    @property
    def held(self) -> int:
        """Bytes the backlog holds now."""
        return self._held

    def send(self, kind: int, payload: bytes) -> bool:
        """Hand ``payload`` over as the next frame: sent now, or kept in the backlog behind the
        frames already there (True); dropped where the backlog is full or the mirror is down
        (False). ``ValueError`` for a payload over ``frame_max`` (the caller splits)."""
        if len(payload) > self.frame_max:
            raise ValueError(f"a frame of {len(payload):,} bytes (at most {self.frame_max:,})")
        header = HEADER.pack(self.seq, kind)
        self.seq += 1
        if self.down:
            self.dropped += 1
            return False
        if not self._backlog and self._try(header, payload):
            return True
        if self.down or self._held + len(header) + len(payload) > self.backlog_bytes:
            self.dropped += 1
            return False
        self._backlog.append((header, payload))
        self._held += len(header) + len(payload)
        self.most_held = max(self.most_held, self._held)
        return True

    def skip(self) -> None:
        """Number a frame that will never be sent (one the layer above could not make): the
        mirror sees it lost, as a dropped one."""
        self.seq += 1
        self.dropped += 1

    def flush(self) -> int:
        """Send what the backlog holds, oldest first, while the socket takes it; the frames left."""
        backlog = self._backlog
        while backlog:
            header, payload = backlog[0]
            if not self._try(header, payload):
                break
            backlog.popleft()
            self._held -= len(header) + len(payload)
        return len(backlog)

    def commands(self, most: int = 64) -> list[Frame]:
        """What the mirror sent, at most ``most`` frames, without waiting (none: an empty list)."""
        frames: list[Frame] = []
        if self.down or not self._readable.poll(0):  # (one poll: most steps have no command)
            return frames
        view = memoryview(self._buffer)
        while len(frames) < most and not self.down:
            try:
                n = self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._lost_mirror()
                break
            if n == 0:  # its end closed
                self._lost_mirror()
                break
            if not HEADER.size <= n <= HEADER.size + FRAME_MAX:
                continue  # not a frame: ignored
            seq, kind = HEADER.unpack_from(view)
            frames.append(Frame(seq, kind, bytes(view[HEADER.size:n]), 0))
        return frames

    def close(self) -> None:
        self._lost_mirror()
        self.sock.close()

    def _try(self, header: bytes, payload: bytes) -> bool:
        try:
            self.sock.sendmsg((header, payload))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS):  # this one frame cannot go: dropped, counted
                self.dropped += 1
                return True  # (gone from the backlog's point of view)
            self._lost_mirror()  # EPIPE, ECONNRESET: the mirror's end closed
            return False
        self.sent += 1
        return True

    def _lost_mirror(self) -> None:
        if not self.down:
            self.down = True
            self.dropped += len(self._backlog)
            self._backlog.clear()
            self._held = 0


class MirrorEnd:
    """radixtop's end: reads wait (up to a timeout), and so may its commands. One thread
    receives; any thread may send (under a lock). The socket stays non-blocking: each wait is a
    ``poll`` of its own, so no thread's timeout changes another's."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._send_lock = threading.Lock()
        self._buffer = bytearray(HEADER.size + FRAME_MAX + 1)
        self.expected = 0
        """The number of the next frame from the probe."""
        self.lost = 0
        """Frames the probe dropped, in all, as seen here."""
        self.seq = 0

    def _wait(self, event: int, timeout: float | None) -> bool:
        poller = select.poll()
        poller.register(self.sock, event)
        return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def receive(self, timeout: float | None = None) -> Frame | None:
        """The next frame, or None where none came within ``timeout`` seconds (None: wait).
        ``ProbeGone`` where the probe's end closed."""
        view = memoryview(self._buffer)
        while True:
            try:
                n = self.sock.recv_into(view)
            except (BlockingIOError, InterruptedError):
                if not self._wait(select.POLLIN, timeout):
                    return None
                continue
            except OSError as exc:
                raise ProbeGone(str(exc)) from exc
            if n == 0:
                raise ProbeGone("the probe's end closed")
            if HEADER.size <= n <= HEADER.size + FRAME_MAX:
                break  # (anything else is not a frame: ignored)
        seq, kind = HEADER.unpack_from(view)
        lost = max(0, seq - self.expected)
        self.lost += lost
        self.expected = seq + 1
        return Frame(seq, kind, bytes(view[HEADER.size:n]), lost)

    def send(self, kind: int, payload: bytes, timeout: float | None = 5.0) -> None:
        """A command to the probe (it takes it between the server's steps). ``TimeoutError``
        where the probe's buffer stayed full ``timeout`` seconds; ``ProbeGone`` where it closed."""
        if len(payload) > FRAME_MAX:
            raise ValueError(f"a frame of {len(payload):,} bytes (at most {FRAME_MAX:,})")
        with self._send_lock:
            header = HEADER.pack(self.seq, kind)
            self.seq += 1
            while True:
                try:
                    self.sock.sendmsg((header, payload))
                    return
                except (BlockingIOError, InterruptedError):
                    if not self._wait(select.POLLOUT, timeout):
                        raise TimeoutError(f"the probe took no command within {timeout:g}s") from None
                except OSError as exc:
                    if exc.errno == errno.EMSGSIZE:
                        raise ValueError(f"a frame of {len(payload):,} bytes is more than the socket takes") from None
                    raise ProbeGone(str(exc)) from exc

    def close(self) -> None:
        self.sock.close()


def frame_max(sock: socket.socket) -> int:
    """The most payload bytes one frame may carry on ``sock``: ``FRAME_MAX``, or less where its
    send buffer is smaller (a message must fit in about half of what ``SO_SNDBUF`` reports)."""
    size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    return max(1024, min(FRAME_MAX, size // 2 - HEADER.size - 64))
