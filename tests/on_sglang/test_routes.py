"""SGLangRoutesAdapter over a real HTTP server on loopback that serves SGLang's own routes and bodies
(``tests/on_sglang/ref/fake_sglang_http.py``: SGLang's LoadSnapshot, auth middleware and metric names,
from the 0.5.16 and 0.5.23 wheels on disk)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi import FastAPI

from radixtop.adapters.errors import (
    AdapterError,
    BadRequest,
    TargetTimeout,
    TargetUnreachable,
    Unauthorized,
    Unsupported,
)
from radixtop.adapters.model import Geometry
from radixtop.adapters.sglang.routes import CLOSE_POLICY, SGLangRoutesAdapter, parse_metrics, rank_sum
from tests.on_sglang.ref.fake_sglang_http import FakeSGLang, create_app, sglang_source
from tests.support.live_server import running_server

pytestmark = pytest.mark.filterwarnings("ignore:ORJSONResponse is deprecated")  # in SGLang's auth.py
VERSIONS = [pytest.param(v, marks=pytest.mark.skipif(sglang_source(v) is None, reason=f"needs sglang {v}"))
            for v in ("0.5.16", "0.5.23")]
TINY = Geometry("tiny", 2, 2, 8, "float32", 1, 256)


@contextmanager
def sglang(version: str, *, without: tuple[str, ...] = (), **options) -> Iterator[tuple[str, FakeSGLang]]:
    app = create_app(version, without=without, **options)
    with running_server(app) as url:
        yield url, app.state.sglang


@contextmanager
def adapter(url: str, **kwargs) -> Iterator[SGLangRoutesAdapter]:
    a = SGLangRoutesAdapter(url, settle_s=0, **kwargs)
    try:
        yield a
    finally:
        a.release()


def busy_day(sg: FakeSGLang, rank: int = 0) -> None:
    """Two sessions' requests finish, one request runs, the cache evicts 10 tokens."""
    sg.finish_request(100, 20, session_id="a", rank=rank)  # 80 new tree tokens
    sg.finish_request(50, 40, session_id="b", rank=rank)  # 10 more
    sg.run(30, rank=rank)
    sg.evict(10, rank=rank)


def paths(sg: FakeSGLang) -> list[str]:
    return [path for _, path, _ in sg.calls]


# ----- totals -----


@pytest.mark.parametrize("version", VERSIONS)
def test_stats_map_sglang_pool_and_counters(version):
    with sglang(version, capacity=4096) as (url, sg), adapter(url, geometry=TINY) as a:
        busy_day(sg)
        st = a.stats()
    assert (st.capacity_tokens, st.unevictable_tokens, st.evictable_tokens) == (4096, 30, 80)
    assert st.available_tokens == 4096 - 30 - 80
    assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens
    assert (st.prompt_tokens, st.cached_tokens, st.evicted_tokens) == (150, 60, 10)
    assert st.bytes_per_token == 256 and st.geometry == TINY and st.capacity_bytes == 4096 * 256
    assert version in st.target and (st.node_count, st.open_sessions, st.version) == (None, None, 0)
    assert {"/server_info", "/v1/loads", "/metrics"} <= set(paths(sg))


@pytest.mark.parametrize("version", VERSIONS)
def test_bytes_are_unknown_without_a_geometry(version):
    with sglang(version, page_size=16) as (url, _), adapter(url) as a:
        st = a.stats()
        assert st.bytes_per_token == 0 and st.capacity_bytes == 0
        assert (st.geometry.name, st.geometry.page_size) == ("unknown", 16)
        assert "geometry" in a.capabilities().reason
    with sglang(version) as (url, _), adapter(url, bytes_per_token=1000) as a:
        assert a.stats().available_bytes == 4096 * 1000


@pytest.mark.parametrize("version", VERSIONS)
def test_dp_ranks_are_summed_or_selected_and_tp_ranks_counted_once(version):
    with sglang(version, dp_size=2, tp_size=2, capacity=1000) as (url, sg):
        busy_day(sg, rank=0)
        sg.finish_request(300, 0, rank=1)
        sg.evict(50, rank=1)
        with adapter(url) as both, adapter(url, dp_rank=1) as one, adapter(url, dp_rank=2) as none:
            st, st1 = both.stats(), one.stats()
            with pytest.raises(BadRequest, match="no DP rank 2"):
                none.stats()
            assert "DP rank 1 only" in one.capabilities().reason
    assert (st.capacity_tokens, st.unevictable_tokens, st.evictable_tokens) == (2000, 30, 80 + 250)
    assert st.evicted_tokens == 60  # not doubled by the two TP ranks
    assert (st1.capacity_tokens, st1.unevictable_tokens, st1.evictable_tokens) == (1000, 0, 250)
    assert st1.evicted_tokens == (50 if version == "0.5.23" else 60)  # 0.5.16's has no rank labels
    assert (st1.prompt_tokens, st1.cached_tokens) == (450, 60)  # the tokenizer's: server-wide


def test_older_route_names_are_used_and_remembered():
    with sglang("0.5.16", without=("/server_info", "/v1/loads")) as (url, sg), adapter(url) as a:
        busy_day(sg)
        st = a.stats()
        a.stats()
    assert (st.capacity_tokens, st.unevictable_tokens, st.evictable_tokens) == (4096, 30, 80)
    assert paths(sg).count("/get_server_info") == 1  # kept: capacity does not change
    assert paths(sg).count("/v1/loads") == 1 and paths(sg).count("/get_load") == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_without_metrics_free_and_evictable_are_not_told_apart(version):
    with sglang(version, enable_metrics=False) as (url, sg), adapter(url) as a:
        busy_day(sg)
        st = a.stats()
        reason = a.capabilities().reason
    assert (st.capacity_tokens, st.unevictable_tokens) == (4096, 30)
    assert (st.evictable_tokens, st.available_tokens) == (0, 4066)
    assert (st.prompt_tokens, st.cached_tokens, st.evicted_tokens) == (0, 0, 0)
    assert "--enable-metrics" in reason


def test_a_server_that_is_not_sglang_is_named():
    with running_server(FastAPI()) as url, adapter(url) as a:
        with pytest.raises(AdapterError, match="does not look like an SGLang server"):
            a.stats()


# ----- capabilities and what plain HTTP cannot do -----


def test_capabilities_say_totals_close_and_flush_only():
    with sglang("0.5.16") as (url, _), adapter(url) as a:
        caps = a.capabilities()
    assert (caps.tree, caps.sessions, caps.close, caps.evict, caps.flush, caps.changes, caps.read_only) == \
        (False, False, True, False, True, False, False)
    for hint in ("SGLANG_PLUGINS=radixtop", "--kv-events-config", "blind", "no evict"):
        assert hint in caps.reason


def test_unsupported_reads_say_how_to_get_them():
    with sglang("0.5.16") as (url, sg), adapter(url) as a:
        tree_reads = [lambda: a.children(0), lambda: a.chain(0), lambda: a.node(0),
                      lambda: a.match([1, 2]), lambda: a.changes(0), lambda: list(a.export()),
                      a.export_columns]
        session_reads = [lambda: a.sessions(), lambda: a.session("a"), lambda: a.plan_close("a")]
        for read in tree_reads + session_reads + [lambda: a.evict(10)]:
            with pytest.raises(Unsupported, match="SGLANG_PLUGINS=radixtop") as err:
                read()
            assert err.value.http_status == 501
        for read in tree_reads:
            with pytest.raises(Unsupported, match="--kv-events-config"):
                read()
    assert sg.calls == []  # refused without asking the server


# ----- actions -----


def test_close_goes_to_close_session_and_reports_the_freed_tokens_it_sees():
    with sglang("0.5.16") as (url, sg), adapter(url, geometry=TINY) as a:
        busy_day(sg)
        result = a.close_session("a")
        st = a.stats()
    assert ("POST", "/close_session", {"session_id": "a"}) in sg.calls
    assert (result.session_id, result.policy, result.already_closed) == ("a", CLOSE_POLICY, False)
    assert (result.freed_tokens, result.freed_bytes, result.freed_node_ids) == (80, 80 * 256, ())
    assert (st.evictable_tokens, st.closes, st.freed_by_close_tokens) == (0, 1, 80)


def test_close_on_0523_only_dereferences_so_nothing_is_seen_freed():
    with sglang("0.5.23") as (url, sg), adapter(url) as a:
        busy_day(sg)
        result = a.close_session("a")
        assert (result.freed_tokens, a.stats().evictable_tokens) == (0, 80)
    assert ("POST", "/close_session", {"session_id": "a"}) in sg.calls


@pytest.mark.parametrize("version", VERSIONS)
def test_flush_when_idle_drops_the_cache(version):
    with sglang(version) as (url, sg), adapter(url, geometry=TINY) as a:
        sg.finish_request(100, 20, session_id="a")
        result = a.flush()
        st = a.stats()
    assert (result.flushed, result.freed_tokens, result.freed_bytes) == (True, 80, 80 * 256)
    assert (st.evictable_tokens, st.available_tokens) == (0, 4096)
    assert ("POST", "/flush_cache", None) in sg.calls


@pytest.mark.parametrize("version", VERSIONS)
def test_flush_while_requests_run_is_refused_with_sglangs_reason(version):
    with sglang(version) as (url, sg), adapter(url) as a:
        busy_day(sg)
        result = a.flush()
        assert a.stats().evictable_tokens == 80
    assert (result.flushed, result.freed_tokens) == (False, 0)
    assert "Flush cache failed" in result.message and "running" in result.message


# ----- transport and auth -----


def test_a_closed_port_is_unreachable_and_named():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with adapter(f"127.0.0.1:{port}") as a:
            with pytest.raises(TargetUnreachable, match=f"127.0.0.1:{port}"):
                a.stats()


def test_a_slow_server_times_out_and_is_named():
    with sglang("0.5.16") as (url, sg), adapter(url, timeout=0.1) as a:
        sg.delay_s = 0.4
        with pytest.raises(TargetTimeout, match=url):
            a.stats()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_api_key_is_sent_as_a_bearer_token(version):
    with sglang(version, api_key="s3cret") as (url, sg):
        busy_day(sg)
        with adapter(url, api_key="s3cret") as a:
            assert a.stats().evictable_tokens == 80
            assert a.close_session("b").freed_tokens == (10 if version == "0.5.16" else 0)
            assert not a.flush().flushed  # refused as busy, not as unauthorized
        for key in (None, "wrong"):
            with adapter(url, api_key=key) as a, pytest.raises(Unauthorized, match="--api-key"):
                a.stats()


# ----- pieces -----


def test_parse_metrics_reads_only_the_named_samples():
    text = "\n".join([
        "# TYPE sglang:num_used_tokens gauge",
        'sglang:num_used_tokens{model_name="a \\"b\\" c",tp_rank="0"} 12.0',
        'sglang:num_used_tokens_other{tp_rank="0"} 99',
        'sglang:kv_available_tokens{tp_rank="0"} NaN',
        "sglang:prompt_tokens_total 3e2",
    ])
    got = parse_metrics(text)
    assert got["sglang:num_used_tokens"] == [({"model_name": 'a \\"b\\" c', "tp_rank": "0"}, 12.0)]
    assert got["sglang:kv_available_tokens"] == [] and got["sglang:prompt_tokens_total"] == [({}, 300.0)]


def test_rank_sum_takes_one_scheduler_per_dp_rank():
    samples = [({"dp_rank": "0", "tp_rank": "0"}, 5.0), ({"dp_rank": "0", "tp_rank": "1"}, 5.0),
               ({"dp_rank": "1", "tp_rank": "2"}, 7.0), ({"dp_rank": "1", "tp_rank": "3"}, 7.0)]
    assert (rank_sum(samples, None), rank_sum(samples, 1), rank_sum(samples, 4)) == (12, 7, None)
    assert rank_sum([({"tp_rank": "0"}, 3.0)], 0) == 3 and rank_sum([], None) is None
