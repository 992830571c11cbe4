"""The contract suite against the bundled adapter, in process."""

from __future__ import annotations

import pytest

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import TargetUnreachable, UnknownNode
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.workload import WorkloadConfig
from tests.contract.suite import ContractSuite, known_reads
from tests.support.engines import build_engine, make_scheduler

BUSY = WorkloadConfig(sessions=4, system_prompts=2, system_prompt_len=16, turn_input_len=(2, 6),
                      turn_output_len=(2, 6), turns=(1, 3), max_running=2, seed=3)


@pytest.fixture
def adapter():
    engine = build_engine()
    yield BundledAdapter(engine)
    engine.stop()


@pytest.fixture
def read_only_adapter():
    engine = build_engine()
    yield BundledAdapter(engine, read_only=True)
    engine.stop()



class TestBundled(ContractSuite):
    """The contract over the bundled adapter, in process."""


def test_the_bundled_engine_tells_every_pool_state_apart(adapter):
    """SGLang's five leak-check words, each known (never None) on radixtop's own engine, adding up."""
    st = adapter.stats()
    assert (st.protected_tokens, st.session_held_tokens, st.uncached_tokens) == (
        st.total_tokens - st.evictable_tokens, 0, 2)  # locked nodes; no session slots; the running request's own
    assert st.available_tokens + st.evictable_tokens + st.protected_tokens + st.session_held_tokens + \
        st.uncached_tokens == st.capacity_tokens
    assert st.unevictable_tokens == st.protected_tokens + st.uncached_tokens


def test_fast_ndjson_export_equals_the_generic_encoding(adapter):
    import json

    from radixtop.adapters.base import CacheAdapter

    fast = "".join(adapter.export_ndjson(chunk_rows=3))
    generic = "".join(CacheAdapter.export_ndjson(adapter, chunk_rows=3))
    assert [json.loads(x) for x in fast.splitlines()] == [json.loads(x) for x in generic.splitlines()]
    assert len(fast.splitlines()) == adapter.stats().node_count + 1


def test_read_many_is_one_pass_on_the_owner_thread(adapter, monkeypatch):
    """A batch is one pass in the engine's slices (one call into its queue); a small cache's
    batch runs in one step of it (one view). After it a read is its own call again."""
    engine, reads, calls = adapter.engine, known_reads(adapter), []
    call, call_pass = engine.call, engine.owner.call_pass
    monkeypatch.setattr(engine, "call", lambda fn, timeout=10.0, urgent=False: (calls.append(fn),
                                                                         call(fn, timeout, urgent))[1])
    monkeypatch.setattr(engine.owner, "call_pass", lambda steps, timeout: (calls.append(steps),
                                                                              call_pass(steps, timeout))[1])
    got = adapter.read_many([*reads, ("node", (987654,))])
    assert len(calls) == 1 and len(got) == len(reads) + 1 and isinstance(got[-1], UnknownNode)
    adapter.stats()  # after the batch (one that failed a read, too) a read is its own call again
    adapter.node(0)
    assert len(calls) == 3


def test_a_batch_is_one_view_of_a_busy_cache():
    """Under a running workload the tree changes between steps: every read of one batch sees the
    same version; read one after another (the contract's default), they do not."""
    engine = Engine(make_scheduler(), BUSY).start()
    try:
        adapter = BundledAdapter(engine)
        batch = [("stats", ())] * 8
        for _ in range(20):
            assert len({st.version for st in adapter.read_many(batch)}) == 1
        assert any(len({st.version for st in CacheAdapter.read_many(adapter, batch)}) > 1 for _ in range(20))
        assert engine.steps > 0
    finally:
        engine.stop()


def test_read_many_on_a_stopped_engine_raises(adapter):
    adapter.engine.stop()
    with pytest.raises(TargetUnreachable):
        adapter.read_many([("stats", ()), ("node", (0,))])


def test_attribution_pauses_the_cyclic_gc_only_while_it_runs(adapter):
    """It makes paths and rows by the hundred thousand on the owner thread: a collection midway
    only stalls the owner longer. The GC is left as it was found."""
    import gc

    from radixtop.adapters.owned.attribution import attribute

    seen: list[bool] = []

    def lock_ref(node):  # read for every node on a session's path, in the middle of the pass
        seen.append(gc.isenabled())
        return node.lock_ref

    def run(s):
        seen.clear()
        return attribute(s.cache.root_node, s.cache._session_leaves, s.cache._closed_session_ids,
                         s.session_activity, s.session_activity, 1, lock_ref=lock_ref)

    try:
        for enabled_before in (True, False):
            (gc.enable if enabled_before else gc.disable)()
            assert adapter.engine.call(run).sessions
            assert seen and not any(seen) and gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_a_batch_yields_before_a_read_it_expects_to_run_past_its_view_budget(monkeypatch):
    """A read_many pass runs its reads in one hold until ONE_VIEW_S is spent; the next read
    starts in the same hold only where one as long as the longest read of late would end within
    it (the first always runs): with 1 ms reads and a 1.5 ms budget, one read a hold, not two."""
    import radixtop.adapters.owned.reads as reads
    from radixtop.adapters.owned.reads import OwnerReads

    class Clock:
        now = 10.0

        def perf_counter(self) -> float:
            return self.now

        def thread_time(self) -> float:  # the reads' work is counted on the owner's CPU clock
            return self.now

    clock = Clock()
    monkeypatch.setattr(reads, "time", clock)
    per_step: list[list[str]] = []

    class Reads(OwnerReads):
        def __init__(self) -> None:
            self._init_owner_reads()

        def stats(self) -> str:
            clock.now += 0.001
            per_step[-1].append("stats")
            return "stats"

        def _call_pass(self, make):
            steps = make()
            per_step.append([])
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value
                per_step.append([])

    assert Reads().read_many([("stats", ())] * 4) == ["stats"] * 4
    assert [len(s) for s in per_step] == [1, 1, 1, 1]
    per_step.clear()
    clock.now, cheap = 10.0, Reads()  # a new adapter: no long read remembered

    def quick() -> str:
        clock.now += 0.0001
        per_step[-1].append("stats")
        return "stats"

    cheap.stats = quick
    cheap.read_many([("stats", ())] * 4)
    assert [len(s) for s in per_step] == [4]  # cheap reads: one step, one view of the cache
