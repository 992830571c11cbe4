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
