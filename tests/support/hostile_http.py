"""Hostile HTTP servers on raw sockets, for the deadline and size tests: one that trickles its
reply a byte at a time, one that floods an endless body. Each connection is served in a thread
of its own, and the server counts what it has seen (connections, bytes sent)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Seen:
    url: str = ""
    connections: int = 0
    open_now: int = 0
    sent: int = 0
    requests: list[bytes] = field(default_factory=list)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


@contextmanager
def hostile_server(mode: str, *, every: float = 0.5) -> Iterator[Seen]:
    """``mode``: ``trickle-head`` (the status line and headers a byte every ``every`` seconds),
    ``trickle-body`` (the head at once, then the body a byte every ``every`` seconds), or
    ``flood`` (a chunked body of JSON-ish bytes without end, as fast as it is read)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    listener.settimeout(0.05)
    stop = threading.Event()
    seen = Seen(url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    lock = threading.Lock()

    def serve(conn: socket.socket) -> None:
        with lock:
            seen.connections += 1
            seen.open_now += 1
        try:
            conn.settimeout(5)
            request = conn.recv(65536)
            with lock:
                seen.requests.append(request)
            if mode == "flood":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                piece = b"[" + b"1," * 32767 + b"1]"
                chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                while not stop.is_set():
                    conn.sendall(chunk)
                    with lock:
                        seen.sent += len(piece)
                return
            data = HEAD + b"{" * 100000 if mode == "trickle-head" else b"{" * 100000
            if mode == "trickle-body":
                conn.sendall(HEAD)
            for byte in data:
                if stop.wait(every):
                    return
                conn.sendall(bytes([byte]))
                with lock:
                    seen.sent += 1
        except OSError:
            pass
        finally:
            with lock:
                seen.open_now -= 1
            conn.close()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def wait_until(condition, seconds: float) -> bool:
    """Whether ``condition()`` came true within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
