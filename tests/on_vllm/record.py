"""An independent record of a vLLM server's KV events: every batch the publisher sends, decoded
with msgspec alone (no radixtop code), and what it implies: the blocks cached now (a block stored
twice is cached twice), the removals, the resets."""

from __future__ import annotations

import threading
import time
from collections import Counter

import msgspec
import zmq


class Record:
    """A SUB socket on ``endpoint`` in a thread of its own, from now on."""

    def __init__(self, endpoint: str):
        self.batches: list[tuple[int, list]] = []
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(endpoint)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(100):
                _, seq, payload = self._sub.recv_multipart()
                ts, events, *_ = msgspec.msgpack.decode(payload)
                with self._lock:
                    self.batches.append((int.from_bytes(seq, "big"), events))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sub.close(0)
        self._ctx.term()

    def last_seq(self) -> int:
        with self._lock:
            return self.batches[-1][0] if self.batches else -1

    def events(self) -> list[dict]:
        with self._lock:
            return [e for _, events in self.batches for e in events]

    def cached(self) -> Counter:
        """Each block hash cached now, with how many copies vLLM's pool holds of it."""
        held: Counter = Counter()
        for e in self.events():
            if e["type"] == "AllBlocksCleared":
                held.clear()
            elif e["type"] == "BlockStored":
                held.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                held.subtract(e["block_hashes"])
        return +held

    def removed_blocks(self) -> int:
        return sum(len(e["block_hashes"]) for e in self.events() if e["type"] == "BlockRemoved")

    def wait_for(self, predicate, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "vLLM published nothing of that"
            time.sleep(0.05)
