"""The open sessions of a REAL SGLang 0.5.16 scheduler (its ``SessionController`` and its
``RadixCache``'s tombstones), as the plugin's adapter follows them: no hold of the scheduler
thread reads more than a bounded number of SGLang's session ids, at the attach (thousands of
sessions open already) or after opens and closes; the counts stay exact."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from radixtop.gpu_backend.ledger.orders import TAKE_CHUNK
from tests.on_sglang.ref.counted import READS, CountedSessions, CountedTombstones, Scheduler
from tests.on_sglang.ref.known16 import build_known
from tests.on_sglang.ref.plugin16 import attach_plugin, load_plugin, open_in, stand_in

SESSIONS = 5_000
MOST_PER_HOLD = TAKE_CHUNK
"""Session ids of SGLang's read in any one hold (a chunk's worth; the sessions are 10x more)."""


@contextmanager
def attached(sessions: int) -> Iterator[tuple[object, object, Scheduler]]:
    """The plugin attached (its ``__init__`` hook) to a scheduler with ``sessions`` open."""
    from radixtop.adapters.sglang import plugin as sglang_plugin

    replayer = build_known()
    scheduler = stand_in(replayer)
    scheduler.session_controller.sessions = CountedSessions()
    replayer.cache._closed_session_ids = CountedTombstones(replayer.cache._closed_session_ids)
    open_in(scheduler, ("a", "b", "c", "d", *(f"s{k}" for k in range(sessions))))
    plugged = attach_plugin(scheduler)
    plugged.owner.between_steps = READS.counted(plugged.owner.between_steps)  # the plugin's hold
    loop = Scheduler(lambda: type(scheduler).process_input_requests(scheduler, []))
    try:
        yield plugged.adapter, scheduler, loop
    finally:
        loop.stop()
        plugged.stop()
        setattr(scheduler, sglang_plugin.ATTACHED, None)


def test_no_hold_reads_every_open_session():
    load_plugin()  # SGLang imported as the tests import it
    from sglang.srt.managers.io_struct import CloseSessionReqInput

    READS.most = 0
    with attached(SESSIONS) as (adapter, scheduler, loop):
        opened = SESSIONS + 4  # a, b, c, d and the s<k>; "gone" only holds a node (not open)
        listed = opened + 1
        assert adapter.sessions("exclusive_bytes", 0, 10).total == listed
        assert adapter.stats().open_sessions == opened + 1  # gone holds a node and is not closed
        assert READS.most <= MOST_PER_HOLD, READS.most

        def more() -> None:
            open_in(scheduler, (f"s{k}" for k in range(SESSIONS, SESSIONS + 300)))
            for k in range(100):
                scheduler.close_session(CloseSessionReqInput(session_id=f"s{k}"))

        loop.do(more)
        page = adapter.sessions("id", 0, 10)
        assert page.total == listed + 300  # the 100 closed are listed, closed
        st = adapter.stats()
        assert st.open_sessions == opened + 1 + 300 - 100 and st.closed_sessions == 100
        assert adapter.plan_close("s200").state == "open"
        assert adapter.close_session("s201").already_closed is False
        assert adapter.plan_close("s201").state == "closed"
        assert adapter.stats().open_sessions == opened + 1 + 300 - 101
        assert READS.most <= MOST_PER_HOLD, READS.most
