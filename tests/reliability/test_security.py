"""Security of every face: the token compared in constant time and never logged, read-only held by
every route and face down to the adapter, loopback by default, no CORS, refused actions audited.

Real parts throughout: the app under TestClient and real uvicorn, and `radixtop serve` run as a
child process (a loud one: root logging at DEBUG, uvicorn at debug with access logs) whose output,
audit journal, answers and metrics are searched for the token afterwards.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import quote

import httpx
import pytest
from typer.testing import CliRunner

with warnings.catch_warnings():  # newer starlette asks for httpx2 here; httpx still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import ReadOnly
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server import edge as http_edge
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app as cli_app
from radixtop.gpu_backend.traces.ops import tree_rows
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.modals import AskScreen, ConfirmScreen
from tests.support import REPO
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server

ROOT = REPO
TOKEN = "radixtop-security-Q7v2Lm9xR4kT8nW3"
LOOPBACK = "http://127.0.0.1"  # the Host a loopback server answers to (TestClient sends "testserver")
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NEAR_MISS = TOKEN[:-1] + "Z"  # same length, last character wrong
WRONG_TOKENS = {"near_miss": NEAR_MISS, "prefix": TOKEN[:10], "longer": TOKEN + "0", "empty": "",
                "huge": "k" * 8192, "other": "not-the-token"}
NON_ASCII = {"utf8": b"Bearer " + "jeton-\u00e9\u00e8-\u65e5\u672c".encode(),
             "latin1": b"Bearer \xff\xfe" + TOKEN.encode()}
REPORT: Counter[str] = Counter()

# The cache of tests/contract/suite.py's build_engine, as a trace `radixtop serve --trace` replays.
TRACE = "\n".join(json.dumps(op) for op in [
    {"op": "request", "input": [1, 2, 3, 4, 5, 6], "output": [7, 8], "session": "a"},
    {"op": "request", "input": [1, 2, 3, 4, 5, 6, 7, 8, 10], "output": [11], "session": "a"},
    {"op": "request", "input": [1, 2, 3, 4, 20], "output": [21, 22], "session": "b"},
    {"op": "request", "input": [1, 2, 3, 4, 5, 6], "output": [7, 8], "session": "c"},
    {"op": "begin", "id": "running", "input": [1, 2, 3, 4, 9, 9], "session": "d"},
    {"op": "request", "input": [40, 41, 42], "output": [43]},
]) + "\n"

# Every POST route in the schema, and how to ask it something valid (a new action route fails
# test_the_schema_lists_exactly_these_action_routes until it is added here).
ACTION_REQUESTS = {
    "/v1/sessions/{session_id}/close": [("/v1/sessions/b/close", None)],
    "/v1/evict": [("/v1/evict", {"tokens": 5})],
    "/v1/flush": [("/v1/flush", None)],
}
CHANGING = [(path, body) for requests in ACTION_REQUESTS.values() for path, body in requests]
PREVIEW = "/v1/sessions/b/close?dry_run=true"
"""A close's dry run: a read on an action's route (it needs no token, and is audited)."""
PATH_PARAMS = {"node_id": "root", "session_id": "a"}
REQUIRED_QUERY = {"/v1/changes": "?since=0", "/v1/paths": "?node_ids=root",
                  "/v1/read": "?reads=" + quote('[{"op":"stats"},{"op":"children","node_id":"root"}]')}


def make_client(adapter, audit: AuditLog | None = None) -> TestClient:
    return TestClient(create_app(adapter, TOKEN, audit or AuditLog(None)), base_url=LOOPBACK, raise_server_exceptions=False)


@pytest.fixture
def engine():
    engine = build_engine()
    yield engine
    engine.stop()


def cache_state(engine) -> tuple:
    """What any change to the cache shows in: its counters, its tree, its sessions."""
    return (engine.call(lambda s: s.stats().as_dict()), engine.call(tree_rows),
            engine.call(lambda s: sorted(s.cache.closed_session_ids())))


def concrete(path: str) -> str:
    for name, value in PATH_PARAMS.items():
        path = path.replace("{" + name + "}", value)
    return path + REQUIRED_QUERY.get(path, "")


def error_code(response) -> str:
    assert "Traceback" not in response.text
    return response.json()["error"]["code"]


# ----- the token is compared in constant time, whatever is sent -----


def test_the_schema_lists_exactly_these_action_routes(engine):
    paths = make_client(BundledAdapter(engine)).get("/openapi.json").json()["paths"]
    posts = {path for path, ops in paths.items() if "post" in ops}
    assert posts == set(ACTION_REQUESTS), "an action route this module does not send: add it to ACTION_REQUESTS"
    assert not [(p, m) for p, ops in paths.items() for m in ops if m in ("put", "patch", "delete")]
    for path in posts:
        assert "401" in paths[path]["post"]["responses"] and "403" in paths[path]["post"]["responses"]


def test_every_action_compares_the_token_with_compare_digest(engine, monkeypatch):
    compared: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def recording(given, expected):
        compared.append((given, expected))
        return real(given, expected)

    monkeypatch.setattr(http_edge.hmac, "compare_digest", recording)
    client = make_client(BundledAdapter(engine))
    before = cache_state(engine)
    sent = [(f"Bearer {t}", t.encode()) for t in WRONG_TOKENS.values()] + [(h, None) for h in NON_ASCII.values()]
    for path, body in (r for requests in ACTION_REQUESTS.values() for r in requests):
        for header, given in sent:
            compared.clear()
            response = client.post(path, json=body, headers={"Authorization": header})
            assert response.status_code == 401, (path, header[:20], response.text)  # never a 500
            assert error_code(response) == "unauthorized" and response.headers["www-authenticate"] == "Bearer"
            # One comparison, whatever the length sent: the secret is the second argument, whose
            # length alone sets how long compare_digest runs; bytes, so nothing non-ASCII raises.
            assert len(compared) == 1, (path, header[:20], compared)
            got, expected = compared[0]
            assert expected == TOKEN.encode() and isinstance(got, bytes)
            if given is not None:
                assert got == given  # the whole value sent: not cut or padded to the token's length
            REPORT["token_checks"] += 1
        for headers in ({}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}):
            assert client.post(path, json=body, headers=headers).status_code == 401
            REPORT["token_checks"] += 1
    assert cache_state(engine) == before
    for path, body in (r for requests in ACTION_REQUESTS.values() for r in requests):
        for scheme in ("Bearer", "bearer"):
            compared.clear()
            response = client.post(path, json=body, headers={"Authorization": f"{scheme} {TOKEN}"})
            assert response.status_code == 200, (path, response.text)
            assert compared == [(TOKEN.encode(), TOKEN.encode())]
            REPORT["token_checks"] += 1


def test_a_dry_run_is_a_read_it_needs_no_token_and_is_audited(engine):
    client = make_client(BundledAdapter(engine))
    before = cache_state(engine)
    for headers in ({}, {"Authorization": "Bearer wrong"}, AUTH):
        response = client.post(PREVIEW, headers=headers)
        assert response.status_code == 200 and response.json()["session_id"] == "b", response.text
    assert cache_state(engine) == before
    entries = client.get("/v1/audit", params={"limit": 10}).json()["entries"]
    assert [e["action"] for e in entries[:3]] == ["close_dry_run"] * 3 and all(e["allowed"] for e in entries[:3])


def test_non_ascii_and_control_bytes_over_a_real_server_are_never_a_500(engine):
    """What TestClient cannot send: bytes the HTTP parser itself sees. Non-ASCII reaches the app
    and is a 401; control bytes are refused by the parser (400) before any app code runs."""
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        port = int(url.rsplit(":", 1)[1])
        before = cache_state(engine)
        for value, status in [(NON_ASCII["utf8"], 401), (NON_ASCII["latin1"], 401),
                              (b"Bearer " + TOKEN.encode() + b"\xc3", 401), (b"Bearer \x00" + TOKEN.encode(), 400),
                              (b"Bearer " + TOKEN.encode() + b"\x7f", 400)]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"POST /v1/flush HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n"
                             b"Authorization: " + value + b"\r\n\r\n")
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            assert reply.startswith(f"HTTP/1.1 {status} ".encode()), (value, reply[:200])
            REPORT["raw_header_checks"] += 1
        assert cache_state(engine) == before


def test_a_token_that_cannot_travel_in_a_header_is_refused_at_start(engine, tmp_path):
    for token in ("jeton-\u00e9", "tab\tinside", " padded", "padded "):
        with pytest.raises(ValueError, match="printable ASCII"):
            create_app(BundledAdapter(engine), token, AuditLog(None))
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    port = free_port()
    result = CliRunner().invoke(cli_app, ["serve", "--trace", str(trace), "--model", "tiny", "--capacity", "256",
                                          "--device", "cpu", "--port", str(port)],
                                env={"RADIXTOP_TOKEN": "jeton-\u00e9"})
    assert result.exit_code == 2 and "printable ASCII" in result.stderr and "Traceback" not in result.output
    for command in (["flush", "--yes"], ["stats"], ["close", "b", "--yes"]):  # the client side says so too
        refused = CliRunner().invoke(cli_app, command, env={"RADIXTOP_URL": f"http://127.0.0.1:{port}",
                                                            "RADIXTOP_TOKEN": "jeton-\u00e9"})
        assert refused.exit_code == 2 and "printable ASCII" in refused.stderr, refused.output
        assert refused.exception is None or isinstance(refused.exception, SystemExit)


# ----- `radixtop serve` as a child process -----

LOUD = """
import logging
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
try:
    import uvicorn
except ImportError:
    pass
else:
    class LoudConfig(uvicorn.Config):  # radixtop serve sets warning and no access log; turn both up
        def __init__(self, *args, **kwargs):
            kwargs.update(log_level="debug", access_log=True)
            super().__init__(*args, **kwargs)
    uvicorn.Config = LoudConfig
"""
"""A ``sitecustomize`` that makes every Python process of ``radixtop serve`` loud: the engine's and
radixtop's process beside it, which serves the admin API (``serve``'s default), alike."""


class Served:
    """A `radixtop serve` child: its URL and port while it runs, its output once stopped."""

    def __init__(self, proc: subprocess.Popen, port: int, audit: Path) -> None:
        self.proc, self.port, self.audit = proc, port, audit
        self.url = f"http://127.0.0.1:{port}"
        self.out = self.err = ""


@contextmanager
def radixtop_serve(tmp: Path, *args: str, token: str | None = TOKEN, loud: bool = False) -> Iterator[Served]:
    trace, audit, port = tmp / "trace.jsonl", tmp / "audit.jsonl", free_port()
    trace.write_text(TRACE)
    env = {k: v for k, v in os.environ.items() if k != "RADIXTOP_TOKEN"}
    if token is not None:
        env["RADIXTOP_TOKEN"] = token  # the environment, not argv: argv is visible to every user
    if loud:
        (tmp / "loud").mkdir()
        (tmp / "loud" / "sitecustomize.py").write_text(LOUD)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp / "loud"), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", str(trace), "--model", "tiny",
                             "--capacity", "256", "--device", "cpu", "--port", str(port),
                             "--audit-log", str(audit), *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    served = Served(proc, port, audit)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"radixtop serve exited at start: {proc.communicate()[1][-2000:]}")
            try:
                if httpx.get(f"{served.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "radixtop serve did not answer within 120 s"
            time.sleep(0.1)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            served.out, served.err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            served.out, served.err = proc.communicate()


def listening_addresses(port: int) -> set[str]:
    """The addresses a socket listens on at ``port`` in this network namespace (Linux /proc)."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # host-order words
                found.add(socket.inet_ntop(family, raw))
    return found


def audit_entries(path: Path) -> list[dict]:
    """The journal's entries, one per request: an authorised action's intent line is left out
    (its outcome line follows it)."""
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [entry for entry in lines if entry.get("phase") != "intent"]


@pytest.mark.parametrize("place", [(), ("--beside",)], ids=["in-process", "beside"])
def test_the_token_never_appears_in_output_logs_audit_answers_or_metrics(tmp_path, place):
    """A loud `radixtop serve` (the default bind) sent the right token and wrong ones, on actions
    allowed and refused: the token is in none of what it writes or answers, and every refused
    action is in the audit journal with its reason."""
    assert Path("/proc/net/tcp").exists(), "this test reads the listening address from Linux /proc"
    answers: list[str] = []
    with radixtop_serve(tmp_path, *place, loud=True) as served:
        assert listening_addresses(served.port) == {"127.0.0.1"}  # the default bind is loopback
        with httpx.Client(base_url=served.url, timeout=30) as http:
            def post(path, headers, **kwargs):
                response = http.post(path, headers=headers, **kwargs)
                answers.append(f"{response.status_code} {dict(response.headers)} {response.text}")
                return response

            refused = [
                ("/v1/flush", {}, None, "unauthorized"),
                *(("/v1/sessions/b/close", {"Authorization": f"Bearer {t}".rstrip()}, None, "unauthorized")
                  for t in WRONG_TOKENS.values()),  # (h11 sends no value that ends in a space)
                ("/v1/evict", {"Authorization": f"Basic {TOKEN}"}, {"tokens": 1}, "unauthorized"),
                ("/v1/evict", {"Authorization": TOKEN}, {"tokens": 1}, "unauthorized"),
                ("/v1/sessions/nobody/close", AUTH, None, "unknown_session"),
                ("/v1/evict", AUTH, {"tokens": -1}, "bad_request"),
            ]
            for path, headers, body, code in refused:
                response = post(path, headers, json=body)
                assert response.status_code in (401, 404, 422) and error_code(response) == code, response.text
            for path, body in [("/v1/sessions/a/close?dry_run=true", None), *CHANGING]:
                assert post(path, AUTH, json=body).status_code == 200
            for path in ("/metrics", "/v1/audit?limit=1000", "/v1/stats", "/healthz"):
                response = http.get(path)
                assert response.status_code == 200
                answers.append(response.text)
            entries = http.get("/v1/audit", params={"limit": 1000}).json()["entries"]
    assert served.proc.returncode == 0, served.err[-2000:]
    # It was loud: DEBUG records and uvicorn's access log of the very requests above.
    assert "DEBUG" in served.err and '"POST /v1/flush HTTP/1.1" 401' in served.out + served.err
    assert "action flush 'cache' from 127.0.0.1: refused (unauthorized)" in served.err  # the debug mirror
    journal = served.audit.read_text()
    for text in (served.out, served.err, journal, *answers):
        for secret in (TOKEN, *(t for t in WRONG_TOKENS.values() if len(t) > 4)):
            assert secret not in text
        REPORT["texts_searched_for_the_token"] += 1
    # Refused actions are audited like allowed ones: allowed=false and the reason, oldest first.
    lines = audit_entries(served.audit)
    assert [e["action"] for e in lines] == [e["action"] for e in reversed(entries)]
    reasons = [(e["allowed"], (e["error"] or "").split(":")[0]) for e in lines]
    assert reasons == [(False, code) for *_, code in refused] + [(True, "")] * (1 + len(CHANGING))
    assert all(e["client"] == "127.0.0.1" for e in lines)
    assert next(e for e in lines if (e["error"] or "").startswith("unknown_session"))["target"] == "session:nobody"
    REPORT["audited_refusals"] += len(refused)


def test_a_public_bind_needs_a_token(tmp_path):
    """`radixtop serve --host <public>` with no token exits at once, saying why, before binding.
    (Real processes with a deadline: a server that wrongly started would otherwise never return.)"""
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    env = {k: v for k, v in os.environ.items() if k != "RADIXTOP_TOKEN"}
    runs = {}
    for host in ("0.0.0.0", "::"):
        port = free_port()
        runs[host] = port, subprocess.Popen(
            [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--trace", str(trace), "--model", "tiny", "--capacity", "256",
             "--device", "cpu", "--host", host, "--port", str(port)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for host, (port, proc) in runs.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"radixtop serve --host {host} without a token did not exit") from None
        assert proc.returncode == 2, (host, err)
        assert err.startswith(f"radixtop: refusing to serve the admin API on {host!r} without an explicit token")
        assert err.count("\n") == 1 and "pass a token" in err
        assert out == "" and not listening_addresses(port)
        REPORT["public_binds_refused"] += 1


# ----- read-only: every route, every face, and the adapter beneath them -----


@pytest.fixture(scope="module", params=[("--beside",), ("--in-process",)], ids=["beside", "in-process"])
def read_only_server(tmp_path_factory, request) -> Iterator[Served]:
    """`radixtop serve --read-only` on 0.0.0.0 with a token (which a public bind needs, and gets):
    beside the engine (serve's default with the demo) and in its process (a trace's default)."""
    with radixtop_serve(tmp_path_factory.mktemp("ro"), "--read-only", "--host", "0.0.0.0", *request.param) as served:
        yield served


def remote_state(url: str) -> tuple:
    """(A public bind: reads need the token too.)"""
    stats = httpx.get(f"{url}/v1/stats", headers=AUTH).json()
    export = httpx.get(f"{url}/v1/export", headers=AUTH).text
    sessions = httpx.get(f"{url}/v1/sessions", params={"limit": 1000, "order": "id"}, headers=AUTH).json()["sessions"]
    return stats, export, [(s["id"], s["state"]) for s in sessions]


def test_read_only_refuses_every_changing_route_and_answers_every_read(engine, tmp_path):
    audit = AuditLog(tmp_path / "audit.jsonl")
    client = make_client(BundledAdapter(engine, read_only=True), audit)
    paths = client.get("/openapi.json").json()["paths"]
    before = cache_state(engine)
    for path, body in CHANGING:
        response = client.post(path, json=body, headers=AUTH)
        assert response.status_code == 403 and error_code(response) == "read_only", (path, response.text)
        assert "read-only" in response.json()["error"]["message"]
        REPORT["read_only_refusals"] += 1
    assert client.post("/v1/sessions/b/close?dry_run=true", headers=AUTH).status_code == 200  # a preview
    for path, ops in paths.items():
        url = concrete(path)
        if "get" in ops:
            assert client.get(url).status_code == 200, url
        for method in ("PUT", "PATCH", "DELETE", *(() if "post" in ops else ("POST",))):
            response = client.request(method, url, headers=AUTH)
            assert response.status_code == 405 and error_code(response) == "method_not_allowed", (method, url)
        REPORT["routes_checked_read_only"] += 1
    assert cache_state(engine) == before
    refused = [e for e in audit.tail(100) if not e.allowed]
    assert len(refused) == len(CHANGING) and all(e.error.startswith("read_only: ") for e in refused)
    audit.close()


def test_the_adapter_refuses_before_the_engine_sees_an_action(engine, monkeypatch):
    """No face can get round read-only: the adapter itself refuses, without queueing anything."""
    adapter = BundledAdapter(engine, read_only=True)
    commands = []
    real_call = engine.call
    monkeypatch.setattr(engine, "call", lambda fn, *a, **k: (commands.append(fn), real_call(fn, *a, **k))[1])
    before = cache_state(engine)
    commands.clear()
    for act in (lambda: adapter.close_session("a"), lambda: adapter.close_session("nobody"),
                lambda: adapter.close_session("gone"), lambda: adapter.evict(0), lambda: adapter.evict(10**18),
                adapter.flush):
        with pytest.raises(ReadOnly):
            act()
        REPORT["adapter_refusals"] += 1
    assert commands == []
    assert cache_state(engine) == before


def test_read_only_server_refuses_every_route_over_http(read_only_server):
    url = read_only_server.url
    caps = RadixtopClient(url, token=TOKEN).capabilities()
    assert caps.read_only
    before = remote_state(url)
    paths = httpx.get(f"{url}/openapi.json", headers=AUTH).json()["paths"]
    assert {p for p, ops in paths.items() if "post" in ops} == set(ACTION_REQUESTS)
    for path, body in CHANGING:
        response = httpx.post(url + path, json=body, headers=AUTH)
        assert response.status_code == 403 and error_code(response) == "read_only", (path, response.text)
        REPORT["read_only_refusals"] += 1
    for path, ops in paths.items():
        if "get" in ops:  # (a read the target cannot do, as its capabilities say: 501)
            want = 501 if path == "/v1/changes" and not caps.changes else 200
            assert httpx.get(url + concrete(path), headers=AUTH).status_code == want, path
    assert remote_state(url) == before
    refused = [e for e in audit_entries(read_only_server.audit) if e["error"] and e["error"].startswith("read_only:")]
    assert len(refused) >= len(CHANGING) and not any(e["allowed"] for e in refused)
    assert TOKEN not in read_only_server.audit.read_text()
    assert "0.0.0.0" in listening_addresses(read_only_server.port)


def test_commands_against_a_read_only_server_exit_non_zero_and_say_why(read_only_server):
    url = read_only_server.url
    before = remote_state(url)
    env = {"RADIXTOP_URL": url, "RADIXTOP_TOKEN": TOKEN}
    for command in (["close", "b", "--yes"], ["close", "a", "b", "--yes", "--json"], ["evict", "5", "--yes"],
                    ["evict", "5", "--yes", "--json"], ["flush", "--yes"]):
        result = CliRunner().invoke(cli_app, command, env=env)
        assert result.exit_code == 1, (command, result.output)
        assert "read-only" in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.output
        REPORT["cli_refusals"] += 1
    assert CliRunner().invoke(cli_app, ["close", "b", "--dry-run"], env=env).exit_code == 0
    assert remote_state(url) == before


async def test_the_dashboard_over_http_cannot_act_on_a_read_only_server(read_only_server):
    """Its keys are refused with the reason; and its action workers themselves, called as a
    confirmed dialog would call them, are refused by the server: nothing changes either way."""
    url = read_only_server.url
    before = remote_state(url)
    adapter = RadixtopClient(url, token=TOKEN, timeout=10)
    app = RadixtopApp(adapter, interval=0.2)
    told: list[str] = []  # every toast, kept (Textual drops them from the screen after a while)
    notify = app.notify
    app.notify = lambda message, *args, **kwargs: (told.append(str(message)), notify(message, *args, **kwargs))[1]
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 30
        while app.home.polls < 1 or not app.home.capabilities.read_only:
            assert time.monotonic() < deadline, "the dashboard did not poll"
            await pilot.pause(0.05)
        for key in ("c", "E", "F"):
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert not isinstance(app.screen, (ConfirmScreen, AskScreen))
        assert [m for m in told if "read-only" in m] == [f"{app.home.target} is read-only: actions are disabled"] * 3
        told.clear()
        for worker in (app.home.actions.run_closes(("b",), []), app.home.actions.perform("evict", 5), app.home.actions.perform("flush", 0)):
            await worker.wait()
        await pilot.pause()
        for refused in ("close of session 'b' refused", "evict of 5 tokens refused", "flush refused"):
            assert any("read-only" in m and refused in m for m in told), (refused, told)
        REPORT["dashboard_refusals"] += 6
    adapter.release()
    assert remote_state(url) == before


# ----- slow and endless requests (issue 17, item 7) -----

SLOW_SERVE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import serve
from tests.support.engines import build_engine
engine = build_engine()
serve(BundledAdapter(engine), port=int(sys.argv[1]), token=sys.argv[3], log=lambda line: print(line, flush=True))
engine.stop()
"""


@contextmanager
def limited_serve(max_files: int) -> Iterator[tuple[subprocess.Popen, str, IO[bytes]]]:
    """``serve`` in a child whose open files are limited to ``max_files``; its stderr in a file."""
    port = free_port()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVE, str(port), str(max_files), TOKEN], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert str(port) in proc.stdout.readline()
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "serve did not answer"
                time.sleep(0.05)
            yield proc, url, err
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def answered_or_closed(sock: socket.socket) -> bool:
    """Whether the server answered this connection or closed it (rather than still holding it)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) is not None
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_half_sent_requests_cannot_take_every_file_or_hold_a_connection(engine):
    """1,100 half-sent requests exhausted a 1,024-file limit: /healthz failed until they went.
    Here 300 against 256 files: the server keeps well below its limit, still answers, and closes
    each half-sent request once its head has taken too long."""
    with limited_serve(256) as (proc, url, err):
        port = int(url.rsplit(":", 1)[1])
        slow = []
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            slow.append(sock)
        time.sleep(1)
        held = open_files(proc.pid)
        started = time.monotonic()
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        assert httpx.post(f"{url}/v1/flush", headers=AUTH, timeout=10).status_code == 200
        answer_s = time.monotonic() - started
        assert held < 256 - 32, f"{held} files open of 256"
        deadline = time.monotonic() + 20  # the head timeout (10 s) and some
        while not all(answered_or_closed(sock) for sock in slow):
            assert time.monotonic() < deadline, "half-sent requests still held after 20 s"
            time.sleep(0.5)
        for sock in slow:
            sock.close()
        err.seek(0)
        logged = err.read().count(b"\n")
    assert logged < 20, f"{logged} lines logged"
    REPORT["half_sent_requests"] += len(slow)
    print(f"\nslowloris: 300 half-sent requests, {held} files open of 256, health and flush in {answer_s:.2f} s, "
          f"{logged} lines logged")


def test_an_endless_header_is_refused_early(engine):
    """One connection streaming a header grew the server past 1 GB and kept its loop busy."""
    with limited_serve(1024) as (proc, url, _):
        port = int(url.rsplit(":", 1)[1])
        before = rss_mib(proc.pid)
        sent = 0
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
            try:
                while sent < 64 * 2**20:
                    sock.sendall(b"a" * 65536)
                    sent += 65536
            except OSError:
                pass  # the server closed the connection
            reply = b""
            try:
                while chunk := sock.recv(65536):
                    reply += chunk
            except OSError:
                pass
        # (what the client could push before it saw the close includes the kernel's buffers)
        assert sent < 16 * 2**20, f"{sent / 2**20:.0f} MiB of one header were taken"
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
        assert b'"payload_too_large"' in reply
        assert rss_mib(proc.pid) - before < 20
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    REPORT["endless_headers_refused"] += 1


def test_accept_errors_are_logged_a_bounded_number_of_times():
    """Out of files, the event loop logged every failed accept: 3.3M lines."""
    from radixtop.adapters.http.server import http_protocol

    http_protocol()  # what installs the filter, as serve and the plugin call it
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    loop_log = logging.getLogger("asyncio")
    loop_log.addHandler(handler)
    try:
        for _ in range(10_000):
            loop_log.error("socket.accept() out of system resource", exc_info=OSError(24, "Too many open files"))
        loop_log.error("something else the loop says")
    finally:
        loop_log.removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert 1 <= sum("out of system resource" in m for m in messages) <= 2, len(messages)
    assert "something else the loop says" in messages


# ----- a public bind: a token for reads too; a loopback bind: its own Host only (issue 17, item 8) -----


def test_a_public_bind_needs_the_token_for_reads_too(read_only_server):
    """`--host 0.0.0.0 --token ...` protected only the POSTs: anyone who could reach the port read
    cached prompts, session holders and the audit journal with client IPs."""
    url = read_only_server.url
    for path in ("/v1/stats", "/v1/sessions", "/v1/sessions/a", "/v1/export", "/v1/audit", "/metrics",
                 "/v1/nodes/root/children", "/openapi.json"):
        for headers in ({}, {"Authorization": f"Bearer {NEAR_MISS}"}):
            response = httpx.get(url + path, headers=headers)
            assert response.status_code == 401 and error_code(response) == "unauthorized", (path, response.text)
        assert httpx.get(url + path, headers=AUTH).status_code == 200, path
        REPORT["public_reads_refused"] += 1
    assert httpx.get(f"{url}/healthz").status_code == 200  # a probe's
    assert RadixtopClient(url, token=TOKEN).stats().capacity_tokens == 256


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_short_token_is_one_line_at_start(tmp_path, host):
    """`--token a` was accepted, on a public bind too."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    for variable, value in (("RADIXTOP_TOKEN", "a"), ("RADIXTOP_TOKEN", "fifteen-chars-x")):
        result = CliRunner().invoke(cli_app, ["serve", "--trace", str(trace), "--model", "tiny", "--capacity", "256",
                                              "--device", "cpu", "--host", host, "--port", str(free_port())],
                                    env={variable: value})
        assert result.exit_code == 2 and "at least 16 characters" in result.stderr, result.output
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
        assert "fifteen" not in result.stderr  # the token itself is not repeated
        REPORT["short_tokens_refused"] += 1


def test_a_loopback_server_answers_neither_a_rebinding_page_nor_another_origin(tmp_path):
    """No Host check let a DNS-rebinding page read a loopback server; a page of another origin
    could send a refused (but journaled) close; /docs loaded scripts from a CDN; %FF and %FE both
    named session '\ufffd'."""
    with radixtop_serve(tmp_path) as served, httpx.Client(base_url=served.url, timeout=30) as http:
        for host in (f"rebind.evil.example:{served.port}", "rebind.evil.example"):
            for method, path in (("GET", "/v1/stats"), ("GET", "/v1/audit"), ("POST", "/v1/flush")):
                response = http.request(method, path, headers={"Host": host, **AUTH})
                assert response.status_code == 400 and error_code(response) == "bad_host", (host, path, response.text)
                REPORT["rebinding_hosts_refused"] += 1
        assert http.get("/v1/stats", headers={"Host": f"localhost:{served.port}"}).status_code == 200
        refused = http.post("/v1/sessions/%5B%2F%5D/close", headers={"Origin": "https://evil.example"})
        assert refused.status_code == 403 and error_code(refused) == "cross_origin"
        for path in ("/docs", "/redoc"):
            assert http.get(path).status_code == 404
        for escape in ("%FF", "%FE"):
            assert http.get(f"/v1/sessions/{escape}").status_code == 400
        assert http.get("/v1/audit").json()["entries"] == []  # none of it reached an action route
    assert not [e for e in audit_entries(served.audit)]


# ----- no CORS -----


def assert_no_cors(response) -> None:
    assert not [h for h in response.headers if h.lower().startswith("access-control-")], dict(response.headers)


def test_no_cors_headers_by_default(engine, read_only_server):
    origin = {"Origin": "https://evil.example"}
    preflight = {**origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    client = make_client(BundledAdapter(engine))
    for send in (lambda p, **k: client.request(p[0], p[1], **k),
                 lambda p, **k: httpx.request(p[0], read_only_server.url + p[1], **k)):
        for path in ("/v1/flush", "/v1/evict", "/v1/sessions/b/close", "/v1/stats"):
            response = send(("OPTIONS", path), headers=preflight)
            assert response.status_code in (400, 403, 405), (path, response.status_code)  # 403: cross_origin
            assert_no_cors(response)
        assert_no_cors(send(("GET", "/v1/stats"), headers=origin))
        assert_no_cors(send(("POST", "/v1/flush"), headers={**origin, **AUTH}))
        REPORT["cors_checks"] += 6


@pytest.fixture(scope="module", autouse=True)
def report():
    """One JSON line of what this module checked (also appended to $RADIXTOP_SECURITY_REPORT)."""
    yield
    line = json.dumps({"module": "test_security", **REPORT}, separators=(",", ":"))
    print("\n" + line)
    if path := os.environ.get("RADIXTOP_SECURITY_REPORT"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
