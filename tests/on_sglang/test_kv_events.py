"""The KV-events adapter against SGLang's own event recorder and ZMQ publisher, over loopback.

Each "server" here is one DP rank of the real thing: SGLang 0.5.16's ``RadixCache`` built with
``enable_kv_cache_events=True`` over a CPU KV pool, driven as its scheduler drives it, whose
``take_events()`` go out through SGLang's ``ZmqEventPublisher`` (made by its
``EventPublisherFactory`` from a ``--kv-events-config`` JSON) on 127.0.0.1. The adapter subscribes
and the tree it rebuilds must hold exactly the cache's blocks (every page-aligned prefix of every
path). vLLM's event shapes are encoded by hand with msgspec (vLLM cannot be installed here).
"""

from __future__ import annotations

import atexit
import contextlib
import http.server
import json
import random
import socket
import threading
import time
import types
from array import array

import msgspec
import pytest
import zmq

from radixtop.adapters.errors import BadRequest, ReadOnly, UnknownNode, Unsupported
from radixtop.adapters.events.block_tree import BlockTree
from radixtop.adapters.events.wire import Cleared, DecodeError, Removed, Stored, decode_batch
from radixtop.adapters.events.zmq import KVEventsAdapter, rank_endpoint
from radixtop.adapters.model import ROOT_ID, UNKNOWN
from tests.on_sglang.ref.replay_sglang import SGLangReplayer, SGLangUnavailableError, _parse, _pool_shape, import_sglang
from tests.support.live_server import free_ports
from tests.support.trace_gen import generate_trace, min_safe_capacity

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def sgl():
    try:
        base = import_sglang()
    except SGLangUnavailableError as exc:
        pytest.fail(f"{exc}. Install it as .ci/ does; these tests must not be skipped.", pytrace=False)
    from sglang.srt.disaggregation import kv_events
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    return types.SimpleNamespace(**vars(base), kv_events=kv_events, InsertParams=InsertParams,
                                 PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator)


def wait_until_free(*ports: int, timeout: float = 5.0) -> None:
    """ZMQ closes a listening socket in its I/O thread, a moment after ``close()`` returns."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZMQ binds
                try:
                    probe.bind(("0.0.0.0", port))
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"port {port} is still in use"
                    time.sleep(0.02)


class Server:
    """One DP rank: a RadixCache recording KV events and SGLang's publisher for it."""

    def __init__(self, sgl, port: int, replay_port: int | None, *, dp_rank: int = 0, page_size: int = 1,
                 capacity: int = 512, buffer_steps: int = 10_000, lines: list[str] | None = None,
                 host: str = "*"):
        self.sgl, self.page_size, self.seq = sgl, page_size, -1
        # A wildcard host makes SGLang's PUB bind; any other host makes it connect (to a consumer
        # that binds).
        config = {"publisher": "zmq", "endpoint": f"tcp://{host}:{port}", "buffer_steps": buffer_steps}
        if replay_port is not None:
            config["replay_endpoint"] = f"tcp://*:{replay_port}"
        self.publisher = sgl.kv_events.EventPublisherFactory.create(json.dumps(config), dp_rank)
        if lines is not None:  # page size 1, driven op by op as the scheduler does (locks included)
            most, longest = _pool_shape(_parse(lines))
            self.replayer = SGLangReplayer(sgl, capacity, "lru", max_running=most, max_context_len=longest)
            self.allocator = self.replayer.allocator
            self.cache = self.replayer.cache = self._cache(self.replayer.req_to_token_pool)
        else:
            torch = sgl.torch
            pool = sgl.MHATokenToKVPool(size=capacity, page_size=page_size, dtype=torch.float16, head_num=1,
                                        head_dim=1, layer_num=1, device="cpu", enable_memory_saver=False)
            if page_size == 1:
                self.allocator = sgl.TokenToKVPoolAllocator(size=capacity, dtype=torch.float16, device="cpu",
                                                            kvcache=pool, need_sort=False)
            else:
                self.allocator = sgl.PagedTokenToKVPoolAllocator(size=capacity, page_size=page_size,
                                                                 dtype=torch.float16, device="cpu",
                                                                 kvcache=pool, need_sort=False)
            self.cache = self._cache(None)

    def _cache(self, req_to_token_pool):
        return self.sgl.RadixCache(self.sgl.CacheInitParams(
            disable=False, req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.page_size, eviction_policy="lru", enable_kv_cache_events=True,
            enable_session_radix_cache=True))

    def insert(self, tokens: list[int]) -> None:
        """A finished request with no cached prefix: slots for every token, insert, free what was
        already cached (as cache_finished_req does); page-aligned, as SGLang caches."""
        tokens = tokens[: len(tokens) - len(tokens) % self.page_size]
        if not tokens:
            return
        slots = self.sgl.alloc_token_slots(self.cache, len(tokens))
        key = self.sgl.RadixKey(array("q", tokens))
        result = self.cache.insert(self.sgl.InsertParams(key=key, value=slots))
        self.allocator.free(slots[: result.prefix_len])

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=num_tokens))

    def reset(self) -> None:
        self.cache.reset()
        self.allocator.clear()

    def publish(self, batch=None) -> int:
        """What the scheduler does after a step (it skips empty batches; tests send them to nudge)."""
        if batch is None:
            batch = self.sgl.kv_events.KVEventBatch(ts=time.time(), events=self.cache.take_events())
        self.publisher.publish(batch)
        self.seq += 1
        return self.seq

    def flushed(self) -> None:
        """Wait until SGLang's publisher thread has sent every batch published so far."""
        self.publisher._event_queue.join()

    def close(self) -> None:
        shutdown(self.publisher)


def shutdown(publisher) -> None:
    publisher.shutdown()
    atexit.unregister(publisher.shutdown)  # SGLang registers it; a second call waits 1 s at exit


def catch_up(adapter: KVEventsAdapter, server: Server, timeout: float = 10.0) -> None:
    """Nudge with empty batches until the adapter has seen one (a SUB socket that has just
    connected misses what was sent before its subscription arrived), then wait for the rest."""
    deadline = time.monotonic() + timeout
    while adapter.status().last_seq < 0:
        assert time.monotonic() < deadline, "the adapter received nothing"
        adapter.wait_for_seq(server.publish(), 0.2)
    assert adapter.wait_for_seq(server.publish(), timeout), adapter.status()
    assert adapter.status().last_seq == server.seq


# ----- what "the same tree" means -----


def sglang_blocks(cache, page: int) -> set[tuple[int, ...]]:
    """Every cached page as the whole token path ending with it."""
    out: set[tuple[int, ...]] = set()
    stack = [(c, ()) for c in cache.root_node.children.values()]
    while stack:
        node, prefix = stack.pop()
        tokens = tuple(node.key.token_ids)
        out.update(prefix + tokens[:end] for end in range(page, len(tokens) + 1, page))
        stack.extend((c, prefix + tokens) for c in node.children.values())
    return out


def adapter_blocks(adapter: KVEventsAdapter, page: int) -> set[tuple[int, ...]]:
    """The same, read through the adapter's public views only (children pages and node detail)."""
    out: set[tuple[int, ...]] = set()
    stack = [(ROOT_ID, ())]
    while stack:
        node_id, prefix = stack.pop()
        for child in adapter.children(node_id, 0, 10_000).children:
            detail = adapter.node(child.id, 0, 10_000)
            tokens = detail.token_ids
            assert len(tokens) == child.tokens and child.tokens % page == 0
            assert detail.path_tokens == len(prefix) + len(tokens) and child.parent_id == node_id
            out.update(prefix + tokens[:end] for end in range(page, len(tokens) + 1, page))
            stack.append((child.id, prefix + tokens))
    return out


def assert_same_tree(adapter: KVEventsAdapter, server: Server) -> None:
    page = server.page_size
    assert adapter_blocks(adapter, page) == sglang_blocks(server.cache, page)
    assert adapter.stats().total_tokens == server.cache.total_size()
    st = adapter.status()
    assert st.detached_blocks == 0 and st.last_error is None and st.malformed_events == st.bad_batches == 0


# ----- the rebuilt tree equals the cache's -----


def test_scheduler_workload_page_size_1(sgl):
    """A random trace (fixed seed) run as the scheduler runs it: match_prefix, locks,
    cache_finished_req, evictions under a small pool; a batch after every few ops."""
    lines = [t for t in generate_trace(7, 160) if json.loads(t)["op"] not in ("close", "register")]
    port, replay = (base := free_ports(2)), base + 1
    server = Server(sgl, port, replay, capacity=min_safe_capacity(lines), lines=lines)
    rng = random.Random(7)
    try:
        with KVEventsAdapter(f"tcp://*:{port}", f"tcp://*:{replay}", bytes_per_token=64) as adapter:
            catch_up(adapter, server)
            v0 = adapter.stats().version
            for line_no, op in _parse(lines):
                server.replayer.apply(line_no, op)
                if rng.random() < 0.4:
                    server.publish()
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            assert_same_tree(adapter, server)
            st = adapter.status()
            assert st.complete and st.block_size == 1 and st.batch_rank == 0 and st.missed_batches == 0
            stats = adapter.stats()
            assert stats.evicted_tokens > 0, "the trace should have evicted"
            assert stats.node_count < stats.total_tokens, "one-token pages are merged into runs"
            delta = adapter.changes(v0)
            assert delta.added and not delta.resync and delta.version == stats.version
            # Matches agree with SGLang's own match_prefix (called last: it splits nodes).
            queries = [json.loads(t)["input"] + [99_999] for t in lines if '"input"' in t][:25]
            for q in queries:
                m = adapter.match(q)
                expected = len(server.cache.match_prefix(
                    sgl.MatchPrefixParams(key=sgl.RadixKey(array("q", q)))).device_indices)
                assert m.matched_tokens == expected and m.matched_bytes == 64 * expected
    finally:
        server.close()


def test_paged_workload_with_splits_evictions_and_reset(sgl):
    """page_size 4 (SGLang's paged allocator on CPU): shared prefixes split at page bounds,
    evictions, and a reset (AllBlocksCleared) in the middle."""
    port, replay = (base := free_ports(2)), base + 1
    server = Server(sgl, port, replay, page_size=4, capacity=256)
    rng = random.Random(11)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 24))] for _ in range(4)]
    try:
        with KVEventsAdapter(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}") as adapter:
            catch_up(adapter, server)
            for step in range(120):
                if step == 60:
                    server.reset()
                    server.publish()
                    assert adapter.wait_for_seq(server.seq)
                    assert adapter.stats().total_tokens == 0 and adapter.stats().node_count == 0
                    assert adapter.children(ROOT_ID).total == 0
                roll = rng.random()
                if roll < 0.75:
                    server.insert(rng.choice(prefixes)[: rng.randrange(4, 25)]
                                  + [rng.randrange(1, 50) for _ in range(rng.randrange(0, 20))])
                else:
                    server.evict(rng.randrange(4, 64))
                if rng.random() < 0.5:
                    server.publish()
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            assert_same_tree(adapter, server)
            assert adapter.stats().geometry.page_size == 4 and adapter.status().complete
            for q in ([*p, 1, 2, 3, 4, 5] for p in prefixes):
                m = adapter.match(q)
                expected = len(server.cache.match_prefix(
                    sgl.MatchPrefixParams(key=sgl.RadixKey(array("q", q)))).device_indices)
                assert m.matched_tokens == expected and m.matched_tokens % 4 == 0
    finally:
        server.close()


def test_one_tree_per_dp_rank(sgl):
    """Two ranks publish on base port + rank; one adapter per rank follows its own cache."""
    port, replay = (base := free_ports(4)), base + 2  # ranks 0, 1 on port+0, port+1
    servers = [Server(sgl, port, replay, dp_rank=r) for r in range(2)]
    adapters = KVEventsAdapter.for_ranks(f"tcp://*:{port}", 2, f"tcp://*:{replay}")
    try:
        assert [a.endpoint for a in adapters] == [f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"]
        for rank, (server, adapter) in enumerate(zip(servers, adapters)):
            catch_up(adapter, server)
            server.insert([rank + 1] * 3 + [7, 8, 9])
            server.insert([rank + 1] * 3 + [5])
            server.publish()
        for server, adapter in zip(servers, adapters):
            assert adapter.wait_for_seq(server.seq)
        for rank, (server, adapter) in enumerate(zip(servers, adapters)):
            assert_same_tree(adapter, server)
            assert adapter.status().batch_rank == rank and f"rank {rank}" in adapter.name
        assert adapters[0].match([1, 1, 1, 7]).matched_tokens == 4
        assert adapters[1].match([1, 1, 1, 7]).matched_tokens == 0
    finally:
        for adapter in adapters:
            adapter.release()
        for server in servers:
            server.close()


# ----- sequence gaps -----


def test_late_join_fills_the_gap_from_the_replay_socket(sgl):
    port, replay = (base := free_ports(2)), base + 1
    server = Server(sgl, port, replay)
    try:
        for tokens in ([1, 2, 3, 4], [1, 2, 9], [5, 6]):
            server.insert(tokens)
            server.publish()
        server.flushed()  # sent with nobody subscribed: only the replay buffer has them
        with KVEventsAdapter(f"tcp://*:{port}", f"tcp://*:{replay}") as adapter:
            catch_up(adapter, server)
            st = adapter.status()
            assert st.replays >= 1 and st.replayed_batches >= 3 and st.complete and st.missed_batches == 0
            assert_same_tree(adapter, server)
            server.evict(100)
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            assert_same_tree(adapter, server)
            assert adapter.stats().total_tokens == 0
    finally:
        server.close()


def test_a_gap_the_replay_cannot_fill_marks_the_tree_incomplete_until_a_clear(sgl):
    port, replay = (base := free_ports(2)), base + 1
    server = Server(sgl, port, replay, buffer_steps=2)
    try:
        for tokens in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7], [8, 9]):
            server.insert(tokens)
            server.publish()
        server.flushed()
        with KVEventsAdapter(f"tcp://*:{port}", f"tcp://*:{replay}") as adapter:
            catch_up(adapter, server)  # the buffer (2 batches) holds the first nudge: 0..2 are gone
            st = adapter.status()
            assert not st.complete and st.missed_batches >= 3 and st.replays == 1
            server.insert([1, 2, 3, 4, 5, 6, 7, 3])
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            assert adapter.status().detached_blocks == 1  # its parent (7) was in a lost batch
            assert "incomplete" in adapter.capabilities().reason
            assert adapter.stats().total_tokens < server.cache.total_size()
            server.reset()
            server.insert([4, 4, 4])
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            assert adapter.status().complete and "incomplete" not in adapter.capabilities().reason
            assert_same_tree(adapter, server)
    finally:
        server.close()


def test_without_a_replay_socket_a_late_join_is_reported_not_fatal(sgl):
    port = free_ports()
    server = Server(sgl, port, None)
    try:
        server.insert([1, 2, 3])
        server.publish()
        server.flushed()
        with KVEventsAdapter(f"tcp://*:{port}") as adapter:
            catch_up(adapter, server)
            st = adapter.status()
            assert not st.complete and st.replays == 0 and st.missed_batches >= 1
            server.insert([1, 2, 3, 4])  # its parent (3) was in the lost batch: detached
            server.insert([7, 8])
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            assert adapter.match([7, 8]).matched_tokens == 2 and adapter.status().detached_blocks == 1
    finally:
        server.close()


def test_a_restarted_server_restarts_the_tree(sgl):
    port, replay = (base := free_ports(2)), base + 1
    first = Server(sgl, port, replay)
    with KVEventsAdapter(f"tcp://*:{port}", f"tcp://*:{replay}") as adapter:
        try:
            catch_up(adapter, first)
            for i in range(10):
                first.insert([1, 2, i + 10])
                first.publish()
            assert adapter.wait_for_seq(first.seq)
        finally:
            first.close()
        wait_until_free(port, replay)
        second = Server(sgl, port, replay)  # a new process: sequences from 0, a fresh cache
        try:
            second.insert([42, 43])
            second.publish()
            deadline = time.monotonic() + 10
            while adapter.status().restarts == 0:
                assert time.monotonic() < deadline, adapter.status()
                time.sleep(0.1)
                second.publish()
            catch_up(adapter, second)
            assert_same_tree(adapter, second)
            assert adapter.status().complete
        finally:
            second.close()


def replayed(replay_port: int, start: int = 0) -> list[tuple[int, bytes]]:
    """Ask a publisher's replay socket directly (the ROUTER protocol any consumer uses)."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert dealer.poll(5000), "the replay socket did not answer"
            _, seq, payload = dealer.recv_multipart()
            if (seq := int.from_bytes(seq, "big", signed=True)) == -1:
                return out
            out.append((seq, payload))
    finally:
        dealer.close(linger=0)


@pytest.mark.parametrize("same_publisher", [True, False])
def test_a_jump_checks_the_publisher_before_filling_the_gap(sgl, same_publisher):
    """The live stream comes from an XPUB the test drives (it sees the subscription arrive, so
    nothing is lost by accident); the replay socket is a real publisher's. After batches 0-1 the
    stream jumps to 4. Same publisher: 2-3 come from the replay. A publisher that restarted and
    counted past our sequence (its batch 1 is not the one applied): the tree restarts from its
    batch 0."""
    port, replay, unused = (base := free_ports(3)), base + 1, base + 2
    server = Server(sgl, unused, replay)
    stream = zmq.Context.instance().socket(zmq.XPUB)
    try:
        for tokens in ([1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 9], [5, 7]):
            server.insert(tokens)
            server.publish()
        server.flushed()
        history = replayed(replay)
        assert [seq for seq, _ in history] == [0, 1, 2, 3, 4]
        stream.bind(f"tcp://127.0.0.1:{port}")
        with KVEventsAdapter(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}") as adapter:
            assert stream.poll(5000) and stream.recv() == b"\x01"  # the adapter's subscription
            if same_publisher:
                first = history[:2]
            else:
                old = sgl.kv_events
                first = [(seq, msgspec.msgpack.encode(old.KVEventBatch(ts=float(seq), events=[old.BlockStored(
                    block_hashes=[100 + seq], parent_block_hash=None, token_ids=[100 + seq], block_size=1,
                    lora_id=None)]))) for seq in (0, 1)]
            for seq, payload in [*first, history[4]]:
                stream.send_multipart([b"", seq.to_bytes(8, "big"), payload])
            assert adapter.wait_for_seq(4)
            st = adapter.status()
            assert st.complete and (st.restarts, st.replays) == ((0, 1) if same_publisher else (1, 2))
            assert_same_tree(adapter, server)
    finally:
        stream.close(linger=0)
        server.close()


def test_the_adapter_module_loads_neither_torch_nor_textual():
    from tests.support.modules import loaded_modules

    mods = loaded_modules("import radixtop.adapters.events.zmq")
    assert "zmq" in mods and not {"torch", "textual", "sglang"} & mods
    # of the backend, only its pure-Python machinery: the block tree's shards and journal, the
    # sessions' orders and the close rules their rows are made with, the history (issue 29)
    pure = ("radixtop.gpu_backend.owner", "radixtop.gpu_backend.ledger", "radixtop.gpu_backend.session_rules",
            "radixtop.gpu_backend.history")
    assert not {m for m in mods if m.startswith("radixtop.gpu_backend.") and not m.startswith(pure)}


def test_the_event_tree_without_zmq_loads_no_zmq():
    """The in-process path (the Rust core's events, applied by the plugin) needs no ZMQ."""
    from tests.support.modules import loaded_modules

    mods = loaded_modules("import radixtop.adapters.sglang.events.core, radixtop.adapters.events.adapter")
    assert "radixtop.adapters.events.adapter" in mods and not {"zmq", "torch", "textual", "sglang"} & mods


# ----- the publisher, from the server's /server_info -----


@contextlib.contextmanager
def info_server(info: dict):
    """A stand-in for the server's HTTP side: ``GET /server_info`` answers ``info`` (what the real
    ``/server_info`` builds its ``kv_events`` block with is SGLang's own code, called by the test);
    the requests' headers are kept in ``.headers``."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(dict(self.headers))
            body = json.dumps(info).encode() if self.path == "/server_info" else b"{}"
            self.send_response(200 if self.path == "/server_info" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_kv_events_takes_the_servers_url(sgl):
    """``--kv-events http://host:port``: the publisher from ``/server_info``'s ``kv_events`` block
    (sgl-project/sglang#25844; 0.5.16 builds it with ``ServerArgs.describe_kv_events_publisher``,
    without the replay port, which comes from the ``kv_events_config`` beside it); the wildcard
    host is the URL's. A late join is filled from the replay socket found so."""
    from sglang.srt.server_args import ServerArgs

    from radixtop.cli.targets import external_spec, open_target

    port, replay = (base := free_ports(2)), base + 1
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay}"})
    args = ServerArgs(model_path="dummy", page_size=1, kv_events_config=config)
    info = {"kv_events_config": config, "kv_events": args.describe_kv_events_publisher(), "version": "0.5.16"}
    server = Server(sgl, port, replay)
    try:
        server.insert([1, 2, 3])
        server.publish()
        server.flushed()
        with info_server(info) as (url, seen):
            target = open_target(external_spec(url, None, 0, None, "key", None, None))
            adapter, label, close = target.adapter, target.label, target.release
            try:
                assert (adapter.endpoint, adapter.replay_endpoint) == (f"tcp://127.0.0.1:{port}",
                                                                        f"tcp://127.0.0.1:{replay}")
                assert url in label and seen[0]["Authorization"] == "Bearer key"
                catch_up(adapter, server)
                assert adapter.status().replayed_batches >= 1
                assert_same_tree(adapter, server)
            finally:
                close()
            with pytest.raises(ValueError, match="DP rank 1 .* 1 rank"):
                open_target(external_spec(url, None, 1, None, None, None, None))
        with info_server({"kv_events": None, "kv_events_config": None}) as (url, _):
            with pytest.raises(ValueError, match="no KV events.*--kv-events-config"):
                open_target(external_spec(url + "/", None, 0, None, None, None, None))
        with pytest.raises(ValueError, match="cannot read"):
            open_target(external_spec(f"http://127.0.0.1:{free_ports(1)}", None, 0, None, None, None, None, timeout=2))
    finally:
        server.close()


# ----- tolerant decoding -----


def _pack(obj) -> bytes:
    return msgspec.msgpack.encode(obj)


def test_sglang_shape_with_extra_and_missing_trailing_fields():
    batch = decode_batch(_pack([1.5, [
        ["BlockStored", [11], None, [1, 2], 2, None, "GPU", "lora-a", [None], 7, "full_attention", "a future field"],
        ["BlockStored", [12], 11, [3, 4], 2],  # no lora_id, no medium
        ["BlockRemoved", [12], "GPU", "extra"],
        ["BlockRemoved", [13]],
        ["AllBlocksCleared", "extra"],
    ], 3, "extra batch field"]))
    assert batch.ts == 1.5 and batch.rank == 3 and not batch.unknown and batch.malformed == 0
    assert batch.events == [Stored((11,), None, (1, 2), 2, "GPU", 7, kind="full_attention", lora_name="lora-a"),
                            Stored((12,), 11, (3, 4), 2),
                            Removed((12,), "GPU"), Removed((13,)), Cleared()]


def test_every_sglang_event_shape_and_medium(sgl):
    """The shapes SGLang has shipped. 0.5.16: SGLang's own array structs (encoded by its classes).
    0.5.18-0.5.19: the same arrays with a ``BlockStoredMetadata`` map at position 7 when the
    stored node has a ``cache_salt`` (sgl-project/sglang#30827; #37482 first put ``session_id``
    in that map too): that version is not installed, so the payload is written here. 0.5.19+:
    tagged maps (#37482; 0.5.23's classes are tested in test_kv_events23.py). Older media
    (CPU_TIER1, CPU_TIER2, #18205) read as today's names (CPU_PINNED, DISK)."""
    old = sgl.kv_events
    v16 = decode_batch(_pack(old.KVEventBatch(ts=1.0, attn_dp_rank=0, events=[
        old.BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[5], block_size=1, lora_id=None,
                        medium="GPU"),
        old.BlockRemoved(block_hashes=[1], medium="CPU_PINNED"), old.AllBlocksCleared()])))
    assert v16.events == [Stored((1,), None, (5,), 1, "GPU"), Removed((1,), "CPU_PINNED"), Cleared()]
    v18 = decode_batch(_pack([2.0, [
        ["BlockStored", [11], None, [1, 2], 2, None, "GPU", {"cache_salt": "salt"}],
        ["BlockStored", [12], 11, [3, 4], 2, None, "CPU_TIER1", {"cache_salt": "salt", "session_id": "a"}],
        ["BlockStored", [13], 12, [5, 6], 2, None, "CPU_TIER2", {}],
        ["BlockRemoved", [13], "CPU_TIER2"],
    ], 0]))
    assert v18.malformed == 0 and v18.events == [
        Stored((11,), None, (1, 2), 2, "GPU", cache_salt="salt"),
        Stored((12,), 11, (3, 4), 2, "CPU_PINNED", cache_salt="salt", session_id="a"),
        Stored((13,), 12, (5, 6), 2, "DISK"), Removed((13,), "DISK")]
    v19 = decode_batch(_pack([3.0, [
        {"type": "BlockStored", "block_hashes": [21], "parent_block_hash": None, "token_ids": [7, 8],
         "block_size": 2, "lora_id": None, "medium": "EXTERNAL", "cache_salt": "s", "session_id": "b"},
        {"type": "BlockStored", "block_hashes": [22], "parent_block_hash": 21, "token_ids": [9, 9],
         "block_size": 2, "lora_id": None},  # optional fields left at None are omitted
        {"type": "BlockRemoved", "block_hashes": [22], "medium": "CPU_TIER1"}, {"type": "AllBlocksCleared"},
    ], 1]))
    assert v19.rank == 1 and v19.malformed == 0 and v19.events == [
        Stored((21,), None, (7, 8), 2, "EXTERNAL", cache_salt="s", session_id="b"),
        Stored((22,), 21, (9, 9), 2), Removed((22,), "CPU_PINNED"), Cleared()]
    odd = decode_batch(_pack([4.0, [["BlockStored", [31], None, [1], 1, None, "GPU", {"session_id": 7}]]]))
    assert odd.events == [Stored((31,), None, (1,), 1, "GPU")]  # a metadata value of the wrong type is dropped


def test_old_vllm_arrays_without_medium_or_rank():
    batch = decode_batch(_pack([2.0, [["BlockStored", [1, 2], None, [5, 6, 7, 8], 2, None],
                                      ["BlockRemoved", [2]]]]))
    assert batch.rank is None
    assert batch.events[0].blocks() == [(1, (5, 6)), (2, (7, 8))] and batch.events[1] == Removed((2,))


class VllmEvent(msgspec.Struct, omit_defaults=True, tag=True):
    """vLLM's current encoding: maps tagged by "type", not arrays."""


class VllmBlockStored(VllmEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class VllmBlockRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class VllmBlockMoved(VllmEvent, tag="BlockMoved"):  # a kind this adapter has never heard of
    block_hashes: list[int]


class VllmBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: int | None = None

    @property
    def attn_dp_rank(self) -> int | None:  # lets SGLang's publisher stamp the rank, as vLLM's does
        return self.data_parallel_rank

    @attn_dp_rank.setter
    def attn_dp_rank(self, rank: int | None) -> None:
        self.data_parallel_rank = rank


def vllm_batch() -> VllmBatch:
    a, b, c = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    return VllmBatch(time.time(), [
        VllmBlockStored([a, b], None, [1, 2, 3, 4], 2, None, "GPU", "adapter-x", [None, None], 0, "full"),
        VllmBlockStored([c], b, [5, 6], 2, None, "GPU", None, group_idx=0),
        VllmBlockStored([a], None, [1, 2], 2, None, "GPU", None, group_idx=1),  # another KV group
        VllmBlockMoved([1]),
        VllmBlockStored([b"\x09" * 32], None, [1, 2], 2, None, "CPU", None),  # a host-tier copy
        VllmBlockRemoved([a], "GPU", group_idx=1),
    ])


def test_vllm_maps_bytes_hashes_unknown_tags_and_malformed_events():
    batch = decode_batch(_pack(vllm_batch()))
    assert batch.unknown == {"BlockMoved": 1} and len(batch.events) == 5
    assert batch.events[0].blocks() == [(b"\x01" * 32, (1, 2)), (b"\x02" * 32, (3, 4))]
    assert batch.events[0].group_idx == 0 and batch.events[3].medium == "CPU"
    bad = decode_batch(_pack([0.0, [["BlockStored", ["not a hash"], None, [1], 1], ["BlockRemoved"], 42,
                                    ["BlockStored", [1, 2], None, [1, 2, 3, 4, 5], 2]]]))
    assert bad.malformed == 3 and bad.unknown == {"?": 1} and bad.events == []
    for payload in (b"\xc1", _pack("text"), _pack([1.0, "not a list"]), _pack({"ts": 1.0})):
        with pytest.raises(DecodeError):
            decode_batch(payload)


def test_vllm_shaped_stream_over_zmq(sgl):
    """vLLM's map encoding (bytes hashes, several blocks per event, KV groups, tiers) through
    the same PUB/ROUTER wire protocol."""
    port, replay = (base := free_ports(2)), base + 1
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}",
                         "replay_endpoint": f"tcp://*:{replay}"})
    publisher = sgl.kv_events.EventPublisherFactory.create(config, 0)
    try:
        with KVEventsAdapter(f"tcp://*:{port}", f"tcp://*:{replay}") as adapter:
            publisher.publish(vllm_batch())
            seq = 0
            while not adapter.wait_for_seq(seq, 0.2):
                publisher.publish(VllmBatch(time.time(), []))
                seq += 1
            st = adapter.status()
            assert st.complete and st.unknown_events == {"BlockMoved": 1} and st.skipped_medium_events == 1
            assert st.batch_rank == 0 and st.block_size == 2
            # (the chain is adapter-x's, a LoRA's: a prompt of the default namespace matches none of it)
            assert adapter.match([1, 2, 3, 4, 5, 6, 7]).matched_tokens == 0
            assert adapter.stats().total_tokens == 6 and adapter.stats().node_count == 1
    finally:
        shutdown(publisher)


# ----- the block tree on its own -----


def test_block_tree_detaches_orphans_and_reattaches_them():
    tree = BlockTree()
    tree.store("c", "b", (3,), 1.0)  # parent not seen yet: detached
    assert tree.detached_blocks() == 1 and tree.root.subtree_tokens == 0
    tree.store("a", None, (1,), 1.0)
    tree.store("b", "a", (2,), 1.0)  # reattaches c: one node a-b-c
    assert tree.detached_blocks() == 0 and len(tree.nodes) == 2 and tree.root.subtree_tokens == 3
    node = next(tree.iter_nodes())
    tree.store("x", "a", (9,), 2.0)  # a branch inside the node: it splits, the head keeps its id
    assert node.token_slice(0, 10) == (1,) and len(node.children) == 2
    assert tree.match((1, 2, 3, 4)).matched == 3 and tree.match((1, 9)).matched == 2
    assert tree.remove("b") == 1  # a parent removed first (vLLM may): c waits again
    assert tree.detached_blocks() == 1 and tree.root.subtree_tokens == 2
    tree.store("b", "a", (2,), 3.0)
    assert tree.detached_blocks() == 0 and tree.root.subtree_tokens == 4
    tree.store("a", None, (1,), 3.0)  # a duplicate store needs a second remove
    assert tree.remove("a") == 0 and tree.remove("zzz") == 0 and tree.unknown_removes == 1
    v = tree.version
    tree.clear(4.0)
    assert tree.changes(v).resync and len(tree.nodes) == 1 and tree.blocks == {}


def test_block_tree_holders_follow_splits_removals_and_orphans():
    """A block stored by a session's request holds that session (SGLang 0.5.19+'s session_id):
    a node's holders are its blocks' sessions, through splits, removals, orphans and clears."""
    tree = BlockTree()
    tree.store("a", None, (1,), 1.0, "s1")
    tree.store("b", "a", (2,), 1.0, "s1")
    tree.store("c", "b", (3,), 1.0)  # a request without a session
    top = next(tree.iter_nodes())
    assert top.holders == {"s1": 2} and tree.holding == {"s1": 1}
    tree.store("x", "a", (9,), 2.0, "s2")  # splits after a
    tail = tree.blocks["b"].node
    assert top.holders == {"s1": 1} and tail.holders == {"s1": 1} and tree.holding == {"s1": 2, "s2": 1}
    v = tree.version
    tree.store("a", None, (1,), 3.0, "s2")  # stored again by another session: it holds the block too
    assert top.holders == {"s1": 1, "s2": 1} and top.id in tree.changes(v).changed
    att = tree.attribute()
    assert att.beneath[top.id] == 2 and att.beneath[0] == 2
    s1, s2 = att.sessions["s1"], att.sessions["s2"]
    assert (s1.tagged_nodes, s1.exclusive, s1.path, s1.fair) == (2, 1, 2, 1.5)  # b is its own; a shared
    assert (s2.tagged_nodes, s2.exclusive, s2.path, s2.fair, s2.last_store) == (2, 1, 2, 1.5, 3.0)
    assert tree.remove("b") == 1  # c waits, detached: its node and holders go
    assert tail.id not in tree.nodes and tree.holding == {"s1": 1, "s2": 2}
    tree.remove("x")
    assert tree.holding == {"s1": 1, "s2": 1}
    tree.clear(4.0)
    assert tree.holding == {} and tree.attribute().sessions == {}


def test_block_tree_keeps_its_maps_of_every_node_and_block_in_shards():
    """The tree is fed on the events thread, inside SGLang's scheduler process when the plugin
    reads its own server's events: a dict of every block rebuilding its table in one insert held
    the GIL, and so the scheduler, ~50 ms per million entries (``ShardedMap``)."""
    from radixtop.gpu_backend.owner.shards import ShardedMap

    tree = BlockTree()
    assert isinstance(tree.nodes, ShardedMap) and isinstance(tree.blocks, ShardedMap)
    parent = None
    for k in range(300):
        tree.store(f"b{k}", parent, (k,), 1.0)
        parent = f"b{k}" if k % 3 else None
    assert len(tree.blocks) == 300 and max(len(s) for s in tree.blocks.shards) < 300
    tree.clear(2.0)
    assert isinstance(tree.nodes, ShardedMap) and isinstance(tree.blocks, ShardedMap) and len(tree.nodes) == 1


# ----- a read-only target -----


def test_read_only_refusals_and_unknowns(sgl):
    """Also: the adapter binds, and SGLang's publisher (a non-wildcard endpoint) connects to it."""
    port = free_ports()
    server = Server(sgl, port, None, host="127.0.0.1")
    try:
        with KVEventsAdapter(f"tcp://127.0.0.1:{port}", bind=True, bytes_per_token=10,
                             capacity_tokens=100) as adapter:
            caps = adapter.capabilities()
            assert caps.read_only and not (caps.sessions or caps.close or caps.evict or caps.flush)
            assert caps.tree and caps.changes and "no event batch received yet" in caps.reason
            catch_up(adapter, server)
            server.insert([1, 2, 3])
            server.publish()
            assert adapter.wait_for_seq(server.seq)
            st = adapter.stats()
            assert (st.capacity_tokens, st.available_tokens, st.evictable_tokens) == (100, 97, 3)
            assert st.unevictable_tokens is None  # locks are not in the events: unknown, never 0
            assert st.protected_tokens is st.session_held_tokens is st.uncached_tokens is None
            assert st.capacity_bytes == 1000 and st.total_bytes == 30
            child = adapter.children(ROOT_ID).children[0]
            # not in the events, and no session_id in this stream: unknown, never 0 or none
            assert child.bytes == 30 and child.lock_ref is None and child.hit_count is None
            assert child.holders is None and adapter.node(child.id).sessions_beneath is None
            for read in (adapter.sessions, lambda: adapter.session("a"), lambda: adapter.plan_close("a")):
                with pytest.raises(Unsupported):
                    read()
            for act in (lambda: adapter.close_session("a"), lambda: adapter.evict(1), adapter.flush):
                with pytest.raises(ReadOnly):
                    act()
            with pytest.raises(UnknownNode):
                adapter.node(10**6)
            with pytest.raises(BadRequest):
                adapter.children(ROOT_ID, 0, 10, "size")
            rows = list(adapter.export())
            assert rows[0]["node_count"] == 1 and rows[1]["tokens"] == 3
            assert rows[1]["lock_ref"] is None and rows[1]["holders"] is None
            columns = adapter.export_columns().columns
            assert list(columns["lock_ref"]) == list(columns["hit_count"]) == [UNKNOWN]
    finally:
        server.close()


def test_rank_endpoints():
    assert rank_endpoint("tcp://*:5557", 0) == "tcp://127.0.0.1:5557"
    assert rank_endpoint("tcp://0.0.0.0:5557", 3) == "tcp://127.0.0.1:5560"
    assert rank_endpoint("tcp://gpu-7:5557", 1) == "tcp://gpu-7:5558"
    assert rank_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    for bad in ("tcp://nohost", "http://x:1", "ipc:///tmp/x"):
        with pytest.raises(BadRequest):
            rank_endpoint(bad, 1)


def test_every_medium_says_which_tiers_hold_each_node(sgl):
    """HiCache's copies in SGLang's own event classes, every medium (new and old names): the tree
    is the GPU's blocks; each node says which other tiers hold all of it, and each tier's tokens
    are in the totals. A tier's removal or a clear takes its copies away."""
    from radixtop.adapters.events.adapter import EventTreeAdapter

    ke = sgl.kv_events
    tree = EventTreeAdapter(name="tiers", bytes_per_token=2)

    def batch(seq, *events):
        tree.apply(seq, msgspec.msgpack.encode(ke.KVEventBatch(ts=time.time(), events=list(events))))

    batch(0, ke.BlockStored([1, 2], None, [1, 2, 3, 4], 2, None, "GPU"),
          ke.BlockStored([3], 2, [5, 6], 2, None, "GPU"),
          ke.BlockStored([4], 2, [0, 0], 2, None, "GPU"),  # a branch: [1, 2] is a node of its own
          ke.BlockStored([9], None, [7, 8], 2, None, None))  # no medium: the tree's own tier
    batch(1, ke.BlockStored([1, 2], None, [1, 2, 3, 4], 2, None, "CPU_PINNED"),
          ke.BlockStored([1], None, [1, 2], 2, None, "CPU_TIER2"),  # old name of DISK
          ke.BlockStored([1, 2, 3], None, [1, 2, 3, 4, 5, 6], 2, None, "EXTERNAL"))
    head = tree.match([1, 2, 3, 4]).node_id
    tail = tree.match([1, 2, 3, 4, 5, 6]).node_id
    side = tree.match([1, 2, 3, 4, 0, 0]).node_id
    other = tree.match([7, 8]).node_id
    assert len({head, tail, side, other, ROOT_ID}) == 5
    tiers = {n.id: n.tiers for n in (tree.node(i).node for i in (head, tail, side, other))}
    # disk holds only the first of head's two blocks: not all of it, so not listed
    assert tiers == {head: ("GPU", "host", "external"), tail: ("GPU", "external"), side: ("GPU",),
                     other: ("GPU",)}
    assert tree.node(ROOT_ID).node.tiers == ()
    assert tree.stats().tier_tokens == {"GPU": 10, "host": 4, "disk": 2, "external": 6}
    assert tree.stats().total_tokens == 10  # the tree is the device's
    batch(2, ke.BlockRemoved([1, 2], "CPU_PINNED"), ke.BlockRemoved([3], "GPU"))
    assert tree.node(head).node.tiers == ("GPU", "external") and tree.stats().tier_tokens["host"] == 0
    assert tree.stats().total_tokens == 8
    # a copy stored twice needs two removals, as the tree's own blocks do
    batch(3, ke.BlockStored([1], None, [1, 2], 2, None, "DISK"), ke.BlockRemoved([1], "DISK"))
    assert tree.stats().tier_tokens["disk"] == 2
    batch(4, ke.BlockRemoved([1], "DISK"))
    assert tree.stats().tier_tokens["disk"] == 0
    batch(5, ke.AllBlocksCleared())
    assert tree.stats().tier_tokens == {"GPU": 0}
