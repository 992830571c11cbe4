"""The admin API over a live uvicorn server: a GET on an action's route (405), the metrics' one
partition of capacity, heavy-read slots and slow export readers, far pages of a wide node."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app, http_protocol
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
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


# ----- a wide root: 200k children -----

WIDE = 200_000


@pytest.fixture(scope="module")
def wide_engine():
    """200k one-node prompts under the root (a few-shot prompt's continuations), 1 to 4 tokens each."""
    s = Scheduler(get_geometry("tiny"), 4 * WIDE, device="cpu")
    alloc = s.pool.allocator.alloc
    for i in range(WIDE):
        s.cache.insert([1000 + i] + [7] * (i * 7919 % 4), alloc(1 + i * 7919 % 4))
    engine = Engine(s, None).start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def wide(wide_engine):
    with running_server(create_app(BundledAdapter(wide_engine), TOKEN, AuditLog(None)), http=http_protocol()) as url:
        yield url


def until(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


# ----- item 15: slow export readers -----


class SlowReader:
    """A client that asks for the export and then reads nothing (its receive buffer held small)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        self.sock.sendall(f"GET /v1/export HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        self.head = b""
        while b"\r\n\r\n" not in self.head:  # the answer has started: its snapshot is taken
            chunk = self.sock.recv(1024)
            assert chunk, "the server closed the export"
            self.head += chunk

    def read_all(self) -> bytes:
        """The rest of the (chunked) body, decoded, once the test lets the reader read."""
        raw = bytearray(self.head.partition(b"\r\n\r\n")[2])
        self.sock.settimeout(120)
        while not raw.endswith(b"0\r\n\r\n"):
            chunk = self.sock.recv(1 << 20)
            assert chunk, "the server closed the export early"
            raw += chunk
        body, rest = bytearray(), bytes(raw)
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                return bytes(body)
            body += rest[:size]
            rest = rest[size + 2:]

    def close(self) -> None:
        self.sock.close()


def test_slow_export_readers_lock_out_no_heavy_read(wide, wide_engine):
    """Four exports whose clients read nothing held all four heavy-read slots: the dashboard's poll,
    the sessions and the doctor were 429 as long as they lasted."""
    readers = [SlowReader(wide) for _ in range(4)]
    try:
        assert all(r.head.startswith(b"HTTP/1.1 200") for r in readers), [r.head[:40] for r in readers]
        reads = json.dumps([{"op": "stats"}, {"op": "children", "node_id": "root", "limit": 10}])
        for path, params in (("/v1/read", {"reads": reads}), ("/v1/sessions", {}), ("/v1/doctor", {}),
                             ("/v1/nodes/root/subtree", {"depth": 1, "limit": 5})):
            response = httpx.get(wide + path, params=params, timeout=120)
            assert response.status_code == 200, (path, response.status_code, response.text[:300])
        # a fifth export waits its turn (429: the exports' own bound, each with its snapshot) ...
        busy = httpx.get(f"{wide}/v1/export", timeout=60)
        assert busy.status_code == 429 and "exports" in busy.json()["error"]["message"], busy.text[:300]
        # ... and each stalled one is still whole when its client reads at last
        lines = readers[0].read_all().decode().splitlines()
        assert json.loads(lines[0])["node_count"] == WIDE == len(lines) - 1
    finally:
        for r in readers:
            r.close()
    until(lambda: httpx.get(f"{wide}/v1/export", params={"format": "columns"}, timeout=120).status_code == 200,
          "an export once the slow readers went")


# ----- item 21: far pages of a wide node -----

ORDER_KEYS = {
    "bytes": lambda n: (-n.subtree_tokens, n.id),
    "recency": lambda n: (-n.last_access_time, n.id),
    "tokens": lambda n: (-len(n.key), n.id),
}


def ranked(engine, order: str) -> list[int]:
    """The root's children in ``order``, ranked from scratch on the owner thread (the oracle)."""
    return engine.call(lambda s: [n.id for n in sorted(s.cache.root_node.children.values(),
                                                       key=ORDER_KEYS[order])], 60)


@pytest.mark.parametrize("order", ["bytes", "recency", "tokens"])
def test_every_page_of_a_200k_child_root_answers_exactly(wide, wide_engine, order):
    """A page at offset 150,000 of a 200k-child root was 504 after 10 s on an idle server."""
    expected = ranked(wide_engine, order)
    with httpx.Client(base_url=wide, timeout=120) as http:
        for offset in (0, 150_000, 199_950, 100_000, 150_000):
            response = http.get("/v1/nodes/root/children", params={"offset": offset, "limit": 100, "order": order})
            assert response.status_code == 200, (offset, response.status_code, response.text[:300])
            page = response.json()
            assert page["total"] == WIDE
            assert [c["id"] for c in page["children"]] == expected[offset : offset + 100], offset
