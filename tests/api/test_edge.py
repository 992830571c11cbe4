"""The admin API's edge, before any route: the Host and Origin it answers, the token reads need on
a public bind (a read-only token too), percent-encodings that name one thing only, no docs pages
that load a CDN, and the bound on concurrent heavy reads (429) that never holds up health or an
action (issue 17, items 4, 8 and 14)."""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

with warnings.catch_warnings():  # newer starlette asks for httpx2 here; httpx still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import AdapterError, ReadOnly, Unauthorized
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server

TOKEN = "edge-test-action-token-0123"
READ_TOKEN = "edge-test-read-token-4567"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_AUTH = {"Authorization": f"Bearer {READ_TOKEN}"}
PORT = 8765
READS = ["/v1/capabilities", "/v1/stats", "/v1/nodes/root", "/v1/nodes/root/children", "/v1/nodes/root/subtree",
         "/v1/nodes/root/chain", "/v1/sessions", "/v1/sessions/a", "/v1/match?tokens=1,2", "/v1/changes?since=0",
         '/v1/read?reads=[{"op":"stats"}]', "/v1/export", "/v1/audit", "/metrics", "/openapi.json"]


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


def error_code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


# ----- a token for reads on a public bind (item 8) -----


@pytest.fixture
def public(engine):
    """The app as `serve --host 0.0.0.0` builds it, with a read-only token beside the action one."""
    audit = AuditLog(None)
    app = create_app(BundledAdapter(engine), TOKEN, audit, host="0.0.0.0", read_token=READ_TOKEN)
    return TestClient(app, base_url=f"http://10.1.2.3:{PORT}", raise_server_exceptions=False), audit


def test_a_public_bind_needs_a_token_for_every_read(public):
    """With --host 0.0.0.0 a token protected only the POSTs: anyone who could reach the port read
    cached prompts, session holders and the audit journal with client IPs."""
    client, _ = public
    for path in READS:
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            refused = client.get(path, headers=headers)
            assert refused.status_code == 401 and error_code(refused) == "unauthorized", (path, refused.text)
            assert refused.headers["www-authenticate"] == "Bearer"
        for headers in (AUTH, READ_AUTH):
            assert client.get(path, headers=headers).status_code == 200, path
    assert client.get("/healthz").status_code == 200  # a probe needs no token


def test_a_read_token_reads_and_never_acts(public, engine):
    client, audit = public
    before = engine.call(lambda s: s.stats().as_dict())
    for path, body in (("/v1/flush", None), ("/v1/evict", {"tokens": 1}), ("/v1/sessions/a/close", None)):
        refused = client.post(path, json=body, headers=READ_AUTH)
        assert refused.status_code == 403 and error_code(refused) == "read_only", refused.text
        assert "only reads" in refused.json()["error"]["message"]
    assert engine.call(lambda s: s.stats().as_dict()) == before
    # A dry run is a read: it needs a token here too, and a read token will do.
    assert client.post("/v1/sessions/a/close?dry_run=true").status_code == 401
    assert client.post("/v1/sessions/a/close?dry_run=true", headers=READ_AUTH).status_code == 200
    refusals = [(e.action, e.error.split(":")[0]) for e in audit.tail(10) if not e.allowed]
    assert refusals == [("close_dry_run", "unauthorized"), ("close", "read_only"), ("evict", "read_only"),
                        ("flush", "read_only")]


def test_the_client_sends_its_token_with_reads(engine):
    app = create_app(BundledAdapter(engine), TOKEN, AuditLog(None), host="0.0.0.0", read_token=READ_TOKEN)
    with running_server(app) as url:
        assert RadixtopClient(url, token=TOKEN).stats().capacity_tokens == 256
        reader = RadixtopClient(url, token=READ_TOKEN)
        assert reader.sessions().total == reader.sessions(limit=1).total
        with pytest.raises(ReadOnly, match="only reads"):
            reader.flush()
        with pytest.raises(Unauthorized):
            RadixtopClient(url).stats()


@pytest.mark.parametrize("token", ["a", "short-token-15c"])
def test_create_app_keeps_short_tokens_for_tests_but_serve_refuses_them(engine, token):
    from radixtop.adapters.http.server import serve

    printed: list[str] = []
    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(ValueError, match="at least 16 characters"):
            serve(BundledAdapter(engine), host=host, port=free_port(), token=token, log=printed.append)
        with pytest.raises(ValueError, match="at least 16 characters"):
            serve(BundledAdapter(engine), host=host, port=free_port(), token="long-enough-token-xyz",
                  read_token=token, log=printed.append)
    assert printed == []


# ----- Host and Origin (item 8) -----


@pytest.fixture
def loopback(engine):
    audit = AuditLog(None)
    app = create_app(BundledAdapter(engine), TOKEN, audit, host="127.0.0.1")
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}", raise_server_exceptions=False), audit


@pytest.mark.parametrize("host", [f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}", "localhost",
                                  f"LOCALHOST:{PORT}", "localhost.", "localhost:9000"])  # 9000: an SSH tunnel
def test_a_loopback_bind_answers_to_loopback_names(loopback, host):
    client, _ = loopback
    assert client.get("/v1/stats", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", [f"rebind.evil.example:{PORT}", "rebind.evil.example", f"127.0.0.1:x{PORT}",
                                  f"10.0.0.1:{PORT}", f"localhost.evil.example:{PORT}", "", "::1"])
def test_a_loopback_bind_refuses_other_hosts(loopback, host):
    """No Host check let a DNS-rebinding page read a loopback server (the demo child included)."""
    client, audit = loopback
    for method, path in (("GET", "/v1/stats"), ("GET", "/v1/audit"), ("POST", "/v1/flush"),
                         ("POST", "/v1/sessions/a/close?dry_run=true")):
        refused = client.request(method, path, headers={"Host": host, **AUTH})
        assert refused.status_code == 400 and error_code(refused) == "bad_host", (method, path, refused.text)
        assert "DNS rebinding" in refused.json()["error"]["message"]
    assert audit.tail(10) == []  # refused before any route: nothing acted, nothing journaled


def test_a_page_of_another_origin_is_refused(loopback):
    client, audit = loopback
    for origin in ("https://evil.example", "null", f"http://localhost:{PORT + 1}"):
        for method, path in (("GET", "/v1/stats"), ("POST", "/v1/sessions/%5B%2F%5D/close")):
            refused = client.request(method, path, headers={"Origin": origin})
            assert refused.status_code == 403 and error_code(refused) == "cross_origin", (origin, refused.text)
    assert audit.tail(10) == []
    assert client.get("/v1/stats", headers={"Origin": f"http://127.0.0.1:{PORT}"}).status_code == 200


# ----- percent-encodings and docs (item 14) -----


@pytest.mark.parametrize("path", ["/v1/sessions/%FF", "/v1/sessions/%FE", "/v1/sessions/a%C3", "/v1/sessions/%zz",
                                  "/v1/sessions/a%2", "/v1/sessions?contains=%FF", "/v1/nodes/root%ff"])
def test_invalid_percent_encodings_are_refused(loopback, path):
    """%FF and %FE both named session '\\ufffd'."""
    client, audit = loopback
    refused = client.get(path)
    assert refused.status_code == 400 and error_code(refused) == "bad_request", refused.text
    assert "percent-encoded UTF-8" in refused.json()["error"]["message"]
    close = client.post("/v1/sessions/a/close?dry_run=%FF" if "?" in path else path + "/close", headers=AUTH)
    assert close.status_code == 400 and audit.tail(10) == []


def test_valid_percent_encodings_still_name_their_session(loopback):
    client, _ = loopback
    unknown = client.get("/v1/sessions/caf%C3%A9%2Fx")
    assert unknown.status_code == 404 and "café/x" in unknown.json()["error"]["message"]


def test_no_docs_pages_that_load_scripts_from_a_cdn(loopback):
    client, _ = loopback
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert client.get(path).status_code == 404
    missing = client.get("/v1/nothing-here")
    assert "/openapi.json" in missing.json()["error"]["message"]
    assert client.get("/openapi.json").status_code == 200


# ----- concurrent heavy reads (item 4, the server's half) -----


class Gated(BundledAdapter):
    """Reads that wait for the test to let them go: ``sessions`` (a heavy read), ``children`` (a
    light one)."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.gate = threading.Event()
        self.waiting = 0

    def _held(self) -> None:
        self.waiting += 1
        assert self.gate.wait(30)

    def sessions(self, *args, **kwargs):
        self._held()
        return super().sessions(*args, **kwargs)

    def children(self, *args, **kwargs):
        self._held()
        return super().children(*args, **kwargs)


def until(predicate, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_heavy_reads_beyond_the_limit_are_429_and_health_and_actions_go_ahead(engine):
    adapter = Gated(engine)
    with running_server(create_app(adapter, TOKEN, AuditLog(None), max_heavy_reads=2)) as url, \
            ThreadPoolExecutor(4) as pool:
        held = [pool.submit(httpx.get, f"{url}/v1/sessions", timeout=30) for _ in range(2)]
        until(lambda: adapter.waiting == 2, "two heavy reads running")
        for path in ("/v1/sessions", "/v1/sessions/a", "/v1/read?reads=[{\"op\":\"stats\"}]", "/v1/export",
                     "/v1/nodes/root/subtree"):
            busy = httpx.get(url + path, timeout=10)
            assert busy.status_code == 429 and error_code(busy) == "busy", (path, busy.text)
            assert busy.headers["retry-after"] == "1"
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{url}/v1/stats", timeout=5).status_code == 200  # a light read
        assert httpx.post(f"{url}/v1/flush", headers=AUTH, timeout=5).status_code == 200
        adapter.gate.set()
        assert [f.result().status_code for f in held] == [200, 200]
        assert httpx.get(f"{url}/v1/sessions", timeout=10).status_code == 200  # the slots came back


def test_actions_and_health_are_served_while_reads_fill_every_thread(engine):
    """Reads that wait on the cache's owner took every worker thread (40): an operator's evict
    waited behind them (504 on a 200k-node tree with 24 clients)."""
    adapter = Gated(engine)
    with running_server(create_app(adapter, TOKEN, AuditLog(None))) as url, ThreadPoolExecutor(48) as pool:
        held = [pool.submit(httpx.get, f"{url}/v1/nodes/root/children", timeout=60) for _ in range(48)]
        until(lambda: adapter.waiting >= 40, "the reads to fill the worker threads")
        try:
            started = time.monotonic()
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
            assert httpx.post(f"{url}/v1/evict", json={"tokens": 1}, headers=AUTH, timeout=5).status_code == 200
            assert time.monotonic() - started < 5
        finally:
            adapter.gate.set()
        assert {f.result().status_code for f in held} == {200}


def test_the_client_waits_out_a_busy_server(engine):
    """RadixtopClient retries a 429 after its Retry-After, within its timeout; then says busy."""
    adapter = Gated(engine)
    with running_server(create_app(adapter, TOKEN, AuditLog(None), max_heavy_reads=1)) as url, \
            ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.get, f"{url}/v1/sessions", timeout=30)
        until(lambda: adapter.waiting == 1, "one heavy read running")
        with pytest.raises(AdapterError, match="busy"):
            RadixtopClient(url, timeout=1.5).sessions()
        patient = pool.submit(RadixtopClient(url, timeout=20).sessions)
        time.sleep(1.5)
        adapter.gate.set()
        assert patient.result().total >= 1 and first.result().status_code == 200


def test_a_short_read_token_is_refused_wherever_the_app_is_made(engine):
    """The SGLang plugin makes the app itself (RADIXTOP_READ_TOKEN): the rule holds there too."""
    with pytest.raises(ValueError, match="read token must be at least 16 characters"):
        create_app(BundledAdapter(engine), TOKEN, AuditLog(None), host="0.0.0.0", read_token="short")
    with pytest.raises(ValueError, match="must differ"):
        create_app(BundledAdapter(engine), TOKEN, AuditLog(None), host="0.0.0.0", read_token=TOKEN)


# ----- a bound on the CPU reads take (issue 27: radixtop beside a scheduler) -----


class Clocks:
    """A wall clock and a CPU clock the test moves."""

    def __init__(self) -> None:
        self.wall = self.cpu = 100.0


def test_a_cpu_budget_fills_at_its_share_and_the_process_cpu_drains_it():
    from radixtop.adapters.http.server.budget import CpuBudget

    c = Clocks()
    budget = CpuBudget(0.25, burst_s=1.0, most_wait_s=2.0, debt_s=2.0, clock=lambda: c.wall, cpu=lambda: c.cpu)
    assert budget.wait() == 0.0
    c.cpu += 0.25  # the burst spent at once
    assert budget.wait() == 0.0
    c.cpu += 0.1
    assert budget.wait() == pytest.approx(0.4)  # 0.1 s of CPU over: 0.4 s at a quarter of a core
    c.wall += 0.4
    assert budget.wait() == pytest.approx(0.0)
    c.wall += 15.0  # a scrape every 15 s while the process takes 5% of a core: under its share, owes nothing
    c.cpu += 0.75
    assert budget.wait() == 0.0
    c.wall += 100.0  # idle: the bucket fills to its burst, no further
    assert budget.wait() == 0.0
    c.cpu += 0.45
    assert budget.wait() == pytest.approx(0.8)
    c.cpu += 100.0  # a long burst: the debt stops at most_wait_s + debt_s of earnings
    assert budget.wait() == pytest.approx(4.0)
    assert budget.retry_after(4.0) == 2  # (when the wait is within most_wait_s again)
    c.wall += 2.0
    assert budget.wait() == pytest.approx(2.0)
    c.wall += 2.0
    assert budget.wait() == 0.0


@pytest.mark.parametrize("text, share", [(None, 0.25), ("", 0.25), ("0.5", 0.5), ("off", None), ("0", None)])
def test_the_beside_cpu_share_parses(text, share):
    from radixtop.adapters.http.server.budget import parse_share

    assert parse_share(text, 0.25) == share


@pytest.mark.parametrize("text", ["-1", "abc", "nan", "1e9", "1e-9"])
def test_a_bad_beside_cpu_share_is_one_line(text):
    from radixtop.adapters.http.server.budget import parse_share

    with pytest.raises(ValueError, match="RADIXTOP_BESIDE_CPU"):
        parse_share(text, 0.25)


def test_reads_wait_for_the_cpu_budget_or_are_429_and_health_and_actions_go_ahead(engine):
    from radixtop.adapters.http.server.budget import CpuBudget

    c = Clocks()
    budget = CpuBudget(0.5, burst_s=0.1, most_wait_s=1.0, clock=lambda: c.wall, cpu=lambda: c.cpu)
    client = TestClient(create_app(BundledAdapter(engine), TOKEN, AuditLog(None), budget=budget),
                        base_url=f"http://127.0.0.1:{PORT}", raise_server_exceptions=False)
    assert client.get("/v1/stats").status_code == 200
    c.cpu += 10.0  # a flood spent it: the debt stops at 3 s of earnings (most_wait_s 1 + debt_s 2)
    for path in ("/v1/stats", "/v1/sessions", "/v1/nodes/root/children"):
        busy = client.get(path)
        assert busy.status_code == 429 and error_code(busy) == "busy", path
        assert "CPU" in busy.json()["error"]["message"] and busy.headers["retry-after"] == "2"
    assert budget.refused == 3
    assert client.get("/healthz").status_code == 200
    assert client.post("/v1/evict", headers=AUTH, json={"tokens": 1}).status_code == 200
    c.wall += 2.6  # 0.4 s short of it
    started = time.monotonic()
    assert client.get("/v1/stats").status_code == 200  # the read waits 0.4 s, then is answered
    assert time.monotonic() - started >= 0.3 and budget.waited == 1


def test_a_read_with_the_action_token_is_not_held_by_a_flood_and_the_read_token_is(engine):
    """The CPU bound keeps a flood off the server; the operator's own reads (sent with the action
    token, as the dashboard and the CLI send it) are answered at once all the same (a flood of 16
    readers kept them at 429 for 30 s). The read token, given to others (and needed by every read
    off loopback), is held like any reader: else a bind off loopback would have no bound at all."""
    from radixtop.adapters.http.server.budget import CpuBudget

    c = Clocks()
    budget = CpuBudget(0.5, burst_s=0.1, most_wait_s=1.0, clock=lambda: c.wall, cpu=lambda: c.cpu)
    read_token = "a-read-only-token-0123456789"
    client = TestClient(create_app(BundledAdapter(engine), TOKEN, AuditLog(None), budget=budget,
                                   read_token=read_token),
                        base_url=f"http://127.0.0.1:{PORT}", raise_server_exceptions=False)
    c.cpu += 10.0  # the flood spent it
    assert client.get("/v1/stats").status_code == 429
    for path in ("/v1/stats", "/v1/sessions", "/v1/nodes/root/children"):
        assert client.get(path, headers=AUTH).status_code == 200, path
    assert budget.waited == 0
    assert client.get("/v1/stats", headers={"Authorization": f"Bearer {read_token}"}).status_code == 429
    assert client.get("/v1/stats", headers={"Authorization": "Bearer not-the-token-0123456789"}).status_code == 429
    assert budget.refused == 3
