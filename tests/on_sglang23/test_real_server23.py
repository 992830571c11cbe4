"""A real SGLang 0.5.23 server with its defaults: UnifiedRadixCache on the Rust tree core, which
has no Python nodes. The plugin has the core record its KV events and keeps the tree from them in
process (no --kv-events-config); totals come from SGLang's own counters. What the events cannot
tell (locks, hit counts) is unknown, never 0. Collected only beside sglang 0.5.23."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from radixtop.adapters.http.client import RadixtopClient
from tests.on_sglang.server import launch
from tests.on_sglang.test_real_server import MAX_TOTAL_TOKENS, PLACES, flood, fresh, settle, two_run_together


@pytest.fixture(scope="module", params=PLACES)
def rust(request, tmp_path_factory):
    """The server, radixtop in its scheduler's process and (issue 27) beside it: every test of
    this module runs on each."""
    env = {"RADIXTOP_BESIDE": ""} if request.param == "beside the scheduler" else {"RADIXTOP_BESIDE": "0"}
    srv = launch(tmp_path_factory.mktemp("sglang-rust"), sessions=False, sleep_on_idle=True,
                 max_total_tokens=MAX_TOTAL_TOKENS, env=env)
    srv.options["place"] = request.param
    client = RadixtopClient(srv.admin_url, token=srv.token, timeout=30)
    yield srv, client
    client.release()
    srv.stop()


def test_the_default_core_shows_its_tree_from_its_own_kv_events(rust):
    """No --kv-events-config: the plugin has the Rust core record its KV events and takes them
    in process. The tree holds exactly what SGLang counts as cached; locks are unknown, not 0."""
    server, client = rust
    prompts = [fresh(64) for _ in range(3)]
    shared = fresh(48)
    for p in prompts + [shared + fresh(16), shared + fresh(16)]:
        server.generate(p, max_new_tokens=4)
    settle(server, client)
    caps = client.capabilities()
    assert caps.tree and caps.evict and caps.flush and not caps.close and caps.changes
    assert "KV events" in caps.reason and "lock" in caps.reason
    for p in prompts:
        assert client.match(p).matched_tokens >= len(p) - 1
    st, m = client.stats(), server.metrics()
    root = client.node(0, 0, 1).node
    assert st.node_count is not None and st.node_count >= 5
    assert root.subtree_tokens == m["sglang:kv_evictable_tokens"] + st.protected_tokens > 0
    page = client.children(0, 0, 100)
    assert page.total >= 4 and all(c.lock_ref is None and c.hit_count is None for c in page.children)
    branch = client.match(shared)
    assert branch.matched_tokens == len(shared) and client.children(branch.node_id).total == 2


def test_the_tree_follows_sglangs_own_evictions_and_flush(rust):
    server, client = rust
    flood(server)
    settle(server, client)
    m = server.metrics()
    assert m["sglang:evicted_tokens_total"] > 0
    assert client.node(0, 0, 1).node.subtree_tokens == m["sglang:kv_evictable_tokens"]
    assert client.stats().node_count == len(list(client.export())) - 1
    client.flush()
    settle(server, client)
    assert client.node(0, 0, 1).node.subtree_tokens == 0 and client.children(0).total == 0


def test_radixtop_tree_prints_the_default_cores_tree(rust):
    server, client = rust
    prompt = fresh(80)
    server.generate(prompt, max_new_tokens=4)
    settle(server, client)
    env = {"RADIXTOP_URL": server.admin_url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "tree", "--depth", "2"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = client.match(prompt)
    node = found.partial_node_id or found.node_id  # the prompt ends inside its node (output tokens follow)
    assert f"#{node}" in done.stdout and "locks and holders unknown" in done.stdout
    shown = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "node", str(node)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines() if line.split()}
    assert lines["lock_ref"] == ["unknown"] and lines["tiers"] == ["GPU"]


def test_counts_it_cannot_know_are_unknown_and_the_rest_equal_sglangs(rust):
    server, client = rust
    flood(server)
    settle(server, client)
    st, m = client.stats(), server.metrics()
    assert st.open_sessions is None and st.closed_sessions is None  # no session ids in this stream
    assert st.node_count == client.stats().node_count > 0
    assert st.available_tokens == m["sglang:kv_available_tokens"]
    assert st.evictable_tokens == m["sglang:kv_evictable_tokens"]
    assert m["sglang:evicted_tokens_total"] > 0 and st.evicted_tokens == m["sglang:evicted_tokens_total"]
    assert st.prompt_tokens == m["sglang:prompt_tokens_total"]
    (full,) = st.buckets  # SGLang's own leak-check buckets on the Rust core too
    assert (full.component, full.available, full.evictable) == ("full", m["sglang:kv_available_tokens"],
                                                                m["sglang:kv_evictable_tokens"])
    assert full.uncached == full.unaccounted == 0


def test_radixtop_stats_prints_unknown_not_zero(rust):
    server, client = rust
    env = {"RADIXTOP_URL": server.admin_url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "stats"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    nodes = client.stats().node_count  # the events' tree; the server is idle, nothing changes
    assert re.search(rf"(?m)(^| ){nodes:,} nodes", done.stdout), done.stdout
    assert "sessions open unknown" in done.stdout


def test_why_on_the_default_core_names_sglangs_evictions_and_radixtops_flush(rust):
    """Issue 29 on SGLang 0.5.23's defaults (the Rust core, radixtop beside the scheduler): the
    history of the blocks that leave the tree, kept from the core's KV events. A prompt the flood
    evicted is named as SGLang's eviction for room (a removal on the unified tree is one); one
    radixtop's flush took, as the flush (the probe tells its removals apart); ``then`` before the
    flood holds the tree as it was, tokens for tokens."""
    import time

    from radixtop.adapters.errors import Unsupported
    from radixtop.adapters.text import then_lines, why_lines

    server, client = rust
    prompt = fresh(200)
    if server.options["place"] != "beside the scheduler":  # (in SGLang's process: not yet, said in one line)
        with pytest.raises(Unsupported) as refused:
            client.why(prompt)
        assert "\n" not in str(refused.value)
        return
    server.generate(prompt, max_new_tokens=4)
    settle(server, client)
    assert client.match(prompt).matched_tokens >= len(prompt) - 1
    before, moment = client.node(0, 0, 1).node.subtree_tokens, time.time()
    flood(server)
    settle(server, client)
    w = client.why(prompt)
    assert w.lost_unit == "block" and w.cached_tokens < len(prompt)
    assert w.lost and {x.cause for x in w.lost} == {"evicted"}
    assert w.lost[0].start == w.cached_tokens and w.lost[-1].end >= len(prompt) - 1
    v = client.then(moment)
    assert (v.tokens_then, v.tokens_now) == (before, client.node(0, 0, 1).node.subtree_tokens)
    assert set(v.left_by_cause) == {"evicted"} and v.stored_tokens > 0 and v.unit == "block"
    from tests.support.then_walk import check_tree_then  # (the tree then block by block: GET /v1/then/children)

    then = check_tree_then(client, v)
    assert all(then[lost.node_id].left_cause == "evicted" for lost in w.lost if lost.at > v.at)
    assert any(i >= 1 << 63 for i in then)  # (a block's id past a signed int's: the route takes it)
    print(f"\nradixtop why <a prompt of {w.query_tokens} tokens, then a flood> (sglang 0.5.23, the Rust core):")
    print("\n".join(why_lines(w, time.time())))
    print("radixtop then <the moment before the flood>:")
    print("\n".join(then_lines(v, time.time(), shown=3)))
    last = fresh(60)
    server.generate(last, max_new_tokens=4)
    settle(server, client)
    client.flush()
    settle(server, client)
    gone = client.why(last)
    assert gone.cached_tokens == 0 and {(x.cause, x.who) for x in gone.lost} == {("flushed", "radixtop's flush")}


def test_each_request_sglang_gives_back_is_in_the_history_with_its_own_figures(rust):
    """Beside the Rust core, each request SGLang gives back (``on_release``) crosses in a
    ``SERVED`` frame: the history's journal holds its begin with SGLang's own figures (its reply's
    ``meta_info``: prompt tokens, cached tokens) and its prompt's token ids, and its finish with its
    output's, in order, /health's own not among them."""
    from radixtop.adapters.errors import Unsupported

    server, client = rust
    if server.options["place"] != "beside the scheduler":  # (in SGLang's process: no history there)
        with pytest.raises(Unsupported):
            client.history(0, 0, 1)
        return
    settle(server, client)
    before = client.history(0, 0, 1).served_count
    shared, sent = fresh(80), []
    for _ in range(3):
        prompt = shared + fresh(10)
        reply = server.generate(prompt, max_new_tokens=4)
        sent.append((prompt, reply["output_ids"], reply["meta_info"]["prompt_tokens"], reply["meta_info"]["cached_tokens"]))
    assert server.get("/health").status_code == 200
    settle(server, client)
    page = client.history(0, before)
    assert [(e.op, e.prompt_tokens, e.cached_tokens, list(e.tokens or ())) for e in page.served] == [
        step for prompt, output, n, hit in sent for step in (("begin", n, hit, prompt), ("finish", 0, 0, output))]
    assert sent[-1][3] > 0  # (the later ones hit the shared prefix)


def test_a_requests_begin_is_told_at_its_admission_on_the_rust_core(rust):
    """Two requests SGLang runs together on its default core: the probe tells each one's begin
    when SGLang admits it (a ``SERVED`` row of its own, with SGLang's own hit), so both begins come
    before either finish, each finish after its begin, as a replay of the journal then runs them;
    before, each was told whole when SGLang gave it back."""
    server, client = rust
    if server.options["place"] != "beside the scheduler":  # (in SGLang's process: no history there)
        return
    two_run_together(server, client)
