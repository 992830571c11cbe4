"""The reads of radixtop's process beside SGLang bring its tree up to a scheduler step with a
``sync`` call through the probe (``adapters.sglang.beside.Syncs``): concurrent reads share one,
and a read never takes the answer of a sync sent before it began."""

from __future__ import annotations

import json
import threading
import time

from radixtop.adapters.sglang.beside import Calls, Syncs
from radixtop.adapters.sglang.probe import CALL, REPLY
from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeEnd, ProbeGone, pair


class HeldProbe:
    """A probe that takes the calls and answers each only when told (``release``)."""

    def __init__(self) -> None:
        probe_sock, mirror_sock = pair(64 << 10)
        self.end, self.mirror = ProbeEnd(probe_sock), MirrorEnd(mirror_sock)
        self.calls = Calls(self.mirror, timeout=10)
        self.taken: list[dict] = []
        self._stop = threading.Event()
        threading.Thread(target=self._replies, daemon=True).start()

    def _replies(self) -> None:  # radixtop's receiving thread (HandoverEvents in the process beside)
        while not self._stop.is_set():
            try:
                frame = self.mirror.receive(timeout=0.05)
            except ProbeGone:
                self.calls.gone()
                return
            if frame is not None:
                self.calls.replied(frame)

    def take(self, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.taken) < n:
            assert time.monotonic() < deadline, f"{len(self.taken)} calls came, not {n}"
            self.taken += [json.loads(f.payload) for f in self.end.commands() if f.kind == CALL]
            time.sleep(0.005)

    def release(self, k: int) -> None:
        self.end.send(REPLY, json.dumps({"id": self.taken[k]["id"], "result": None}).encode())

    def close(self) -> None:
        self._stop.set()
        self.end.close()


def waiting(syncs: Syncs) -> tuple[threading.Thread, list]:
    done: list = []
    thread = threading.Thread(target=lambda: done.append(syncs.wait(10)), daemon=True)
    thread.start()
    return thread, done


def test_reads_during_a_sync_share_the_next_one_and_none_takes_an_answer_from_before_it():
    probe = HeldProbe()
    syncs = Syncs(probe.calls)
    try:
        first, first_done = waiting(syncs)
        probe.take(1)  # sync 1 sent, its answer held
        later = [waiting(syncs) for _ in range(20)]  # they began after sync 1 was sent
        time.sleep(0.1)
        assert syncs.sent == 1 and len(probe.taken) == 1
        probe.release(0)
        first.join(5)
        assert first_done == [True]
        probe.take(2)  # one more sync for the twenty, sent after sync 1's answer
        time.sleep(0.1)
        assert not any(done for _, done in later)  # none took sync 1's answer
        assert syncs.sent == 2 and len(probe.taken) == 2
        probe.release(1)
        for thread, done in later:
            thread.join(5)
            assert done == [True]
    finally:
        probe.close()


def test_a_sync_that_cannot_be_sent_fails_its_reads_and_the_next_read_sends_again():
    probe = HeldProbe()
    syncs = Syncs(probe.calls)
    probe.end.close()  # the scheduler's end gone
    from radixtop.adapters.errors import TargetUnreachable

    try:
        syncs.wait(5)
    except TargetUnreachable:
        pass
    else:
        raise AssertionError("a sync with nobody to answer it returned")
    assert syncs.sent == 1
    try:
        syncs.wait(5)
    except TargetUnreachable:
        pass
    assert syncs.sent == 2  # not stuck "in flight"
    probe.close()


def test_a_call_whose_send_fails_while_the_receiver_sees_the_probe_gone_settles_once():
    """Found in CI: the send failed (broken pipe) while the receiving thread, seeing the probe
    gone, had already failed every pending call; the sender's own failure then raised
    ``InvalidStateError`` out of the read instead of the read's one-line error."""
    probe = HeldProbe()
    calls = probe.calls

    class GoneWhileSending:
        def send(self, kind, payload, timeout=None):
            calls.gone()  # the receiving thread saw the probe's end close first
            raise ProbeGone("the probe's end is closed")

    calls.end = GoneWhileSending()
    try:
        future = calls.start("sync")
        assert future.result(1)["error"]["code"] == "target_unreachable"
        assert not calls._pending
    finally:
        probe.close()
