"""The leak doctor over the REAL SGLang 0.5.23 UnifiedRadixCache (Python tree core, sessions on), in
process: requests hold their lock by NodeId there; a healthy cache reports nothing, a planted lock
is reported. Needs sglang 0.5.23 (``.venv-sglang23``); not collected beside any other sglang."""

from __future__ import annotations

from tests.support.engines import SGLANG_VERSION

if SGLANG_VERSION != "0.5.23":  # tests/conftest.py collects this file only beside 0.5.23
    raise RuntimeError(f"needs sglang 0.5.23 (found {SGLANG_VERSION}): run it with .venv-sglang23")

import pytest  # noqa: E402

from radixtop.adapters.text import diagnosis_text  # noqa: E402
from tests.on_sglang.ref import drive23, known23  # noqa: E402

pytestmark = pytest.mark.sglang


def test_a_healthy_unified_cache_reports_nothing_and_a_planted_lock_is_reported():
    drive23.import_sglang23()
    with known23.known_adapter() as (adapter, known, scheduler):
        assert isinstance(known.running.last_node, int)  # a NodeId, resolved through the tree's arena
        adapter.running_requests = lambda: [known.running] if known.running is not None else []
        adapter.waiting_requests = lambda: []
        d = adapter.diagnose()
        assert d.healthy, diagnosis_text(d)
        assert {"leaked_lock", "tombstone_tags", "starved_admission"} <= set(d.checked)
        assert "counter" in d.skipped["idle_session"]  # its access stamps are no clock

        def plant() -> int:
            node = next(iter(adapter.tree.session_leaves()["b"]))
            known.cache.inc_lock_ref(node.id)  # a lock no request holds, never released
            return node.id

        node_id = scheduler.owner.call(plant, 10.0)
        (f,) = adapter.diagnose().findings
        assert f.kind == "leaked_lock" and f.node_ids[0] == node_id and f.figures["held_by_requests"] == 0
        assert f.tokens > 0 and "SGLang 0.5.23's bug" in f.action
        adapter.running_requests = lambda: []  # the scheduler lost d's request: its lock is leaked too
        assert len(adapter.diagnose().findings) == 2


def test_on_the_rust_core_it_checks_what_it_can_and_says_why_not_the_rest():
    drive23.import_sglang23()
    with known23.known_adapter("unified-nosessions", tree_core_backend="rust") as (adapter, known, _):
        adapter.running_requests = lambda: [known.running]
        adapter.waiting_requests = lambda: []
        d = adapter.diagnose()
        assert d.healthy and d.nodes_walked is None and d.checked == ("starved_admission",)
        assert "no nodes Python can read" in d.skipped["leaked_lock"]
        assert set(d.skipped) == {"buckets", "leaked_lock", "tombstone_tags", "idle_session"}
