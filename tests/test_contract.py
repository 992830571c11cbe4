"""The contract suite against the bundled adapter, in process."""

from __future__ import annotations

import pytest

from adapters.bundled import BundledAdapter
from tests.contract import *  # noqa: F401,F403  (the shared contract tests)
from tests.contract import build_engine


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


def test_fast_ndjson_export_equals_the_generic_encoding(adapter):
    import json

    from adapters.base import CacheAdapter

    fast = "".join(adapter.export_ndjson(chunk_rows=3))
    generic = "".join(CacheAdapter.export_ndjson(adapter, chunk_rows=3))
    assert [json.loads(x) for x in fast.splitlines()] == [json.loads(x) for x in generic.splitlines()]
    assert len(fast.splitlines()) == adapter.stats().node_count + 1
