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
