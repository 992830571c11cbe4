"""SGLang's leak-check buckets on the bundled engine: each counted on its own, so they add up on a
healthy engine (idle or running) and show a slot nobody owns."""

from __future__ import annotations

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.text import bucket_line
from tests.support.engines import build_engine


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


def test_the_buckets_add_up_idle_and_while_a_request_runs(engine):
    adapter = BundledAdapter(engine)
    st = adapter.stats()
    (full,) = st.buckets
    assert (full.component, full.total, full.available, full.evictable) == (
        "full", st.capacity_tokens, st.available_tokens, st.evictable_tokens)
    assert (full.protected, full.session_held, full.uncached) == (
        st.protected_tokens, st.session_held_tokens, st.uncached_tokens)  # one word, one figure
    assert full.uncached == 2 and full.unaccounted == 0  # the known running request's own [9, 9]
    engine.call(lambda s: s.begin("r-running", list(range(5000, 5100)), None))
    (busy,) = adapter.stats().buckets
    assert busy.uncached == 102 and busy.unaccounted == 0
    assert bucket_line(busy).endswith("uncached=102 · adds up")


def test_a_slot_nobody_owns_is_unaccounted(engine):
    """A leak planted as SGLang's bugs make them: slots taken from the allocator, owned by no
    request and no tree node."""
    adapter = BundledAdapter(engine)
    engine.call(lambda s: s.pool.allocator.alloc(16))
    (full,) = adapter.stats().buckets
    assert full.unaccounted == 16
    assert bucket_line(full).endswith("· 16 tokens unaccounted: SGLang's leak check fails")
