"""The leak doctor on a real SGLang 0.5.16 RadixCache (CPU, sessions on): in process and through the
plugin's API, with the scheduler's own batch type holding the running requests."""

from __future__ import annotations

import types

import pytest

from radixtop.adapters.sglang.doctor import running_requests, waiting_requests
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.text import diagnosis_text
from radixtop.gpu_backend.owner.queue import OwnerQueue
from tests.on_sglang.ref.known16 import OPENED, SchedulerThread, build_known
from tests.on_sglang.ref.plugin16 import plugin_target
from tests.on_sglang.ref.replay_sglang import _Req, import_sglang


def batch_of(reqs):
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    return ScheduleBatch(reqs=list(reqs), batch_is_full=False)


@pytest.fixture
def in_process():
    """The known cache, its running request in a real ScheduleBatch of a scheduler-shaped object,
    and the adapter as the plugin builds it (hooks reading that scheduler)."""
    import_sglang()
    replayer = build_known()
    scheduler = types.SimpleNamespace(tree_cache=replayer.cache, running_batch=batch_of(replayer.running.values()),
                                      last_batch=None, chunked_req=None, waiting_queue=[])
    owner = OwnerQueue("the test scheduler")
    thread = SchedulerThread(owner).start()
    adapter = SGLangInProcessAdapter(replayer.cache, owner, name="sglang", model="tiny", open_sessions=lambda: OPENED,
                            running_requests=lambda: running_requests(scheduler),
                            waiting_requests=lambda: waiting_requests(scheduler))
    adapter.close_session("gone")
    try:
        yield adapter, replayer, scheduler
    finally:
        thread.stop()


def plant_lock(adapter, replayer) -> tuple[int, int]:
    def plant() -> tuple[int, int]:
        node = next(iter(replayer.cache._session_leaves["b"]))
        replayer.cache.inc_lock_ref(node)  # a lock no request holds, never released
        return node.id, len(node.key)

    return adapter.call(plant)


def test_a_healthy_cache_reports_nothing(in_process):
    adapter, _, _ = in_process
    d = adapter.diagnose()
    assert d.healthy, diagnosis_text(d)
    assert d.checked == ("leaked_lock", "starved_admission", "tombstone_tags", "idle_session")
    assert set(d.skipped) == {"buckets"} and d.nodes_walked == adapter.stats().node_count


def test_a_planted_lock_is_reported_with_the_figures_to_report(in_process):
    adapter, replayer, _ = in_process
    node_id, tokens = plant_lock(adapter, replayer)
    d = adapter.diagnose()
    assert [f.kind for f in d.findings] == ["leaked_lock"]
    (f,) = d.findings
    assert f.node_ids[0] == node_id and f.tokens == f.figures["pinned_tokens"] == tokens == 3
    assert f.figures["lock_ref"] == 1 and f.figures["held_by_requests"] == 0
    assert "This is SGLang 0.5.16's bug" in f.action


def test_a_request_the_scheduler_no_longer_holds_leaves_a_leaked_lock(in_process):
    adapter, replayer, scheduler = in_process
    scheduler.running_batch = batch_of([])  # SGLang dropped the request without cache_finished_req
    (f,) = adapter.diagnose().findings
    assert f.kind == "leaked_lock" and f.node_ids[0] == replayer.running["running"].last_node.id
    scheduler.running_batch = batch_of(replayer.running.values())
    scheduler.chunked_req = replayer.running["running"]  # also the chunked request: still one holder
    assert adapter.diagnose().healthy


def test_pinned_memory_that_starves_the_waiting_queue(in_process):
    adapter, replayer, scheduler = in_process
    plant_lock(adapter, replayer)
    st = adapter.stats()
    need = st.available_tokens + st.evictable_tokens + 1
    scheduler.waiting_queue = [_Req("waiting", list(range(100, 100 + need)), None)]
    d = adapter.diagnose()
    assert [f.kind for f in d.findings] == ["leaked_lock", "starved_admission"]
    starved = d.findings[1]
    assert starved.figures["head_request"] == "waiting" and starved.figures["head_need_tokens"] == need
    assert starved.figures["leaked_lock_tokens"] == 3 and "leaked locks" in starved.action
    scheduler.waiting_queue = [_Req("small", [100, 101], None)]
    assert [f.kind for f in adapter.diagnose().findings] == ["leaked_lock"]  # it fits: nothing starves


def test_through_the_plugin_api():
    with plugin_target() as (remote, replayer, loop):
        d = remote.diagnose()  # the test's scheduler has no running batch: the lock check says so
        assert "leaked_lock" in d.skipped and "running requests" in d.skipped["leaked_lock"]
        loop.scheduler.running_batch = batch_of(replayer.running.values())
        loop.scheduler.waiting_queue = []
        d = remote.diagnose()
        assert d.healthy and "leaked_lock" in d.checked, diagnosis_text(d)
        from radixtop.adapters.sglang import plugin as sglang_plugin

        plant_lock(sglang_plugin.attached_to(loop.scheduler).adapter, replayer)
        assert [f.kind for f in remote.diagnose().findings] == ["leaked_lock"]


def test_a_closed_session_that_still_tags_a_node_is_reported_with_what_a_close_frees(in_process):
    adapter, replayer, _ = in_process

    def late_tag() -> None:  # "gone" is closed; a finish past the tombstone tags again
        replayer.cache._closed_session_ids.pop("gone")
        replayer.begin("late", [60, 61, 62], "gone")
        replayer.finish("late", [63])
        replayer.cache._closed_session_ids["gone"] = None

    adapter.call(late_tag)
    (f,) = adapter.diagnose().findings
    assert f.kind == "tombstone_tags" and f.session_id == "gone" and f.tokens == 4
    assert f.figures["close_frees_tokens"] == adapter.plan_close("gone").freed_tokens == 4
    assert adapter.close_session("gone").freed_tokens == 4 and adapter.diagnose().healthy
