"""The commands against a real radixtop API server on loopback: output, --json, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.cli.main import app
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server

TOKEN = "cli-test-token"


@pytest.fixture(scope="module")
def server():
    """One server for the read-only checks of this module (reads never change the cache)."""
    engine = build_engine()
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        yield url
    engine.stop()


@pytest.fixture
def fresh_server():
    """A server of its own, for tests that act on the cache (its history's reach a millisecond
    before its first request: ``then`` at the reach holds nothing for sure)."""
    engine = build_engine(born_before_s=0.002)
    with running_server(create_app(BundledAdapter(engine), TOKEN, AuditLog(None))) as url:
        yield url
    engine.stop()


def run(url: str, *args: str, token: str | None = TOKEN, stdin: str | None = None):
    env = {"RADIXTOP_URL": url}
    if token is not None:
        env["RADIXTOP_TOKEN"] = token
    result = CliRunner().invoke(app, list(args), env=env, input=stdin)
    assert "Traceback" not in result.output
    return result


def one_json(result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_stats(server):
    result = run(server, "stats")
    assert result.exit_code == 0 and "evictable" in result.stdout and "KiB" in result.stdout
    doc = one_json(run(server, "stats", "--json"))
    states = ("available", "evictable", "protected", "session_held", "uncached")
    assert sum(doc[f"{s}_tokens"] for s in states) == doc["capacity_tokens"]
    assert all(s in result.stdout for s in states)  # the table names SGLang's leak-check states
    assert isinstance(doc["capacity_bytes"], int)


def test_tree(server):
    result = run(server, "tree")
    assert result.exit_code == 0 and "root" in result.stdout and "#1" in result.stdout
    doc = one_json(run(server, "tree", "--depth", "1", "--json"))
    assert doc["node"]["id"] == 0 and all(c["children"] == [] for c in doc["children"])
    assert all(c["more"] == c["node"]["num_children"] for c in doc["children"])
    big = one_json(run(server, "tree", "--min-bytes", "10000000", "--json"))
    assert big["children"] == [] and big["more"] == 3  # root children: the prompt, [40..43], the [50..] run
    only_b = one_json(run(server, "tree", "--session", "b", "--json"))
    assert len(only_b["children"]) == 1 and only_b["children"][0]["children"][0]["node"]["holders"] == ["b"]


def test_a_sessions_tree_is_read_at_one_moment_however_fast_the_tree_changes():
    """``tree --session`` reads its paths in one read (one hold of the owner): a tree in which
    every node a node-by-node walk reads has gone by the time it is read (the most a live cache
    can change) still gives the session's tree, never "kept changing"."""
    from radixtop.adapters.errors import UnknownNode
    from radixtop.cli.remote import _session_tree

    class Changing(BundledAdapter):
        def node(self, node_id, token_offset=0, token_limit=256):
            raise UnknownNode(f"node {node_id} is not in the tree (evicted since)")

    engine = build_engine()
    try:
        doc = _session_tree(Changing(engine), "b")
    finally:
        engine.stop()
    assert doc["node"].id == 0 and len(doc["children"]) == 1
    assert doc["children"][0]["children"][0]["node"].holders == ("b",)


def test_a_session_whose_nodes_all_went_before_their_paths_were_read_is_the_root_alone(server):
    """A session read, then every node it held evicted before its paths are read (a live cache):
    the root alone, never a KeyError; and a closed session (it holds nothing) likewise."""
    import dataclasses

    from radixtop.cli.remote import _session_tree

    class Gone(BundledAdapter):
        def session(self, session_id):
            detail = super().session(session_id)
            return dataclasses.replace(detail, node_ids=(424_242, 424_243))  # evicted since

    engine = build_engine()
    try:
        doc = _session_tree(Gone(engine), "b")
    finally:
        engine.stop()
    assert doc["node"].id == 0 and doc["children"] == []
    closed = one_json(run(server, "tree", "--session", "gone", "--json"))
    assert closed["node"]["id"] == 0 and closed["children"] == []


def test_node(server):
    doc = one_json(run(server, "node", "root", "--json"))
    assert doc["node"]["id"] == 0 and doc["sessions_beneath"] == 3
    assert "lock_ref" in run(server, "node", "1").stdout
    missing = run(server, "node", "424242")
    assert missing.exit_code == 1 and "424242" in missing.stderr and missing.stdout == ""
    assert run(server, "node", "x").exit_code == 2
    # ids as every view prints them
    hashed, plain = one_json(run(server, "node", "#1", "--json")), one_json(run(server, "node", "1", "--json"))
    assert hashed["node"]["id"] == plain["node"]["id"] == 1 and hashed["token_ids"] == plain["token_ids"]
    assert one_json(run(server, "tree", "#1", "--json"))["node"]["id"] == 1
    assert run(server, "node", "#x").exit_code == 2 and run(server, "node", "#-1").exit_code == 2


def test_sessions_and_session(server):
    result = run(server, "sessions")
    assert result.exit_code == 0 and "exclusive" in result.stdout
    doc = one_json(run(server, "sessions", "--sort", "id", "--limit", "2", "--json"))
    assert [s["id"] for s in doc["sessions"]] == ["a", "b"] and doc["total"] == 5
    assert run(server, "sessions", "--sort", "size").exit_code == 2
    # sorted and filtered over all sessions; the title says how many match and how old the figures are
    doc = one_json(run(server, "sessions", "--sort", "id", "--reverse", "--filter", "O", "--json"))
    assert [s["id"] for s in doc["sessions"]] == ["gone"] and doc["total"] == 1 and doc["all_sessions"] == 5
    page = one_json(run(server, "sessions", "--json"))
    assert page["figures_age_s"] == 0.0 and page["figures_current"]  # kept with the tree: as of the read
    text = run(server, "sessions", "--filter", "open", "--sort", "state").stdout
    assert "sessions 1-4 of 4 matching 'open' (5 in all) by state" in text
    assert "figures current" in text
    assert "no" not in run(server, "sessions", "--filter", "zzz").stderr
    assert "sessions none of 0 matching 'zzz'" in run(server, "sessions", "--filter", "zzz").stdout
    assert one_json(run(server, "session", "a", "--json"))["session"]["id"] == "a"
    unknown = run(server, "session", "nobody")
    assert unknown.exit_code == 1 and "nobody" in unknown.stderr


def test_match_export(server):
    doc = one_json(run(server, "match", "1,2,3,4", "5", "--json"))
    assert doc["matched_tokens"] == 5
    assert "5 of 5 tokens cached" in run(server, "match", "1", "2", "3", "4", "5").stdout
    assert run(server, "match", "1,x").exit_code == 2
    rows = [json.loads(line) for line in run(server, "export").stdout.splitlines()]
    assert rows[0]["node_count"] == len(rows) - 1


def test_why_names_the_close_that_freed_a_prompt_and_what_is_cached(server):
    """``why`` (issue 29): session "gone" was closed after its request ([30, 31] and [32]): the
    prompt is not cached, and every token of it left with that close."""
    doc = one_json(run(server, "why", "30,31,32", "--json"))
    assert (doc["query_tokens"], doc["cached_tokens"], doc["diverges_at"], doc["node_id"]) == (3, 0, 0, 0)
    assert [(x["start"], x["end"], x["cause"], x["session_id"]) for x in doc["lost"]] == [(0, 3, "closed", "gone")]
    out = run(server, "why", "30", "31", "32").stdout
    assert "0 of 3 tokens cached; the prompt leaves the cached path at token 0" in out
    assert "tokens 0-3 (3): node #" in out and "freed by the close of session gone at" in out
    out = run(server, "why", "1", "2", "3", "4", "5", "99").stdout  # cached up to 5; 99 never was
    assert "5 of 6 tokens cached; the prompt leaves the cached path at token 5" in out
    assert "none of the rest was cached since" in out
    assert run(server, "why", "1", "2", "3").stdout.strip() == "3 of 3 tokens cached"
    assert run(server, "why").exit_code == 2 and run(server, "why", "1", "--text", "a").exit_code == 2


def test_why_names_an_evict_someone_asked_for(fresh_server):
    assert run(fresh_server, "evict", "1000", "--yes").exit_code == 0
    doc = one_json(run(fresh_server, "why", "40,41,42,43", "--json"))
    assert doc["cached_tokens"] == 0
    assert {(x["cause"], x["who"]) for x in doc["lost"]} == {("evict_action", "radixtop's evict")}
    assert doc["lost"][0]["start"] == 0 and doc["lost"][-1]["end"] == 4


def test_why_for_a_session_tells_its_hits_and_what_it_lost(server):
    """``why --session`` (issue 29): session "a" ran two turns, the second hitting the first's 8
    tokens; "gone" lost its 3 tokens to its own close; an unknown session is one line, exit 1."""
    doc = one_json(run(server, "why", "--session", "a", "--json"))
    assert [(r["prompt_tokens"], r["cached_tokens"]) for r in doc["requests"]] == [(6, 0), (9, 8)]
    assert (doc["requests_kept"], doc["prompt_tokens"], doc["cached_tokens"]) == (2, 15, 8)
    assert doc["lost"] == [] and doc["lost_tokens"] == {}
    out = run(server, "why", "--session", "a").stdout
    assert "session a: 2 requests since" in out and "8 of 15 prompt tokens cached (53%)" in out
    assert "nothing it held left the tree since" in out
    gone = one_json(run(server, "why", "--session", "gone", "--json"))
    assert gone["lost_tokens"] == {"closed": 3}
    assert [(x["cause"], x["session_id"], x["tokens"]) for x in gone["lost"]] == [("closed", "gone", 3)]
    assert "3 tokens (node #" in run(server, "why", "--session", "gone").stdout
    unknown = run(server, "why", "--session", "nobody")
    assert unknown.exit_code == 1 and "'nobody' is not known" in unknown.stderr
    assert run(server, "why", "1", "--session", "a").exit_code == 2


def test_then_tells_the_tree_at_a_moment_from_what_left_since(fresh_server):
    """``then`` (issue 29's time travel) against a real API server: a moment before a close and an
    evict is the tree then, tokens for tokens (the stats read then); what left since is told by
    cause; a moment before the history's reach, or not a moment, is one line, exit 2."""
    import time

    before = one_json(run(fresh_server, "stats", "--json"))
    time.sleep(1.02 - time.time() % 1)  # (a second of its own: HH:MM:SS names a moment after the engine's ops)
    at = int(time.time())
    moment = time.strftime("%H:%M:%S", time.localtime(at))
    closed = one_json(run(fresh_server, "close", "b", "--yes", "--json"))["results"][0]["freed_tokens"]
    evicted = one_json(run(fresh_server, "evict", "2", "--yes", "--json"))["evicted_tokens"]
    after = one_json(run(fresh_server, "stats", "--json"))
    doc = one_json(run(fresh_server, "then", moment, "--json"))
    assert doc["at"] == at and doc["unit"] == "node"
    assert (doc["tokens_then"], doc["tokens_now"]) == (before["total_tokens"], after["total_tokens"])
    assert doc["left_by_cause"] == {"closed": closed, "evict_action": evicted} and closed == 3
    assert doc["stored_tokens"] == 0 and doc["stored"] == []
    assert sum(b["tokens"] for b in doc["left"]) == doc["left_tokens"] == closed + evicted
    # the sessions then: b open (its close came after), "gone" closed; what b held left since
    sessions = {x["session_id"]: x for x in doc["sessions"]}
    assert doc["sessions_active"] == len(sessions) == 5 and doc["sessions_open"] == 4
    assert (sessions["b"]["state"], sessions["b"]["requests"], sessions["b"]["prompt_tokens"]) == ("open", 1, 5)
    assert sessions["b"]["lost_since_tokens"] >= closed and sessions["gone"]["state"] == "closed"
    assert sessions["a"]["requests"] == 2  # (its first turn was the engine's first request: its hits are its second's)
    assert sessions["a"]["cached_tokens"] == sessions["a"]["last_cached_tokens"] > 0
    out = run(fresh_server, "then", moment).stdout
    assert f"the tree at {moment}" in out and f"{before['total_tokens']:,} tokens cached" in out
    assert "freed by closes" in out and "evicted on request" in out
    assert "sessions then: 5 active since" in out and "(4 open)" in out
    later = {x["session_id"]: x for x in one_json(run(fresh_server, "then", "0s", "--json"))["sessions"]}
    assert later["b"]["state"] == "closed"
    first = one_json(run(fresh_server, "then", "--json"))  # (none asked: as far back as the history reaches)
    assert first["at"] == first["history_since"] and first["tokens_then"] == 0  # (before the engine's first op)
    early = run(fresh_server, "then", "2h")
    assert early.exit_code == 2 and "reaches back to" in early.stderr and len(early.stderr.splitlines()) == 1
    assert run(fresh_server, "then", "soon").exit_code == 2
    assert run(fresh_server, "then", "25:00").exit_code == 2


def test_diff_of_two_moments_of_the_targets_own_history(fresh_server):
    """``diff`` of a moment of the target's history (not a recording) to now, against a real API
    server: the tokens cached then (the stats read then) and now; the sessions' exclusive memory
    then (the sessions page read then) and now: b's close took its own; what left in between by
    cause and by session, from the journal; a moment not one, or before the history's reach, is
    one line, exit 2."""
    import time

    before = one_json(run(fresh_server, "stats", "--json"))
    held = {v["id"]: v["exclusive_bytes"] for v in one_json(run(fresh_server, "sessions", "--json"))["sessions"]}
    time.sleep(1.02 - time.time() % 1)
    moment = time.strftime("%H:%M:%S", time.localtime(int(time.time())))
    closed = one_json(run(fresh_server, "close", "b", "--yes", "--json"))["results"][0]["freed_tokens"]
    evicted = one_json(run(fresh_server, "evict", "2", "--yes", "--json"))["evicted_tokens"]
    after = one_json(run(fresh_server, "stats", "--json"))
    now = {v["id"]: v["exclusive_bytes"] for v in one_json(run(fresh_server, "sessions", "--json"))["sessions"]}
    doc = one_json(run(fresh_server, "diff", moment, "--json"))
    assert doc["figures"] == {"cached_tokens": {"from": before["total_tokens"], "to": after["total_tokens"],
                                                "change": after["total_tokens"] - before["total_tokens"]}}
    assert {c: v["tokens"] for c, v in doc["left"]["by_cause"].items()} == {"closed": closed, "evict_action": evicted}
    assert doc["left"]["tokens"] == closed + evicted and closed == 3
    mine = {row["id"]: row for row in doc["left"]["by_session"]}
    assert mine["b"]["by_cause"]["closed"] == closed
    held_then = {sid: b for sid, b in held.items() if b}
    grew = {row["id"]: row["exclusive_bytes_change"] for row in doc["sessions"]["grew"]}
    for sid, change in grew.items():  # (among the largest at both moments)
        assert change == now.get(sid, 0) - held_then[sid], sid
    assert held_then["b"] > 0 and "b" in doc["sessions"]["gone"] and now.get("b", 0) == 0
    out = run(fresh_server, "diff", moment).stdout
    assert f"from {moment} to" in out and "cached_tokens: " in out
    assert "left the tree: " in out and "freed by closes" in out and "evicted on request" in out
    assert "session b: 3 tokens (3 freed by closes)" in out
    early = run(fresh_server, "diff", "2h")  # (before the history's reach)
    assert early.exit_code == 2 and "reaches back to" in early.stderr and len(early.stderr.splitlines()) == 1
    later = run(fresh_server, "diff", moment, "soon")
    assert later.exit_code == 2 and "B is not a moment" in later.stderr and len(later.stderr.splitlines()) == 1
    none = run(fresh_server, "diff", "soon")  # (neither a moment nor a file: a recording that is not there)
    assert none.exit_code == 1 and "cannot read soon" in none.stderr


def test_tree_at_a_moment_is_the_tree_then_node_by_node(fresh_server, monkeypatch):
    """``tree --at`` (the tree then, a page of children a node, over ``GET /v1/then/children``)
    against a real API server: before a close and an evict, the tree then holds every token the
    stats counted then; the nodes that left since say why (the close of b, the evict asked); the
    tree now's own nodes are there with their figures then; a moment not one is one line, exit 2."""
    import time

    before = one_json(run(fresh_server, "stats", "--json"))
    live = one_json(run(fresh_server, "tree", "--json", "--depth", "64", "--limit", "1000"))
    time.sleep(1.02 - time.time() % 1)
    moment = time.strftime("%H:%M:%S", time.localtime(int(time.time())))
    closed = one_json(run(fresh_server, "close", "b", "--yes", "--json"))["results"][0]["freed_tokens"]
    evicted = one_json(run(fresh_server, "evict", "2", "--yes", "--json"))["evicted_tokens"]
    doc = one_json(run(fresh_server, "tree", "--at", moment, "--json", "--depth", "64", "--limit", "1000"))
    assert doc["subtree_tokens"] == before["total_tokens"] and doc["more"] == 0

    def nodes(d):
        for c in d["children"]:
            yield c["node"]
            yield from nodes(c)

    then = {n["id"]: n for n in nodes(doc)}
    assert sum(n["tokens"] for n in then.values()) == before["total_tokens"]
    left = [n for n in then.values() if n["left_at"] is not None]
    by_cause: dict[str, int] = {}
    for n in left:
        by_cause[n["left_cause"]] = by_cause.get(n["left_cause"], 0) + n["tokens"]
    assert by_cause == {"closed": closed, "evict_action": evicted} and closed == 3
    assert {n["left_by"] for n in left if n["left_cause"] == "closed"} == {"b"}
    was = {n["id"]: n for n in nodes(live)}
    assert then.keys() == was.keys()  # (nothing stored since: the tree then is the tree read before)
    for node_id, n in then.items():
        assert (n["tokens"], n["subtree_tokens"], n["num_children"]) == \
            (was[node_id]["tokens"], was[node_id]["subtree_tokens"], was[node_id]["num_children"]), node_id
        assert n["holders"] is None if n["left_at"] is None else set(n["holders"]) <= set(was[node_id]["holders"])
    monkeypatch.setenv("COLUMNS", "200")  # (a line a node)
    out = run(fresh_server, "tree", "--at", moment, "--depth", "64").stdout
    assert f"root at {moment}" in out and f"{before['total_tokens']:,} tokens below then" in out
    assert "freed by the close of session b" in out and "evicted on request" in out
    bad = run(fresh_server, "tree", "--at", "soon")
    assert bad.exit_code == 2 and len(bad.stderr.splitlines()) == 1
    unknown = run(fresh_server, "tree", "999999", "--at", moment)
    assert unknown.exit_code != 0 and len(unknown.stderr.splitlines()) == 1


def test_export_columns_to_a_file(server, tmp_path):
    from radixtop.adapters.http.wire import decode_export_columns

    path = tmp_path / "tree.cols"
    assert run(server, "export", "--format", "columns", "-o", str(path)).exit_code == 0
    columns = decode_export_columns(path.read_bytes())
    rows = [json.loads(line) for line in run(server, "export").stdout.splitlines()][1:]
    assert list(columns.columns["parent"]) == [r["parent"] for r in rows]
    assert run(server, "export", "--format", "columns").exit_code == 2  # binary needs a file
    assert run(server, "export", "--format", "xml").exit_code == 2


def test_close_dry_run_then_confirmed(fresh_server):
    before = one_json(run(fresh_server, "stats", "--json"))
    dry = run(fresh_server, "close", "b", "--dry-run")
    assert dry.exit_code == 0 and "close plan" in dry.stdout
    assert one_json(run(fresh_server, "stats", "--json"))["version"] == before["version"]
    refused = run(fresh_server, "close", "b")  # no terminal to ask on, no --yes
    assert refused.exit_code == 1 and "--yes" in refused.stderr
    declined = run(fresh_server, "close", "b", stdin="n\n")
    assert declined.exit_code == 1
    done = one_json(run(fresh_server, "close", "b", "--yes", "--json"))
    assert done["results"][0]["freed_tokens"] == done["plans"][0]["freed_tokens"] == 3
    again = run(fresh_server, "close", "b", "--yes")
    assert again.exit_code == 0 and "already closed" in again.stdout
    unknown = run(fresh_server, "close", "nobody", "--yes")
    assert unknown.exit_code == 1 and "nobody" in unknown.stderr


def test_evict_flush_audit(fresh_server):
    doc = one_json(run(fresh_server, "evict", "1", "--yes", "--json"))
    assert doc["evicted_tokens"] >= 1
    assert "flushed" in run(fresh_server, "flush", "--yes").stdout
    entries = one_json(run(fresh_server, "audit", "--json"))
    assert [e["action"] for e in entries][:2] == ["flush", "evict"]
    assert "flush" in run(fresh_server, "audit").stdout


def test_wrong_token_and_read_only_are_refused(fresh_server):
    bad = run(fresh_server, "evict", "5", "--yes", token="wrong")
    assert bad.exit_code == 1 and bad.stderr.count("\n") == 1
    engine = build_engine()
    with running_server(create_app(BundledAdapter(engine, read_only=True), TOKEN, AuditLog(None))) as url:
        refused = run(url, "flush", "--yes")
        assert refused.exit_code == 1 and "read-only" in refused.stderr
    engine.stop()


def test_unreachable_target_exits_3_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    result = run(url, "stats")
    assert result.exit_code == 3 and url in result.stderr and result.stderr.count("\n") == 1


def run_in_a_terminal(url: str, args: list[str], answer: str, token: str | None = TOKEN) -> tuple[int, str]:
    """`radixtop ARGS` with a terminal as stdin (its questions need one), answering ``answer``."""
    import os
    import pty
    import subprocess
    import sys

    main, child = pty.openpty()
    env = {**os.environ, "RADIXTOP_URL": url}
    env.pop("RADIXTOP_TOKEN", None)
    if token is not None:
        env["RADIXTOP_TOKEN"] = token
    proc = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", *args], stdin=child,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    os.close(child)
    os.write(main, (answer + "\n").encode())
    out, _ = proc.communicate(timeout=60)
    os.close(main)
    return proc.returncode, out


def test_dry_runs_need_no_token_and_change_nothing(fresh_server):
    before = one_json(run(fresh_server, "stats", "--json"))
    plan = run(fresh_server, "close", "b", "--dry-run", token=None)  # a dry run is a read
    assert plan.exit_code == 0 and "close plan" in plan.stdout, plan.output
    evict = one_json(run(fresh_server, "evict", "5", "--dry-run", "--json", token=None))
    assert evict["dry_run"] and evict["would_evict_at_least_tokens"] == 5
    assert "would evict at least 5 tokens" in run(fresh_server, "evict", "5", "--dry-run", token=None).stdout
    flush = one_json(run(fresh_server, "flush", "--dry-run", "--json", token=None))
    assert flush["would_free_tokens"] == before["evictable_tokens"]
    after = one_json(run(fresh_server, "stats", "--json"))
    assert after["version"] == before["version"] and after["evicted_tokens"] == before["evicted_tokens"]
    # an action without the token says what to do, not which HTTP header was missing
    refused = run(fresh_server, "evict", "5", "--yes", token=None)
    assert refused.exit_code == 1 and "set RADIXTOP_TOKEN" in refused.stderr and "header" not in refused.stderr


def test_large_evicts_flush_and_bulk_closes_need_the_value_typed_as_in_the_dashboard(fresh_server):
    capacity = one_json(run(fresh_server, "stats", "--json"))["capacity_tokens"]
    large = str(capacity // 5)  # 20% of the capacity: large
    code, out = run_in_a_terminal(fresh_server, ["evict", large], "y")  # a plain y is not enough
    assert code == 1 and f"Type {large} to confirm" in out and "cancelled" in out
    code, out = run_in_a_terminal(fresh_server, ["evict", large], large)
    assert code == 0 and "evicted" in out, out
    code, out = run_in_a_terminal(fresh_server, ["evict", "1"], "y")  # small: y/N
    assert code == 0 and "Type" not in out and "evicted" in out, out
    code, out = run_in_a_terminal(fresh_server, ["flush"], "y")
    assert code == 1 and "Type flush to confirm" in out
    code, out = run_in_a_terminal(fresh_server, ["close", "a", "c"], "y")
    assert code == 1 and "Type 2 to confirm" in out
    code, out = run_in_a_terminal(fresh_server, ["close", "a", "c"], "2")
    assert code == 0 and "closed a" in out and "closed c" in out, out


def test_a_time_of_day_still_to_come_is_yesterdays_across_a_clock_change(monkeypatch):
    """``then 14:00`` at 01:30 is yesterday's 14:00 on the clock, also on a day whose clocks
    change (23 or 25 hours long); a time that is not one is one line (exit 2, above)."""
    import time

    from radixtop.cli.remote import parse_moment

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        for day in ((2024, 3, 10, 1, 30, 0), (2024, 11, 3, 0, 30, 0)):
            now = time.mktime((*day, 0, 0, -1))
            at = time.localtime(parse_moment("14:00", now))
            assert (at.tm_mday, at.tm_hour, at.tm_min) == (day[2] - 1, 14, 0), day
        assert parse_moment("90s", 1000.0) == 910.0
        for bad in ("+5:00", "3:00:00:00", "14:60", "14:-1"):
            with pytest.raises(ValueError):
                parse_moment(bad, 1000.0)
    finally:
        monkeypatch.undo()
        time.tzset()
