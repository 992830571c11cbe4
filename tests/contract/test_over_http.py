"""The contract suite over HTTP: RadixtopClient -> a real uvicorn server -> the bundled adapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.model import ROOT_ID, NodeView, SessionView
from tests.contract.suite import ContractSuite
from tests.support.engines import build_engine
from tests.support.live_server import running_server

TOKEN = "contract-test-token"


@contextmanager
def served(read_only: bool = False) -> Iterator[tuple[RadixtopClient, BundledAdapter]]:
    """An RadixtopClient and, behind its server, the in-process adapter it talks to."""
    engine = build_engine()
    local = BundledAdapter(engine, read_only=read_only)
    try:
        with running_server(create_app(local, TOKEN, AuditLog(None))) as url:
            remote = RadixtopClient(url, token=TOKEN, timeout=10)
            try:
                yield remote, local
            finally:
                remote.release()
    finally:
        engine.stop()


@pytest.fixture
def adapter():
    with served() as (remote, _):
        yield remote


@pytest.fixture
def read_only_adapter():
    with served(read_only=True) as (remote, _):
        yield remote



class TestOverHttp(ContractSuite):
    """The contract over HTTP: a RadixtopClient of a real server over the bundled adapter."""


def _ageless(node: NodeView) -> NodeView:
    # Ages are measured when a view is taken, so two reads differ there and only there.
    return dataclasses.replace(node, access_age_s=0.0, created_age_s=0.0)


def _session_ageless(view: SessionView) -> SessionView:
    return dataclasses.replace(view, last_activity_age_s=0.0)


def test_views_over_http_equal_the_in_process_ones():
    with served() as (remote, local):
        assert remote.name.startswith("http://127.0.0.1:")
        assert remote.capabilities() == local.capabilities()
        assert remote.stats() == local.stats()
        page_r, page_l = remote.sessions("id", 0, 100), local.sessions("id", 0, 100)
        assert page_r.figures_age_s <= page_l.figures_age_s  # read earlier, of the same attribution
        assert dataclasses.replace(page_r, sessions=(), figures_age_s=0.0) == \
            dataclasses.replace(page_l, sessions=(), figures_age_s=0.0)
        assert [_session_ageless(v) for v in page_r.sessions] == [_session_ageless(v) for v in page_l.sessions]
        detail_r, detail_l = remote.session("a"), local.session("a")
        assert _session_ageless(detail_r.session) == _session_ageless(detail_l.session)
        assert detail_r.node_ids == detail_l.node_ids
        assert remote.plan_close("a") == local.plan_close("a")
        assert remote.match([1, 2, 3, 4, 5, 99]) == local.match([1, 2, 3, 4, 5, 99])
        v = local.stats().version
        assert remote.changes(v - 3) == local.changes(v - 3)
        page_r, page_l = remote.children(ROOT_ID, 0, 10), local.children(ROOT_ID, 0, 10)
        assert page_r.children and isinstance(page_r.children, tuple)
        assert [_ageless(c) for c in page_r.children] == [_ageless(c) for c in page_l.children]
        detail_r, detail_l = remote.node(page_l.children[0].id), local.node(page_l.children[0].id)
        assert _ageless(detail_r.node) == _ageless(detail_l.node)
        assert dataclasses.replace(detail_r, node=None) == dataclasses.replace(detail_l, node=None)
        assert list(remote.export()) == list(local.export())



def test_audit_over_http_is_newest_first():
    with served() as (remote, _):
        remote.plan_close("a")
        evicted = remote.evict(1)
        entries = remote.audit(limit=10)
        assert [(e.action, e.target, e.allowed, e.client) for e in entries] == [
            ("evict", "cache", True, "127.0.0.1"), ("close_dry_run", "session:a", True, "127.0.0.1")]
        assert entries[0].result == evicted.to_dict() and entries[0].extra == {"requested_tokens": 1}
        assert remote.audit(limit=1, offset=1) == entries[1:]
