"""The KV-events adapter against SGLang 0.5.23's own event recorder and ZMQ publisher.

0.5.23 publishes tagged msgpack maps (sgl-project/sglang#37482) with ``session_id`` on
``BlockStored``, and its replay socket sends the topic frame too. The "server" here is what its
scheduler builds: a ``UnifiedRadixCache`` (Python tree core, sessions on) recording KV events,
driven request by request (tests/on_sglang/ref/drive23.py), whose ``take_events()`` go out
through SGLang's ``ZmqEventPublisher`` made by its ``EventPublisherFactory``.

Needs sglang 0.5.23 (``.venv-sglang23``; tests/conftest.py collects this file only there).
"""

from __future__ import annotations

import pytest

from tests.support.engines import SGLANG_VERSION
from tests.support.live_server import free_ports

if SGLANG_VERSION != "0.5.23":  # tests/conftest.py collects this file only beside 0.5.23
    raise RuntimeError(f"needs sglang 0.5.23 (found {SGLANG_VERSION}): run it with .venv-sglang23 "
                       "(.ci/setup-sglang23), as .ci/test does")

import atexit  # noqa: E402
import http.server  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import msgspec  # noqa: E402

from radixtop.adapters.errors import ReadOnly, UnknownSession, Unsupported  # noqa: E402
from radixtop.adapters.events.wire import Cleared, Removed, Stored, decode_batch
from radixtop.adapters.events.zmq import KVEventsAdapter
from radixtop.adapters.model import ROOT_ID  # noqa: E402
from tests.on_sglang.ref import drive23  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def sgl():
    try:
        base = drive23.import_sglang23()
    except drive23.SGLang23UnavailableError as exc:  # pragma: no cover - a broken install
        pytest.fail(str(exc))
    from sglang.srt.disaggregation import kv_events

    base.kv_events = kv_events
    return base


class Server:
    """One DP rank of a 0.5.23 server: its cache recording KV events, and its publisher."""

    def __init__(self, sgl, port: int, replay_port: int | None, topic: str = "", core: str = "python"):
        """``core``: the tree core; "rust" (0.5.23's default) only without sessions."""
        self.sgl, self.seq, sessions = sgl, -1, core == "python"
        drive23._publish_server_args(sgl, 1, sessions=sessions)
        kv_pool, allocator, rtp = drive23._build_pools(sgl, 256, 1, drive23.KVGeometry(), 16, 4096)
        self.cache = sgl.UnifiedRadixCache(sgl.CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=allocator, page_size=1,
            eviction_policy="lru", tree_components=(sgl.ComponentType.FULL,), enable_session_radix_cache=sessions,
            tree_core_backend=core, enable_kv_cache_events=True))
        assert self.cache._tree_core_backend == core
        self.pools = drive23.Pools(kv_pool, allocator, rtp, 1, kind="unified", sessions=sessions)
        config = {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": topic}
        if replay_port is not None:
            config["replay_endpoint"] = f"tcp://*:{replay_port}"
        self.publisher = sgl.kv_events.EventPublisherFactory.create(json.dumps(config), 0)

    def request(self, tokens, output, session_id=None) -> None:
        if session_id is not None:
            drive23.open_session(self.cache, session_id)
        drive23.run_request(self.cache, self.pools, tokens, output, session_id=session_id)

    def publish(self) -> int:
        self.publisher.publish(self.sgl.kv_events.KVEventBatch(ts=time.time(), events=self.cache.take_events()))
        self.seq += 1
        return self.seq

    def close(self) -> None:
        self.publisher.shutdown()
        atexit.unregister(self.publisher.shutdown)


def catch_up(adapter: KVEventsAdapter, server: Server, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while adapter.status().last_seq < 0:
        assert time.monotonic() < deadline, "the adapter received nothing"
        adapter.wait_for_seq(server.publish(), 0.2)
    assert adapter.wait_for_seq(server.publish(), timeout), adapter.status()


def sglang_paths(cache) -> set[tuple[int, ...]]:
    """Every cached token path (page size 1: every prefix of every node's path)."""
    out: set[tuple[int, ...]] = set()
    stack = [(c, ()) for c in drive23.root_node(cache).children.values()]
    while stack:
        node, prefix = stack.pop()
        tokens = tuple(node.key.token_ids)
        out.update(prefix + tokens[:end] for end in range(1, len(tokens) + 1))
        stack.extend((c, prefix + tokens) for c in node.children.values())
    return out


def adapter_nodes(adapter: KVEventsAdapter) -> dict[tuple[int, ...], object]:
    """Each node's whole token path -> its NodeView."""
    out, stack = {}, [(ROOT_ID, ())]
    while stack:
        node_id, prefix = stack.pop()
        for child in adapter.children(node_id, 0, 1000).children:
            path = prefix + adapter.node(child.id, 0, 1000).token_ids
            out[path] = child
            stack.append((child.id, path))
    return out


def test_the_0523_classes_decode(sgl):
    """0.5.23's own event classes: tagged maps, media by StorageMedium, optional fields left out."""
    ke = sgl.kv_events
    payload = msgspec.msgpack.encode(ke.KVEventBatch(ts=1.0, attn_dp_rank=2, events=[
        ke.BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[5, 6], block_size=1, lora_id=None,
                       medium=ke.StorageMedium.GPU, cache_salt="salt", session_id="s1", lora_name="lora"),
        ke.BlockStored(block_hashes=[3], parent_block_hash=2, token_ids=[7], block_size=1, lora_id=None,
                       medium=ke.StorageMedium.CPU),
        ke.BlockRemoved(block_hashes=[3], medium=ke.StorageMedium.DISK), ke.AllBlocksCleared()]))
    assert isinstance(msgspec.msgpack.decode(payload)[1][0], dict)  # the wire shape: maps
    batch = decode_batch(payload)
    assert batch.rank == 2 and batch.malformed == 0 and not batch.unknown
    assert batch.events == [Stored((1, 2), None, (5, 6), 1, "GPU", cache_salt="salt", session_id="s1",
                                   lora_name="lora"),
                            Stored((3,), 2, (7,), 1, "CPU_PINNED"), Removed((3,), "DISK"), Cleared()]


def test_sessions_from_a_real_0523_cache_and_its_replay(sgl):
    """The first requests are published before the adapter subscribes: the gap is filled from
    0.5.23's replay socket. Blocks stored by a session's request hold that session; blocks a
    request without a session stored hold none."""
    port = free_ports(2)
    server = Server(sgl, port, port + 1)
    try:
        server.request([1, 2, 3, 4], [7, 8], "a")  # KV for input + output[:-1]: 1 2 3 4 7
        server.publish()
        server.request([1, 2, 3, 5, 6], [9], "b")  # stores 5 6 under 1 2 3
        server.publish()
        server.publisher._event_queue.join()
        with KVEventsAdapter(f"tcp://*:{port}", f"tcp://*:{port + 1}", bytes_per_token=10) as adapter:
            catch_up(adapter, server)
            st = adapter.status()
            assert st.replays >= 1 and st.replayed_batches >= 2 and st.complete, st
            server.request([1, 2, 3, 9], [5])  # no session
            assert adapter.wait_for_seq(server.publish(), 10)
            st = adapter.status()
            assert st.last_error is None and st.malformed_events == st.bad_batches == st.detached_blocks == 0
            nodes = adapter_nodes(adapter)
            assert {p[:end] for p in nodes for end in range(1, len(p) + 1)} == sglang_paths(server.cache)
            assert {p: n.holders for p, n in nodes.items()} == {
                (1, 2, 3): ("a",), (1, 2, 3, 4, 7): ("a",), (1, 2, 3, 5, 6): ("b",), (1, 2, 3, 9): ()}
            top = nodes[(1, 2, 3)]
            assert adapter.node(top.id).sessions_beneath == 2

            caps = adapter.capabilities()
            assert caps.sessions and caps.read_only and not (caps.close or caps.evict or caps.flush)
            assert adapter.stats().open_sessions == 2
            page = adapter.sessions(order="id")
            assert page.total == 2 and [s.id for s in page.sessions] == ["a", "b"]
            a = page.sessions[0]
            # a's path: 1 2 3 (shared with b's path) and 4 7 (its own); fair share: 3 tokens split in two.
            assert (a.tagged_nodes, a.exclusive_bytes, a.shared_bytes, a.fair_share_bytes) == (2, 20, 30, 35)
            assert a.state == "open" and a.last_activity_age_s is not None
            assert page.figures_age_s == 0.0 and page.figures_current  # kept with the tree: no pass
            held = {v.id: (v.tagged_nodes, v.exclusive_bytes, v.shared_bytes) for v in page.sessions}
            moment = time.time()  # (after the last batch SGLang stamped; before b's turn)
            time.sleep(0.002)  # (a moment is told as of the end of its millisecond: the turn in a later one)
            server.request([1, 2, 3, 5, 6, 11, 12], [13], "b")  # b's turn: its figures move at once
            assert adapter.wait_for_seq(server.publish(), 10)
            then = adapter.then(moment)  # the sessions' memory before b's turn: as the sessions page read then
            assert then.bytes_per_token == 10 and then.memory_sessions == 2
            assert {x.session_id: (x.tagged_nodes, x.exclusive_tokens * 10, x.shared_tokens * 10)
                    for x in then.memory} == held
            assert {x.session_id: x.exclusive_tokens_now > x.exclusive_tokens for x in then.memory} == {
                "a": False, "b": True}
            with adapter._lock:  # the kept figures, against the from-scratch attribution of the tree
                want = {sid: (f.tagged_nodes, f.exclusive * 10, (f.path - f.exclusive) * 10, round(f.fair * 10))
                        for sid, f in adapter._tree.attribute().sessions.items()}
            got = {v.id: (v.tagged_nodes, v.exclusive_bytes, v.shared_bytes, v.fair_share_bytes)
                   for v in adapter.sessions(order="exclusive_bytes").sessions}
            assert got == want and got["b"][1] > 20, got
            assert set(adapter.session("b").node_ids) == {adapter_nodes(adapter)[(1, 2, 3, 5, 6, 11, 12)].id}
            assert [s.id for s in adapter.sessions(contains="B").sessions] == ["b"]
            with pytest.raises(UnknownSession):
                adapter.session("zzz")
            with pytest.raises(ReadOnly):
                adapter.close_session("a")
    finally:
        server.close()


def serve_info(info: dict) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A stand-in for the server's ``GET /server_info`` answering ``info``."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(info).encode()
            self.send_response(200 if self.path == "/server_info" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def test_kv_events_takes_the_servers_url(sgl):
    """The ``kv_events`` block as 0.5.23 builds it (``describe_kv_events_publisher``, #25844: with
    the replay port and the topic): the adapter subscribes to the topic and replays from there."""
    from sglang.srt.runtime_context import describe_kv_events_publisher

    from radixtop.cli.targets import external_spec, open_target

    port = free_ports(2)
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{port + 1}",
                         "topic": "kv"})
    block = describe_kv_events_publisher(sgl.ServerArgs(model_path="dummy", page_size=1, kv_events_config=config))
    assert block["replay_endpoint_port_base"] == port + 1 and block["topic"] == "kv"
    server = Server(sgl, port, port + 1, topic="kv")
    httpd, url = serve_info({"kv_events": block, "kv_events_config": None})
    try:
        server.request([1, 2, 3], [4, 5], "a")
        server.publish()
        server.publisher._event_queue.join()
        target = open_target(external_spec(url, None, 0, None, None, None, None))
        adapter, _, close = target.adapter, target.label, target.release
        try:
            assert (adapter.endpoint, adapter.replay_endpoint) == (f"tcp://127.0.0.1:{port}",
                                                                    f"tcp://127.0.0.1:{port + 1}")
            catch_up(adapter, server)
            st = adapter.status()
            assert st.replayed_batches >= 1 and st.complete and adapter.stats().total_tokens == 4
            assert adapter.children(ROOT_ID).children[0].holders == ("a",)
        finally:
            close()
    finally:
        httpd.shutdown()
        httpd.server_close()
        server.close()


def test_the_default_rust_core_s_events(sgl):
    """0.5.23's default tree core (Rust): its events, through the same publisher, rebuild the
    cache's token paths; no session in them, so sessions stay unavailable."""
    port = free_ports(2)
    server = Server(sgl, port, None, core="rust")
    try:
        with KVEventsAdapter(f"tcp://*:{port}") as adapter:
            catch_up(adapter, server)
            for tokens, output in (([1, 2, 3, 4], [7, 8]), ([1, 2, 3, 5, 6], [9]), ([8, 8], [1])):
                server.request(tokens, output)
            assert adapter.wait_for_seq(server.publish(), 10)
            st = adapter.status()
            assert st.last_error is None and st.malformed_events == st.detached_blocks == 0
            paths = {p[:end] for p in adapter_nodes(adapter) for end in range(1, len(p) + 1)}
            assert paths == {(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 4, 7), (1, 2, 3, 5), (1, 2, 3, 5, 6),
                             (8,), (8, 8)}
            assert not adapter.capabilities().sessions and adapter.stats().open_sessions is None
    finally:
        server.close()


class SchedulerPublishing:
    """What SGLang's ``SchedulerKvEventsPublisher`` does where the operator configured a publisher:
    each loop, take the cache's events and publish them as one batch."""

    def __init__(self, server: Server):
        self.server, self.enable_kv_cache_events = server, True
        self.kv_event_publisher = server.publisher

    def publish_kv_events(self) -> None:
        self.server.publish()


@pytest.mark.parametrize("sglang_publishes", [False, True], ids=["radixtop-takes", "sglang-takes"])
def test_the_plugin_keeps_the_rust_cores_tree_in_process(sgl, sglang_publishes):
    """The plugin's in-process path (adapters/sglang/events/core.py) over a real Rust-core cache:
    the tree's tokens equal SGLang's own cached tokens after inserts, evictions and a flush; what
    the events cannot tell is unknown. Where SGLang's own publisher takes the events, the batches
    it publishes reach radixtop too (and still go out on the wire)."""
    from radixtop.adapters.events.adapter import EventTreeAdapter
    from radixtop.adapters.sglang.events.core import CoreEvents, CoreEventsAdapter, records_events
    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter

    port = free_ports(2)
    server = Server(sgl, port, None, core="rust")
    try:
        assert records_events(server.cache)
        sglang = SGLangInProcessAdapter(server.cache)  # no owner queue: this thread is the scheduler's
        tree = EventTreeAdapter(name="t", geometry=sglang.geometry, capacity_tokens=int(sglang.allocator.size))
        core = CoreEvents(server.cache, tree, SchedulerPublishing(server) if sglang_publishes else None)
        adapter = CoreEventsAdapter(sglang, core)
        assert core.sglang_takes == sglang_publishes
        with KVEventsAdapter(f"tcp://*:{port}") as wire:
            if sglang_publishes:
                catch_up(wire, server)
            for tokens, output in (([1, 2, 3, 4], [7, 8]), ([1, 2, 3, 5, 6], [9]), ([8, 8], [1])):
                server.request(tokens, output)
            cached = server.cache.evictable_size() + server.cache.protected_size()
            assert adapter.node(ROOT_ID).node.subtree_tokens == cached == 9  # 1 2 3 (4 7 | 5 6), 8 8
            assert adapter.match([1, 2, 3, 5, 6]).matched_tokens == 5
            caps = adapter.capabilities()
            assert caps.tree and caps.evict and caps.flush and not caps.sessions and "unknown" in caps.reason
            kid = adapter.children(ROOT_ID).children[0]
            assert kid.lock_ref is None and kid.holders is None and adapter.stats().node_count == 4
            before = {row["id"] for row in adapter.export() if "id" in row}
            evicted = adapter.evict(3)
            assert adapter.node(ROOT_ID).node.subtree_tokens == server.cache.evictable_size() < 9
            gone = before - {row["id"] for row in adapter.export() if "id" in row}
            assert evicted.evicted_nodes == len(gone) >= 1  # counted from the events, never a 0 for unknown
            with pytest.raises(Unsupported, match="POST /close_session"):  # SGLang's own route, and why
                adapter.close_session("a")
            if sglang_publishes:  # the same batches went out on the wire
                assert wire.wait_for_seq(server.seq) and wire.stats().total_tokens == server.cache.evictable_size()
            adapter.flush()
            assert adapter.node(ROOT_ID).node.subtree_tokens == 0 and adapter.children(ROOT_ID).total == 0
        adapter.release()
    finally:
        server.close()
