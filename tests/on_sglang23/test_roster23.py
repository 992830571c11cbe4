"""The open sessions of a REAL SGLang 0.5.23 ``UnifiedRadixCache`` (Python core, sessions on):
the generations its session tracker opens for every request with a session id, and its
tombstones. No hold of the scheduler thread reads more than a bounded number of them, at the
attach (thousands open already) or after opens and closes; the counts stay exact."""

from __future__ import annotations

from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.ledger.orders import TAKE_CHUNK
from radixtop.gpu_backend.owner.queue import OwnerQueue
from tests.on_sglang.ref import drive23, known23
from tests.on_sglang.ref.counted import READS, CountedSessions, CountedTombstones, Scheduler

SESSIONS = 5_000
MOST_PER_HOLD = TAKE_CHUNK


def test_no_hold_reads_every_open_session():
    READS.most = 0
    known = known23.build_known()
    cache = known.cache
    refs = cache.session_refs
    refs._session_generations = CountedSessions(refs._session_generations)
    refs._closed_session_ids = CountedTombstones(refs._closed_session_ids)
    for k in range(SESSIONS):
        drive23.open_session(cache, f"s{k}")
    owner = OwnerQueue("the test scheduler")
    adapter = SGLangInProcessAdapter(cache, owner, name="sglang", model="tiny", timeout=10.0)
    loop = Scheduler(lambda: READS.counted(owner.between_steps)(max_items=64))
    try:
        opened = SESSIONS + 5  # a, b, c, d (running), gone and the s<k>
        assert adapter.sessions("exclusive_bytes", 0, 10).total == opened
        assert adapter.stats().open_sessions == opened
        assert READS.most <= MOST_PER_HOLD, READS.most

        def more() -> None:
            for k in range(SESSIONS, SESSIONS + 300):
                drive23.open_session(cache, f"s{k}")
            for k in range(100):
                drive23.close_session(cache, f"s{k}")

        loop.do(more)
        assert adapter.sessions("id", 0, 10).total == opened + 300
        st = adapter.stats()
        assert st.open_sessions == opened + 300 - 100 and st.closed_sessions == 100
        loop.do(lambda: drive23.open_session(cache, "s5"))  # opened again: its tombstone goes
        assert adapter.stats().closed_sessions == 99
        assert adapter.plan_close("s200").state == "open"
        assert adapter.close_session("s201").already_closed is False
        assert adapter.plan_close("s201").state == "closed"
        assert adapter.stats().open_sessions == opened + 300 - 100 + 1 - 1
        assert READS.most <= MOST_PER_HOLD, READS.most
    finally:
        loop.stop()
        adapter.release()
