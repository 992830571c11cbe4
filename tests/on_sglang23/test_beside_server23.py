"""Issue 27 on a real SGLang 0.5.23 server with its defaults (the Rust tree core): with
``RADIXTOP_BESIDE=1`` the plugin leaves a probe in the scheduler and serves the admin API from
radixtop's own process beside it. The tree there is what SGLang caches; ``kill -9`` of that
process under load costs SGLang no request, and it comes back, saying what it missed.
Collected only beside sglang 0.5.23."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from radixtop.adapters.http.client import RadixtopClient
from tests.on_sglang.server import launch
from tests.on_sglang.test_real_server import MAX_TOTAL_TOKENS, beside_pid, fresh, kill_under_load, settle

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

@pytest.fixture(scope="module")
def beside(tmp_path_factory):
    srv = launch(tmp_path_factory.mktemp("sglang-beside"), sessions=False, sleep_on_idle=True,
                 max_total_tokens=MAX_TOTAL_TOKENS, env={"RADIXTOP_BESIDE": "1"})
    client = RadixtopClient(srv.admin_url, token=srv.token, timeout=30)
    yield srv, client
    client.release()
    srv.stop()


def test_the_admin_api_is_served_from_radixtops_own_process_with_sglangs_tree(beside):
    server, client = beside
    pid = beside_pid(server)  # (radixtop's own process, not the scheduler's)
    nice = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    assert nice == 10  # where both want a core, SGLang's work comes first
    prompts = [fresh(64) for _ in range(3)]
    shared = fresh(48)
    for p in prompts + [shared + fresh(16), shared + fresh(16)]:
        server.generate(p, max_new_tokens=4)
    settle(server, client)
    m = server.metrics()
    assert client.node(0, 0, 1).node.subtree_tokens == m["sglang:kv_evictable_tokens"] > 0
    for p in prompts:
        assert client.match(p).matched_tokens >= len(p) - 1
    branch = client.match(shared)
    assert branch.matched_tokens == len(shared) and client.children(branch.node_id).total == 2
    caps = client.capabilities()
    assert caps.tree and caps.evict and caps.flush and not caps.close
    assert "beside" in caps.reason and "incomplete" not in caps.reason
    st = client.stats()  # SGLang's own totals, asked of the scheduler through the probe
    assert (st.available_tokens, st.evictable_tokens, st.capacity_tokens) == \
        (m["sglang:kv_available_tokens"], m["sglang:kv_evictable_tokens"], MAX_TOTAL_TOKENS)


def test_sglangs_own_evict_and_flush_through_radixtops_process_and_the_tree_follows(beside):
    """Each compared with SGLang's own evictable tokens as its scheduler reads them at that step
    (through the probe; its /metrics gauge is republished every 30 s when idle)."""
    server, client = beside
    for _ in range(4):
        server.generate(fresh(64), max_new_tokens=4)
    settle(server, client)
    before = client.node(0, 0, 1).node.subtree_tokens
    assert before == client.stats().evictable_tokens == server.metrics()["sglang:kv_evictable_tokens"] > 64
    evicted = client.evict(32)
    assert evicted.evicted_tokens >= 32 and evicted.evicted_nodes >= 1
    assert client.node(0, 0, 1).node.subtree_tokens == before - evicted.evicted_tokens == \
        client.stats().evictable_tokens
    client.flush()
    assert client.node(0, 0, 1).node.subtree_tokens == 0 == client.stats().evictable_tokens
    assert client.children(0).total == 0


def test_kill_9_of_radixtops_process_under_load_costs_sglang_no_request(beside):
    server, client = beside
    pid = beside_pid(server)

    kill_under_load(server, pid, 40)
    deadline = time.monotonic() + 30
    while True:  # back within seconds: a new process, the same port and token
        found = re.findall(r"started again \(pid (\d+);", server.log())
        if found:
            try:
                caps = client.capabilities()
                break
            except Exception:
                pass
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.2)
    assert int(found[-1]) != pid
    assert "went down" in server.log()
    assert "incomplete" in caps.reason  # it says what it missed, never a silent partial tree
    server.generate(fresh(30), max_new_tokens=4)
    assert server.get("/health").status_code == 200
