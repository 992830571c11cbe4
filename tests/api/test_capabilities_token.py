"""``GET /v1/capabilities`` answers for the token it is sent: with no token, a read-only token or
a wrong one (which a loopback bind still lets read) the target refuses every action, so it says
read-only, and why, before anyone confirms one (issue 26, item 1)."""

from __future__ import annotations

import json

import httpx
import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from tests.support.engines import build_engine
from tests.support.live_server import running_server

ACTION = "caps-action-token-0123456789"
READ = "caps-read-token-0123456789"
READ_ONLY_TOKEN = "this token only reads: actions need the action token"


@pytest.fixture(scope="module")
def engine():
    e = build_engine()
    yield e
    e.stop()


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


def capabilities(url: str, token: str | None) -> tuple[dict, dict]:
    """The capabilities as the route and as a /v1/read batch answer them to ``token``."""
    alone = httpx.get(f"{url}/v1/capabilities", headers=bearer(token))
    assert alone.status_code == 200, alone.text
    batch = httpx.get(f"{url}/v1/read", params={"reads": json.dumps([{"op": "capabilities"}])},
                      headers=bearer(token))
    assert batch.status_code == 200, batch.text
    return alone.json(), batch.json()["results"][0]["ok"]


def test_a_loopback_server_says_read_only_to_every_token_but_the_action_token(engine):
    app = create_app(BundledAdapter(engine), ACTION, AuditLog(None), read_token=READ)
    with running_server(app) as url:
        for token, why in ((READ, READ_ONLY_TOKEN), (None, "no token"), ("not-this-servers-token", "wrong token")):
            for caps in capabilities(url, token):
                assert caps["read_only"] is True, (token, caps)
                assert why in caps["reason"], (token, caps)
                assert caps["close"] and caps["evict"] and caps["flush"]  # what the target does, for its token
        for caps in capabilities(url, ACTION):
            assert caps["read_only"] is False and caps["reason"] == "", caps


def test_a_public_bind_answers_the_read_token_read_only_and_no_token_401(engine):
    app = create_app(BundledAdapter(engine), ACTION, AuditLog(None), read_token=READ, host="0.0.0.0")
    with running_server(app) as url:
        assert httpx.get(f"{url}/v1/capabilities").status_code == 401
        for caps in capabilities(url, READ):
            assert caps["read_only"] is True and caps["reason"] == READ_ONLY_TOKEN, caps
        for caps in capabilities(url, ACTION):
            assert caps["read_only"] is False, caps


def test_a_read_only_target_gives_its_own_reason_whatever_the_token(engine):
    app = create_app(BundledAdapter(engine, read_only=True), ACTION, AuditLog(None), read_token=READ)
    with running_server(app) as url:
        for token in (ACTION, READ, None):
            for caps in capabilities(url, token):
                assert caps["read_only"] is True and caps["reason"] == "read-only: actions are refused", caps


def test_the_client_reads_its_capabilities_with_its_token(engine):
    app = create_app(BundledAdapter(engine), ACTION, AuditLog(None), read_token=READ)
    with running_server(app) as url:
        reader = RadixtopClient(url, token=READ, timeout=5.0)
        caps = reader.capabilities()
        assert caps.read_only and caps.reason == READ_ONLY_TOKEN, caps
        assert reader.read_many([("capabilities", ())])[0] == caps
        reader.release()
        actor = RadixtopClient(url, token=ACTION, timeout=5.0)
        assert not actor.capabilities().read_only
        actor.release()
        anonymous = RadixtopClient(url, timeout=5.0)
        caps = anonymous.capabilities()
        assert caps.read_only and "no token" in caps.reason and "RADIXTOP_TOKEN" in caps.reason, caps
        anonymous.release()
