"""The leak doctor on the bundled engine: each finding caused for real, and none on a healthy cache."""

from __future__ import annotations

import time

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import BadRequest
from radixtop.adapters.model import TREE_FINDING_KINDS, Diagnosis
from radixtop.adapters.text import diagnosis_text
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import OutOfSlotsError, Scheduler
from tests.support.engines import CounterClock, build_engine


@pytest.fixture
def known():
    engine = build_engine()
    yield BundledAdapter(engine), engine
    engine.stop()


def kinds(d: Diagnosis) -> list[str]:
    return [f.kind for f in d.findings]


def test_a_healthy_cache_has_no_findings_and_every_check_ran(known):
    adapter, _ = known
    d = adapter.diagnose()
    assert d.healthy and d.findings == () and d.skipped == {}
    assert d.checked == TREE_FINDING_KINDS and d.nodes_walked == adapter.stats().node_count
    assert "healthy: nothing found" in diagnosis_text(d)
    assert d.to_dict()["findings"] == () and d.to_dict()["skipped"] == {}


def test_a_lock_no_request_holds_is_reported_with_what_it_pins(known):
    adapter, engine = known

    def plant(s: Scheduler) -> tuple[int, int]:
        node = next(iter(s.cache._session_leaves["b"]))  # b's own node [20, 21, 22] under the prompt
        s.cache.inc_lock_ref(node)  # a lock that no request holds, never released
        return node.id, len(node.key)

    node_id, tokens = engine.call(plant)
    d = adapter.diagnose()
    assert kinds(d) == ["leaked_lock"]
    f = d.findings[0]
    assert f.node_ids[0] == node_id and f.figures["leaked_locks"] == 1 and f.figures["held_by_requests"] == 0
    # the shared prompt above it is locked by the running request anyway: only b's node is pinned by the leak
    assert f.tokens == f.figures["pinned_tokens"] == tokens and f.bytes == tokens * adapter.stats().bytes_per_token
    assert "bug" in f.action and "restart" in f.action
    assert adapter.stats().evictable_tokens < adapter.stats().total_tokens  # it really is protected


def test_a_leaked_lock_on_a_path_a_request_also_locks_counts_only_the_extra_lock(known):
    adapter, engine = known

    def plant(s: Scheduler) -> int:
        running = s.running["running"].last_node
        s.cache.inc_lock_ref(running)
        return running.id

    node_id = engine.call(plant)
    (f,) = adapter.diagnose().findings
    assert f.kind == "leaked_lock" and f.node_ids[0] == node_id
    assert f.figures["lock_ref"] == 2 and f.figures["held_by_requests"] == 1 and f.tokens == 0


def test_buckets_that_do_not_add_up_are_the_engines_bug_with_the_figures(known):
    adapter, engine = known
    engine.call(lambda s: s.pool.allocator.alloc(4))  # slots taken, owned by nobody: a leak
    d = adapter.diagnose()
    assert kinds(d) == ["buckets"]
    f = d.findings[0]
    assert f.tokens == 4 and f.figures["unaccounted"] == 4 and f.figures["component"] == "full"
    assert "report it" in f.action and "4 tokens unaccounted" in f.summary


def test_a_closed_session_that_still_tags_nodes_is_reported_with_what_a_close_frees(known):
    adapter, engine = known

    def late_tag(s: Scheduler) -> None:
        # "gone" was closed; a request that finishes after the close tags again past the tombstone
        # (a bug of the guard, simulated by lifting the tombstone for the finish only)
        s.cache._closed_session_ids.pop("gone")
        s.request("late", [60, 61, 62], [63], "gone")
        s.cache._closed_session_ids["gone"] = None

    engine.call(late_tag)
    d = adapter.diagnose()
    assert kinds(d) == ["tombstone_tags"]
    f = d.findings[0]
    assert f.session_id == "gone" and f.tokens == 4 and len(f.node_ids) == 1
    assert f.figures["close_frees_tokens"] == adapter.plan_close("gone").freed_tokens == 4
    assert "radixtop close -- gone (again) frees 4 tokens now" in f.action


def test_an_idle_session_that_holds_memory_is_reported_with_its_exact_plan(known):
    adapter, engine = known
    time.sleep(0.3)
    engine.call(lambda s: s.request("again", [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12], [13], "a"))  # a: used now
    d = adapter.diagnose(idle_after_s=0.25)
    assert kinds(d) == ["idle_session"]  # b; not a (just used), not c (a close frees nothing), not d (running)
    (f,) = d.findings
    plan = adapter.plan_close("b")
    assert f.session_id == "b" and f.tokens == plan.freed_tokens == 3 and f.node_ids == plan.freed_node_ids
    assert f.figures["idle_s"] >= 0.25 and "radixtop close -- b: frees 3 tokens" in f.action
    assert adapter.diagnose().healthy  # under the default 10 minutes nobody is idle
    with pytest.raises(BadRequest):
        adapter.diagnose(idle_after_s=-1)


def starving_engine() -> tuple[Scheduler, Engine]:
    s = Scheduler(get_geometry("tiny"), 32, device="cpu", clock=CounterClock())
    s.begin("big", list(range(100, 124)), "x")  # 24 of 32 slots, locked while it runs
    with pytest.raises(OutOfSlotsError):
        s.begin("next", list(range(200, 216)), "y")  # needs 16: 8 can be had
    return s, Engine(s, None).start()


def test_pinned_memory_that_starves_admission_is_reported():
    s, engine = starving_engine()
    try:
        d = BundledAdapter(engine).diagnose()
        assert kinds(d) == ["starved_admission"]
        (f,) = d.findings
        assert f.figures["head_request"] == "next" and f.figures["head_need_tokens"] == 16
        assert f.figures["available"] + f.figures["evictable"] == 8 and f.figures["unevictable"] == 24
        assert f.tokens == 8 and "No lock is leaked" in f.action
        engine.call(lambda s: s.finish("big", [1]))  # room again: nothing waits for what cannot be had
        assert BundledAdapter(engine).diagnose().healthy
    finally:
        engine.stop()


def test_starved_admission_names_leaked_locks_when_they_pin_the_memory():
    s, engine = starving_engine()
    try:
        def leak(s: Scheduler) -> None:
            s.finish("big", [1])
            node = next(iter(s.cache.root_node.children.values()))
            s.cache.inc_lock_ref(node)  # the finished request's path, locked forever

        engine.call(leak)
        d = BundledAdapter(engine).diagnose()
        assert kinds(d) == ["leaked_lock", "starved_admission"]
        assert "leaked locks" in d.findings[1].action and d.findings[1].figures["leaked_lock_tokens"] == 25
    finally:
        engine.stop()


def test_the_walk_of_a_large_tree_yields_to_the_owner_between_chunks():
    from radixtop.adapters.bundled.doctor import doctor_inputs
    from radixtop.adapters.doctor import WALK_CHUNK, diagnose_pass

    s = Scheduler(get_geometry("tiny"), 32_768, device="cpu", clock=CounterClock(), write_kv=False)
    for k in range(10_000):  # 10,000 leaves under the root, and one locked path a request holds
        s.request(f"r{k}", [k, k + 1], [], None)
    s.begin("running", [5, 6, 7], None)
    adapter = BundledAdapter(Engine(s, None))  # never started: the steps run here, as on the owner
    steps, yields = diagnose_pass(doctor_inputs(adapter, s)), 0
    try:
        while True:
            next(steps)
            yields += 1
    except StopIteration as done:
        d = done.value
    assert d.healthy and d.nodes_walked == s.cache.node_count() >= 10_000
    assert yields >= d.nodes_walked // WALK_CHUNK  # a slice of the owner per chunk, never the whole walk
