"""A target that sends numbers of the wrong type (a string, a float, a negative, a bool, NaN or a
huge int where a count belongs) is refused at the wire: each command says one line (exit 1), the
dashboard keeps running and says why, the API of `serve --sglang-url` stays up over NaN and
infinite metrics."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import AdapterError
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.http.wire import WireError, from_wire, match_from_dict, stats_from_dict
from radixtop.adapters.model import MatchView
from radixtop.adapters.sglang.routes import SGLangRoutesAdapter, parse_metrics
from tests.support.engines import build_engine
from tests.support.live_server import running_server

LIE: dict[str, Any] = {}
"""What the lying server changes now: ``path`` (a route), ``field`` (dotted, list indexes as
numbers) and ``value``."""

WRONG = ["5", 5.5, -4, True, math.nan, 2**70]


def lie(body: Any) -> None:
    *parents, last = LIE["field"].split(".")
    for key in parents:
        body = body[int(key)] if isinstance(body, list) else body[key]
    body[last] = LIE["value"]


def lying_app(real: str) -> FastAPI:
    """Passes every GET to the real server ``real`` and changes one number of one route's reply."""
    app = FastAPI()

    @app.get("/{rest:path}")
    def passed_on(rest: str, request: Request) -> Response:
        reply = httpx.get(f"{real}/{rest}", params=request.query_params, timeout=10, trust_env=False)
        body = reply.json()
        if f"/{rest}" == LIE.get("path"):
            lie(body)
        elif rest == "v1/read":  # the dashboard's batch: every answer that has the field
            for answer in body["results"]:
                if isinstance(answer.get("ok"), dict) and LIE.get("field", ".").split(".")[0] in answer["ok"]:
                    lie(answer["ok"])
        return Response(json.dumps(body), status_code=reply.status_code, media_type="application/json")

    return app


@pytest.fixture(scope="module")
def liar():
    engine = build_engine()
    try:
        with running_server(create_app(BundledAdapter(engine), "t" * 24, AuditLog(None))) as real, \
                running_server(lying_app(real)) as url:
            client = RadixtopClient(real)
            client.match([1, 2, 3])
            assert client.sessions().sessions, "the engine has sessions to show"
            client.release()
            yield url
    finally:
        engine.stop()
        LIE.clear()


def radixtop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "200"})


CASES = [
    *((["stats"], "/v1/stats", "capacity_tokens", v) for v in WRONG),
    *((["stats"], "/v1/stats", "geometry.bytes_per_token", v) for v in ("5", -1)),
    *((["sessions"], "/v1/sessions", "sessions.0.exclusive_bytes", v) for v in (1.5, True)),
    *((["match", "1", "2", "3"], "/v1/match", "matched_tokens", v) for v in (-4, 99, "3")),
    *((["doctor"], "/v1/doctor", "took_s", v) for v in ("fast", True)),
    *((["tree"], "/v1/nodes/0/subtree", "rows.0.node.subtree_bytes", v) for v in (-1, "big")),
    *((["node", "#1"], "/v1/nodes/1", "node.depth", v) for v in (0.5, False)),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, path, field, value", CASES,
                         ids=[f"{c[0][0]}-{c[2]}-{c[3]!r}" for c in CASES])
def test_a_wrong_number_is_one_line_from_every_command(liar, args, path, field, value):
    LIE.update(path=path, field=field, value=value)
    done = radixtop(*args, "--url", liar, "--timeout", "10")
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert liar in done.stderr and "unexpected reply" in done.stderr or "not JSON" in done.stderr, done.stderr


def test_the_dashboard_keeps_running_and_says_why(liar):
    from radixtop.inspector.app import RadixtopApp

    LIE.update(path="/v1/stats", field="capacity_tokens", value="5")

    async def drive() -> tuple[bool, str]:
        app = RadixtopApp(RadixtopClient(liar, timeout=5), interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                lines = (strip.text.strip() for strip in app.screen._compositor.render_strips())
                text = " ".join(" ".join(lines).split())
                if "not a count" in text:
                    break
            return app.is_running, text

    running, text = asyncio.run(drive())
    assert running and "capacity_tokens" in text and "not a count" in text, text


@pytest.mark.parametrize("value", WRONG[:-1] + [None])
def test_the_wire_checks_every_number(value):
    good = {"query_tokens": 3, "matched_tokens": 2, "node_id": 4, "partial_node_id": None, "partial_tokens": 0,
            "matched_bytes": 512}
    assert from_wire(MatchView, good).matched_tokens == 2
    with pytest.raises(WireError, match="matched_tokens"):
        match_from_dict({**good, "matched_tokens": value})


def test_a_match_longer_than_its_query_is_refused():
    with pytest.raises(WireError, match="4 of 3 tokens"):
        match_from_dict({"query_tokens": 3, "matched_tokens": 4, "node_id": 4, "partial_node_id": None,
                         "partial_tokens": 0, "matched_bytes": 512})


def test_a_why_whose_lost_tokens_are_not_past_its_cached_ones_in_order_is_refused():
    from radixtop.adapters.http.wire import why_from_dict

    lost = {"start": 2, "end": 5, "cause": "closed", "at": 1.5, "node_id": 9, "session_id": "s", "holders": [],
            "protected_tokens": None, "capacity_tokens": None, "who": ""}
    good = {"query_tokens": 6, "cached_tokens": 2, "diverges_at": 2, "node_id": 4, "partial_node_id": None,
            "partial_tokens": 0, "lost": [lost, {**lost, "start": 5, "end": 6}], "history_since": 0.0}
    assert len(why_from_dict(good).lost) == 2
    for bad in ({"lost": [{**lost, "start": 1}]}, {"lost": [lost, lost]}, {"lost": [{**lost, "end": 7}]},
                {"diverges_at": 3}, {"cached_tokens": 7}, {"lost": [{**lost, "cause": "magic"}]},
                {"lost": [{**lost, "at": "soon"}]}):
        with pytest.raises(WireError):
            why_from_dict({**good, **bad})


def test_a_sessions_story_with_figures_that_do_not_add_up_is_refused():
    from radixtop.adapters.http.wire import session_why_from_dict

    loss = {"at": 1.5, "cause": "evicted", "nodes": 2, "tokens": 9, "node_id": 4, "session_id": None,
            "protected_tokens": 3, "capacity_tokens": 64, "who": ""}
    good = {"session_id": "s", "requests": [{"at": 1.0, "prompt_tokens": 5, "cached_tokens": 2}], "requests_kept": 1,
            "prompt_tokens": 5, "cached_tokens": 2, "requests_since": 0.5, "lost": [loss],
            "lost_tokens": {"evicted": 9}, "history_since": 0.0}
    assert session_why_from_dict(good, "s").lost[0].tokens == 9
    assert session_why_from_dict({**good, "requests": None, "requests_kept": None}).requests is None
    for bad in ({"requests": [{"at": 1.0, "prompt_tokens": 5, "cached_tokens": 6}]}, {"requests_kept": 0},
                {"requests_kept": None}, {"lost": [{**loss, "tokens": 1}]}, {"lost": [{**loss, "nodes": 0}]},
                {"lost_tokens": {"evicted": 8}}, {"lost_tokens": {"evicted": 9, "magic": 1}},
                {"lost": [{**loss, "cause": "magic"}]}, {"requests_since": "soon"}):
        with pytest.raises(WireError):
            session_why_from_dict({**good, **bad})
    with pytest.raises(WireError, match="answered for"):
        session_why_from_dict(good, "t")


def test_a_history_page_numbered_out_of_order_or_from_before_the_readers_place_is_refused():
    from radixtop.adapters.http.wire import history_page_from_dict

    ghost = {"seq": 5, "at": 1.0, "cause": "evicted", "node_id": 9, "parent_id": None, "tokens": [1, 2],
             "session_id": None, "holders": [], "protected_tokens": 0, "capacity_tokens": 64, "who": ""}
    good = {"epoch": "e", "removed": [ghost, {**ghost, "seq": 6}], "removed_first": 5, "removed_count": 6,
            "served": None, "served_first": 1, "served_count": 0, "history_since": 0.0}
    assert [g.seq for g in history_page_from_dict(good, 4, 0).removed] == [5, 6]
    assert history_page_from_dict(good, 2, 0).removed_first == 5  # (3 and 4 dropped by the bounds: a gap)
    for bad, after in (({"removed": [ghost, ghost]}, 4), ({}, 5), ({"removed_count": 5}, 4),
                       ({"removed_first": 4}, 3), ({"removed": [{**ghost, "tokens": ["x"]}]}, 4)):
        with pytest.raises(WireError):
            history_page_from_dict({**good, **bad}, after, 0)


def test_a_blocks_hash_of_64_bits_names_what_left_on_the_wire():
    """On a KV-event stream a lost run, a ghost or a branch is named by its block's hash, 64 bits
    unsigned (vLLM's digests; SGLang's Rust core's hashes as their bits): it crosses the wire as
    it is; past 64 bits, negative or not a whole number, it is refused."""
    from radixtop.adapters.http.wire import history_page_from_dict, then_from_dict, why_from_dict

    big = (1 << 64) - 3
    lost = {"start": 0, "end": 4, "cause": "evicted", "at": 1.0, "node_id": big, "session_id": None, "holders": [],
            "protected_tokens": None, "capacity_tokens": None, "who": ""}
    why = {"query_tokens": 4, "cached_tokens": 0, "diverges_at": 0, "node_id": 0, "partial_node_id": None,
           "partial_tokens": 0, "lost": [lost], "history_since": 0.0, "lost_unit": "block"}
    assert why_from_dict(why).lost[0].node_id == big
    ghost = {"seq": 1, "at": 1.0, "cause": "evicted", "node_id": big, "parent_id": big - 1, "tokens": [1],
             "session_id": None, "holders": [], "protected_tokens": None, "capacity_tokens": None, "who": ""}
    page = {"epoch": "e", "removed": [ghost], "removed_first": 1, "removed_count": 1, "served": None,
            "served_first": 1, "served_count": 0, "history_since": 0.0}
    assert history_page_from_dict(page, 0, 0).removed[0].parent_id == big - 1
    branch = {"node_id": big, "parent_id": big - 1, "nodes": 1, "tokens": 4, "first_at": 1.0, "last_at": 1.0,
              "causes": {"evicted": 4}, "holders": []}
    then = {"at": 1.0, "tokens_then": 4, "tokens_now": 0, "left_tokens": 4, "left_nodes": 1,
            "left_by_cause": {"evicted": 4}, "left": [branch], "left_branches": 1, "stored_tokens": 0,
            "stored_nodes": 0, "stored": [], "stored_branches": 0, "history_since": 0.5, "unit": "block"}
    assert then_from_dict(then).left[0].node_id == big
    for bad in (1 << 64, -1, 1.5, True):
        with pytest.raises(WireError):
            why_from_dict({**why, "lost": [{**lost, "node_id": bad}]})


def test_a_then_whose_figures_do_not_add_up_is_refused():
    from radixtop.adapters.http.wire import then_from_dict

    branch = {"node_id": 4, "parent_id": None, "nodes": 2, "tokens": 9, "first_at": 1.0, "last_at": 1.5,
              "causes": {"closed": 9}, "holders": ["s"]}
    good = {"at": 1.0, "tokens_then": 20, "tokens_now": 15, "left_tokens": 9, "left_nodes": 2,
            "left_by_cause": {"closed": 9}, "left": [branch], "left_branches": 1, "stored_tokens": 4,
            "stored_nodes": 1, "stored": [{**branch, "tokens": 4, "nodes": 1, "causes": {}, "holders": []}],
            "stored_branches": 1, "history_since": 0.5}
    assert then_from_dict(good).left[0].tokens == 9
    for bad in ({"tokens_then": 21}, {"left_by_cause": {"closed": 8}}, {"left_by_cause": {"magic": 9}},
                {"left_branches": 0}, {"left": [{**branch, "tokens": 10}]}, {"left": [{**branch, "nodes": 0}]},
                {"left": [{**branch, "last_at": 0.5}]}, {"stored_tokens": 3}, {"tokens_now": "many"}):
        with pytest.raises(WireError):
            then_from_dict({**good, **bad})
    # the sessions then: their counts and each one's figures agree, or the answer is refused
    session = {"session_id": "s", "state": "open", "requests": 2, "prompt_tokens": 10, "cached_tokens": 4,
               "last_at": 0.9, "last_prompt_tokens": 6, "last_cached_tokens": 4, "lost_since_tokens": 9}
    sessions = {"sessions": [session], "sessions_active": 1, "sessions_open": 1, "sessions_since": 0.5}
    assert then_from_dict({**good, **sessions}).sessions[0].state == "open"
    # (a moment is told as of the end of its millisecond: an op later in it is the moment's)
    assert then_from_dict({**good, **sessions, "sessions": [{**session, "last_at": 1.0007}]}).sessions
    for bad in ({"sessions_since": None}, {"sessions_active": 0}, {"sessions_open": 2},
                {"sessions": [{**session, "cached_tokens": 11}]}, {"sessions": [{**session, "last_at": 1.5}]},
                {"sessions": [{**session, "last_at": 1.001}]},
                {"sessions": [{**session, "state": "ajar"}]}):
        with pytest.raises(WireError):
            then_from_dict({**good, **sessions, **bad})
    # the sessions' memory then: known since before the moment, each one held something then
    mine = {"session_id": "s", "tagged_nodes": 2, "exclusive_tokens": 5, "shared_tokens": 3, "tagged_nodes_now": 0,
            "exclusive_tokens_now": 0, "shared_tokens_now": 0}
    memory = {"memory": [mine], "memory_sessions": 1, "memory_since": 0.5, "bytes_per_token": 2}
    assert then_from_dict({**good, **memory}).memory[0].exclusive_tokens == 5
    assert then_from_dict({**good, "memory": None, "memory_sessions": None, "memory_since": 2.0}).memory is None
    for bad in ({"memory_since": None}, {"memory_since": 1.5}, {"memory_sessions": 0},
                {"memory": [mine, mine], "memory_sessions": 2},
                {"memory": [{**mine, "tagged_nodes": 0, "exclusive_tokens": 0, "shared_tokens": 0}]},
                {"memory": [{**mine, "shared_tokens": -1}]}, {"memory": None, "memory_sessions": 1}):
        with pytest.raises(WireError):
            then_from_dict({**good, **memory, **bad})


def test_stats_floats_and_bools_are_checked():
    engine = build_engine()
    try:
        d = json.loads(json.dumps(BundledAdapter(engine).stats().to_dict()))
    finally:
        engine.stop()
    assert stats_from_dict(d).capacity_tokens == 256
    for field, value in (("open_sessions", -1), ("target", 5), ("tier_tokens", {"GPU": "x"}), ("version", 1.0)):
        with pytest.raises(WireError, match=field):
            stats_from_dict({**d, field: value})


# ----- SGLang's own routes (`--sglang-url`) -----


def sglang_stub(metrics: str, loads: Any) -> FastAPI:
    app = FastAPI()
    app.get("/server_info")(lambda: {"version": "0.5.16", "page_size": 1})
    app.get("/v1/loads")(lambda: loads)
    app.get("/metrics")(lambda: Response(metrics, media_type="text/plain"))
    return app


GOOD_LOADS = {"loads": [{"max_total_num_tokens": 1000, "num_used_tokens": 100}]}


def test_nan_and_infinite_metrics_are_left_out_and_serve_stays_up():
    metrics = ("sglang:kv_available_tokens +Inf\nsglang:kv_evictable_tokens NaN\n"
               "sglang:prompt_tokens_total -Inf\nsglang:cached_tokens_total 1e400\n"
               "sglang:evicted_tokens_total -5\n")
    assert parse_metrics(metrics) == {name: [] for name in parse_metrics("")}
    with running_server(sglang_stub(metrics, GOOD_LOADS)) as sglang:
        adapter = SGLangRoutesAdapter(sglang, timeout=5)
        with running_server(create_app(adapter, "t" * 24, AuditLog(None))) as url:
            for path in ("/v1/stats", "/healthz", "/v1/capabilities"):
                reply = httpx.get(f"{url}{path}", timeout=10, trust_env=False)
                assert reply.status_code == 200, (path, reply.text)
            stats = httpx.get(f"{url}/v1/stats", timeout=10, trust_env=False).json()
            assert stats["capacity_tokens"] == 1000 and stats["unevictable_tokens"] == 100
            assert stats["available_tokens"] + stats["evictable_tokens"] == 900
        adapter.release()


@pytest.mark.parametrize("load", [{"max_total_num_tokens": 1000, "num_used_tokens": "100"},
                                  {"max_total_num_tokens": 1000, "num_used_tokens": True},
                                  {"max_total_num_tokens": 1000, "num_used_tokens": -3},
                                  {"max_total_num_tokens": 1000.5, "num_used_tokens": 3},
                                  {"max_total_num_tokens": "1000", "num_used_tokens": 3}])
def test_wrong_numbers_in_v1_loads_are_a_wire_error_naming_the_server(load):
    with running_server(sglang_stub("", {"loads": [load]})) as sglang:
        adapter = SGLangRoutesAdapter(sglang, timeout=5)
        with pytest.raises(AdapterError, match=f"unexpected /v1/loads body from {sglang}: .* not a count"):
            adapter.stats()
        with running_server(create_app(adapter, "t" * 24, AuditLog(None))) as url:
            reply = httpx.get(f"{url}/v1/stats", timeout=10, trust_env=False)
            assert reply.status_code == 500 and "not a count" in reply.json()["error"]["message"]
        adapter.release()


@pytest.mark.parametrize("field, value", [("node_count", "3"), ("node_count", -1), ("holders_bytes", True),
                                          ("version", 1.5), ("bytes_per_token", None)])
def test_a_columnar_export_header_with_a_wrong_number_is_a_wire_error(field, value):
    from radixtop.adapters.http.wire import decode_export_columns
    from radixtop.adapters.model import EXPORT_COLUMNS

    header = {"version": 1, "bytes_per_token": 256, "node_count": 0, "root_id": 0, "columns": list(EXPORT_COLUMNS),
              "dtype": "<i8", "holders_bytes": 2}
    assert decode_export_columns(json.dumps(header).encode() + b"\n{}").node_count == 0
    with pytest.raises(WireError, match=field):
        decode_export_columns(json.dumps({**header, field: value}).encode() + b"\n{}")


def test_the_api_schemas_of_the_history_have_every_field_of_its_views():
    """The OpenAPI schema of the history's answers (``schemas.py``) names every field of the views
    the server sends (a field the model gained and the schema did not is an answer that violates
    the schema: the fuzzer's finding)."""
    import dataclasses

    from radixtop.adapters.http import schemas
    from radixtop.adapters.model import GhostView, HistoryPage, ServedEntry, SessionThenView, ThenView

    for view, out in ((ServedEntry, schemas.ServedEntryOut), (HistoryPage, schemas.HistoryPageOut),
                      (GhostView, schemas.GhostOut), (ThenView, schemas.ThenOut),
                      (SessionThenView, schemas.SessionThenOut)):
        assert {f.name for f in dataclasses.fields(view)} <= set(out.model_fields), (view.__name__, out.__name__)
