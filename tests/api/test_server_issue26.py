"""The admin API over a live uvicorn server: a GET on an action's route (405), the metrics' one
partition of capacity, heavy-read slots and slow export readers, far pages of a wide node."""

from __future__ import annotations

import httpx
import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app, http_protocol
from radixtop.adapters.http.server.audit import AuditLog
from tests.support.engines import build_engine
from tests.support.live_server import running_server

TOKEN = "issue-26-server-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


@pytest.fixture
def live(engine):
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None)), http=http_protocol()) as url:
        yield url


# ----- item 8: a read method on an action's route -----

ACTIONS = ("/v1/sessions/a/close", "/v1/sessions/nobody/close", "/v1/sessions/x/y/close", "/v1/evict", "/v1/flush")


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "PATCH", "DELETE"])
def test_an_action_route_answers_405_use_post_to_any_other_method(live, method):
    for path in ACTIONS:
        response = httpx.request(method, f"{live}{path}", headers=AUTH, timeout=30)
        assert response.status_code == 405, (method, path, response.status_code, response.text)
        assert response.headers["allow"] == "POST", (method, path)
        if method != "HEAD":
            error = response.json()["error"]
            assert error["code"] == "method_not_allowed" and "use POST" in error["message"], (method, path, error)
    # and the session itself still reads; a session's id may hold '/'
    assert httpx.get(f"{live}/v1/sessions/a", timeout=30).status_code == 200
    assert httpx.get(f"{live}/v1/sessions/x/y", timeout=30).json()["error"]["code"] == "unknown_session"


def test_every_action_route_in_the_schema_refuses_get_with_405(live):
    paths = httpx.get(f"{live}/openapi.json", timeout=30).json()["paths"]
    posts = [path for path, ops in paths.items() if "post" in ops]
    assert posts, paths.keys()
    for path in posts:
        url = live + path.replace("{session_id}", "a")
        response = httpx.get(url, timeout=30)
        assert response.status_code == 405 and "use POST" in response.json()["error"]["message"], (path, response.text)


# ----- item 9: /metrics -----

PARTITION = ("available", "evictable", "protected", "session_held", "uncached")
UNITS = ("_tokens", "_bytes")
"""Every radixtop metric is counted in tokens or bytes, or counts things (sessions, nodes, closes)."""
COUNTS = ("radixtop_sessions", "radixtop_nodes", "radixtop_closes")


def promlint(text: str) -> list[str]:
    """The problems ``promtool check metrics`` (client_golang's promlint) finds in an exposition, as
    far as they can be told from the text: help, counter ``_total``, non-counters without it, units
    (base units, as a suffix), no type in a name, snake case, no reserved ':'."""
    import re

    from prometheus_client.parser import text_string_to_metric_families

    problems, helps = [], set(re.findall(r"^# HELP (\S+) .+$", text, re.M))
    for family in text_string_to_metric_families(text):
        name, names = family.name, {s.name for s in family.samples}
        if name not in helps and f"{name}_total" not in helps:
            problems.append(f"{name}: no help text")
        if family.type == "counter" and names != {f"{name}_total"} | ({f"{name}_created"} & names):
            problems.append(f"{name}: counter metrics should have '_total' suffix ({names})")
        if family.type != "counter" and any(n.endswith("_total") for n in names):
            problems.append(f"{name}: non-counter metrics should not have '_total' suffix")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            problems.append(f"{name}: not snake_case, or a reserved character")
        if any(word in name.split("_") for word in ("gauge", "counter", "histogram", "summary")):
            problems.append(f"{name}: metric name should not include its type")
        if re.search(r"_(milliseconds|kilobytes|megabytes|ms|kb|mb)(_|$)", name):
            problems.append(f"{name}: use base units")
        if not (name.endswith(UNITS) or name in COUNTS):
            problems.append(f"{name}: no unit suffix ({UNITS}) and not a count")
    return problems


def test_metrics_partition_adds_up_to_capacity_with_capacity_and_tree_apart(live):
    from prometheus_client.parser import text_string_to_metric_families

    httpx.post(f"{live}/v1/sessions/b/close", headers=AUTH, timeout=30).raise_for_status()
    stats = httpx.get(f"{live}/v1/stats", timeout=30).json()
    text = httpx.get(f"{live}/metrics", timeout=30).text
    assert promlint(text) == []
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for unit in ("tokens", "bytes"):
        series = {s.labels["state"]: s.value for s in families[f"radixtop_{unit}"].samples}
        assert set(series) == set(PARTITION)  # nothing but the partition, so its sum means something
        assert sum(series.values()) == stats[f"capacity_{unit}"]  # (was about 3x capacity)
        (capacity,) = families[f"radixtop_capacity_{unit}"].samples
        (tree,) = families[f"radixtop_tree_{unit}"].samples
        assert capacity.value == stats[f"capacity_{unit}"] and tree.value == stats[f"total_{unit}"] > 0
    pool = families["radixtop_pool_tokens"].samples
    assert {s.labels["bucket"] for s in pool} == set(PARTITION)
    (pool_capacity,) = families["radixtop_pool_capacity_tokens"].samples
    assert sum(s.value for s in pool) == pool_capacity.value == stats["capacity_tokens"]
    # any metric whose series share a label: what they add up to is never one of them
    for family in families.values():
        for sample in family.samples:
            assert not ({"capacity", "total", "free", "unevictable"} & set(sample.labels.values())), sample


def test_promlint_finds_what_it_checks():
    """The checker itself can fail: the old exposition's faults are found."""
    bad = ("# HELP radixtop_closes Sessions closed.\n# TYPE radixtop_closes counter\nradixtop_closes 1.0\n"
           "# HELP radixtop_x_total x\n# TYPE radixtop_x_total gauge\nradixtop_x_total 1.0\n"
           "# HELP radixtop_latency_ms x\n# TYPE radixtop_latency_ms gauge\nradixtop_latency_ms 1.0\n")
    problems = "\n".join(promlint(bad))
    assert "'_total' suffix" in problems and "should not have" in problems and "base units" in problems
