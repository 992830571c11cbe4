"""A real SGLang 0.5.23 server with its defaults: UnifiedRadixCache on the Rust tree core, which
has no Python nodes. radixtop shows what it can (totals, evictions, evict and flush) and says
what it cannot, never a 0 for an unknown count. Collected only beside sglang 0.5.23."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixtop.adapters.errors import Unsupported
from radixtop.adapters.http.client import RadixtopClient
from tests.on_sglang.server import launch
from tests.on_sglang.test_real_server import MAX_TOTAL_TOKENS, flood, settle


@pytest.fixture(scope="module")
def rust(tmp_path_factory):
    srv = launch(tmp_path_factory.mktemp("sglang-rust"), sessions=False, sleep_on_idle=True,
                 max_total_tokens=MAX_TOTAL_TOKENS)
    client = RadixtopClient(srv.admin_url, token=srv.token, timeout=30)
    yield srv, client
    client.close()
    srv.stop()


def test_the_default_core_says_it_has_no_tree_and_why(rust):
    _, client = rust
    caps = client.capabilities()
    assert not caps.tree and not caps.sessions and caps.evict and caps.flush
    assert "Rust tree core" in caps.reason
    with pytest.raises(Unsupported, match="Rust tree core"):
        client.children(0)


def test_counts_it_cannot_know_are_unknown_and_the_rest_equal_sglangs(rust):
    server, client = rust
    flood(server)
    settle(server, client)
    st, m = client.stats(), server.metrics()
    assert st.node_count is None and st.open_sessions is None and st.closed_sessions is None
    assert st.free_tokens == m["sglang:kv_available_tokens"]
    assert st.evictable_tokens == m["sglang:kv_evictable_tokens"]
    assert m["sglang:evicted_tokens_total"] > 0 and st.evicted_tokens == m["sglang:evicted_tokens_total"]
    assert st.prompt_tokens == m["sglang:prompt_tokens_total"]


def test_radixtop_stats_prints_unknown_not_zero(rust):
    server, _ = rust
    env = {"RADIXTOP_URL": server.admin_url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "stats"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "nodes unknown" in done.stdout and "0 nodes" not in done.stdout
    assert "sessions open unknown" in done.stdout
