"""Fixtures for every test (an audit journal, a small scheduler), and what is not collected where."""

from __future__ import annotations

import os

import pytest

from radixtop.adapters.http.server.audit import AuditLog
from radixtop.gpu_backend.scheduler import Scheduler
from tests.support.engines import SGLANG_VERSION, make_scheduler

# The SGLang 0.5.23 tests (tests/on_sglang23/) belong to .venv-sglang23 (.ci/test runs that folder
# there); beside any other sglang they are not collected at all rather than skipped.
collect_ignore = [] if SGLANG_VERSION == "0.5.23" else ["on_sglang23"]

# The plugin runs radixtop beside SGLang's scheduler by default (issue 27); the tests that attach it
# to a scheduler of their own, or start a real server without naming a place, test it in the
# scheduler's process. Where the place matters a test names it (test_real_server.py runs each test
# both ways, beside through the default: RADIXTOP_BESIDE unset).
os.environ.setdefault("RADIXTOP_BESIDE", "0")


@pytest.fixture
def audit(tmp_path):
    """An audit journal in a file of the test's own."""
    log = AuditLog(tmp_path / "audit.jsonl")
    yield log
    log.close()


@pytest.fixture
def scheduler() -> Scheduler:
    return make_scheduler()
