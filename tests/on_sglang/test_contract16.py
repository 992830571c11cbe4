"""The contract suite against the in-process SGLang adapter over the REAL SGLang 0.5.16 RadixCache
(its session mixin, allocator and KV pool), every read and action through the owner queue that a
scheduler thread drains between steps. Never skipped: CI installs sglang (.ci/)."""

from __future__ import annotations

import threading

import pytest

from radixtop.adapters.errors import TargetTimeout, UnknownNode
from tests.contract.suite import ContractSuite, known_reads
from tests.on_sglang.ref.known16 import known_adapter


@pytest.fixture
def adapter():
    with known_adapter() as (a, _, _):
        yield a


@pytest.fixture
def read_only_adapter():
    with known_adapter(read_only=True) as (a, _, _):
        yield a



class TestSGLang016(ContractSuite):
    """The contract over the in-process adapter on SGLang 0.5.16's own cache."""


def test_views_agree_with_sglangs_own_objects():
    with known_adapter() as (a, replayer, _):
        cache, allocator = replayer.cache, replayer.allocator
        st = a.stats()
        assert st.available_tokens == allocator.available_size() and st.capacity_tokens == allocator.size
        assert st.evictable_tokens == cache.evictable_size() and st.total_tokens == cache.total_size()
        kv = replayer.kv_pool
        per_token = sum(t[0].numel() * t.element_size() for t in (*kv.k_buffer, *kv.v_buffer))
        assert st.bytes_per_token == per_token == 256  # measured on SGLang's own K/V tensors
        rows = {tuple(r["path"]): r for r in replayer.tree_rows()}
        seen = 0
        stack = [(0, ())]
        while stack:
            node_id, path = stack.pop()
            for child in a.children(node_id, 0, 1000).children:
                full = path + tuple(a.node(child.id, 0, 1000).token_ids)
                row = rows[full]
                assert (child.tokens, child.lock_ref, list(child.holders)) == (row["tokens"], row["lock_ref"], row["holders"])
                seen += 1
                stack.append((child.id, full))
        assert seen == len(rows) == st.node_count
        m = a.match([1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 99])
        assert m.matched_tokens == 10 and m.partial_node_id is None


def test_close_goes_through_sglang_and_matches_its_count():
    with known_adapter() as (a, replayer, _):
        plan = a.plan_close("b")
        before = replayer.allocator.available_size()
        result = a.close_session("b")
        assert replayer.allocator.available_size() - before == plan.freed_tokens == result.freed_tokens == 3
        assert "b" in replayer.cache._closed_session_ids and "b" not in replayer.cache._session_leaves


def test_a_stuck_scheduler_times_out_cleanly_and_runs_nothing_late():
    with known_adapter() as (a, replayer, scheduler):
        a.timeout = 0.3
        scheduler.running.clear()  # the scheduler stops draining between batches
        with pytest.raises(TargetTimeout, match="did not take the request within 0.3s"):
            a.close_session("b")
        scheduler.running.set()
        assert a.stats().closes == 1  # only "gone" (closed when built): the timed-out close never ran
        assert "b" in replayer.cache._session_leaves


def test_read_many_is_one_pass_on_the_scheduler_thread():
    """A batch is one pass run in the scheduler's slices (one call into its queue), on its
    thread; a small cache's pass ends within one slice."""
    with known_adapter() as (a, _, scheduler):
        reads, passes, threads = known_reads(a), [], set()
        call_pass, run = a._owner.call_pass, a._run
        a._owner.call_pass = lambda steps, timeout: (passes.append(steps), call_pass(steps, timeout))[1]
        a._run = lambda fn, timeout, urgent=False: (passes.append(fn), run(fn, timeout, urgent))[1]
        stats = a.stats
        a.stats = lambda: (threads.add(threading.current_thread().name), stats())[1]
        got = a.read_many([*reads, ("node", (987654,))])
        assert len(passes) == 1 and len(got) == len(reads) + 1 and isinstance(got[-1], UnknownNode)
        assert threads == {"sglang-scheduler"}
        a.stats = stats
        a.stats()  # after the batch a read is its own call again
        assert len(passes) == 2
        a.timeout = 0.3
        scheduler.running.clear()  # a stuck scheduler: the batch times out as a whole
        with pytest.raises(TargetTimeout):
            a.read_many([("stats", ()), ("node", (987654,))])


def test_tiers_come_from_sglangs_own_node_fields():
    """HiCache does not run on these CPU machines; what it sets on a node does: ``host_value``
    (SGLang's ``backuped``) puts host among the node's tiers, and a node whose device value is
    gone (``value`` None, host-only) is no longer on the GPU."""
    with known_adapter() as (a, replayer, _):
        kids = a.children(0, 0, 100).children
        assert kids and all(k.tiers == ("GPU",) for k in kids)
        node = replayer.cache.root_node.children[next(iter(replayer.cache.root_node.children))]
        node.host_value = node.value.clone()  # a write-through backup, as HiCache's would set it
        assert a.node(node.id).node.tiers == ("GPU", "host")
        device, node.value = node.value, None  # device copy evicted: host-only
        try:
            assert a.node(node.id).node.tiers == ("host",)
        finally:
            node.value, node.host_value = device, None
