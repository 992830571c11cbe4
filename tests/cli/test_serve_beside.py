"""`radixtop serve` beside (issue 27, item 3; the embedded engine's default): the engine alone in
its process, the tree's copy, its figures and the admin API in radixtop's process beside it, fed by the engine's change
records through the mirror that follows SGLang's Python cores. Two real `radixtop serve` processes
load the same trace, one as before and one beside: every read answers the same, a close frees the
same, and a `kill -9` of the process beside leaves the engine serving and comes back whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.live_server import free_port
from tests.support.trace_gen import generate_trace

TOKEN = "beside-test-token-0123456789"


def start(trace: Path | None, *extra: str) -> tuple[subprocess.Popen, str]:
    """``radixtop serve`` of ``trace`` (None: the demo) until it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--port", str(port),
                             "--model", "tiny", "--capacity", "4096", "--device", "cpu",
                             *(() if trace is None else ("--trace", str(trace))), *extra],
                            env={**os.environ, "RADIXTOP_TOKEN": TOKEN},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    up(proc, url)
    return proc, url


def start_too(first: subprocess.Popen, trace: Path | None, *extra: str) -> tuple[subprocess.Popen, str]:
    """``start``, stopping ``first`` where it fails (the test's ``finally`` has not begun: a
    failed start left the first serve running after the test)."""
    try:
        return start(trace, *extra)
    except BaseException:
        stop(first)
        raise


def up(proc: subprocess.Popen, url: str, timeout: float = 60.0) -> None:
    """Until ``url`` answers its stats (the whole tree there, beside)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(f"{url}/v1/capabilities", timeout=2)
            if r.status_code == 200 and "receiving" not in r.json().get("reason", "") and \
                    httpx.get(f"{url}/v1/stats", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "radixtop serve did not come up"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def figures(url: str) -> dict:
    """What both places must agree on: the pool's totals, the tree's top, every session's row."""
    stats = httpx.get(f"{url}/v1/stats", timeout=10).json()
    keep = ("capacity_tokens", "available_tokens", "evictable_tokens", "protected_tokens", "uncached_tokens",
            "total_tokens", "node_count", "open_sessions", "closed_sessions", "prompt_tokens", "cached_tokens",
            "closes")
    children = httpx.get(f"{url}/v1/nodes/root/children", params={"limit": 200}, timeout=10).json()
    sessions = httpx.get(f"{url}/v1/sessions", params={"limit": 500, "order": "exclusive_bytes"}, timeout=10).json()
    rows = {s["id"]: {k: s[k] for k in ("exclusive_bytes", "shared_bytes", "fair_share_bytes", "locked_tokens",
                                          "tagged_nodes", "state")} for s in sessions["sessions"]}
    nodes = {c["id"]: (c["tokens"], c["subtree_tokens"], c["lock_ref"], c["hit_count"], tuple(sorted(c["holders"])))
             for c in children["children"]}
    return {"stats": {k: stats[k] for k in keep}, "nodes": nodes, "sessions": rows, "total": sessions["total"]}


def api_pid(url: str) -> set[int]:
    """The processes that hold ``url``'s listening socket (from /proc/net/tcp and their fds)."""
    port = int(url.rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                inodes.add(parts[9])
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes}:
                    pids.add(int(pid))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("beside") / "trace.jsonl"
    lines = generate_trace(5, n_ops=300, max_in_flight=4, vocab=400, abort_weight=3)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_beside_every_read_answers_as_the_engine_in_process_and_a_close_frees_the_same(trace):
    here, here_url = start(trace, "--in-process")
    there, there_url = start_too(here, trace, "--beside")
    try:
        (child,) = api_pid(there_url) - {there.pid}  # (the port bound by serve, served by the process beside)
        assert "radixtop.adapters.sglang.beside" in Path(f"/proc/{child}/cmdline").read_text()
        assert api_pid(here_url) == {here.pid}
        want = figures(here_url)
        assert want["sessions"] and want["nodes"]
        assert figures(there_url) == want
        top = next(sid for sid, row in want["sessions"].items() if row["state"] == "open" and row["exclusive_bytes"])
        auth = {"Authorization": f"Bearer {TOKEN}"}
        a = httpx.post(f"{here_url}/v1/sessions/{top}/close", headers=auth, timeout=10).json()
        b = httpx.post(f"{there_url}/v1/sessions/{top}/close", headers=auth, timeout=10).json()
        assert a["result"]["freed_tokens"] == b["result"]["freed_tokens"] == a["plan"]["freed_tokens"] > 0
        assert sorted(a["result"]["freed_node_ids"]) == sorted(b["result"]["freed_node_ids"])
        assert httpx.post(f"{there_url}/v1/sessions/{top}/close", timeout=10).status_code == 401
        up(there, there_url)
        assert figures(there_url) == figures(here_url)
    finally:
        stop(here)
        err = stop(there)
    assert there.returncode == 0, err
    assert "Traceback" not in err


def test_beside_under_the_deref_close_policy_every_read_and_a_close_answer_as_in_process(trace):
    """`serve --close-policy deref` (a close drops the session's references, frees nothing, as
    SGLang 0.5.23's does) beside its engine: the copy beside follows it, and says what the engine
    in process says: the same figures (no session's memory exclusive), the same close's plan."""
    here, here_url = start(trace, "--in-process", "--close-policy", "deref")
    there, there_url = start_too(here, trace, "--beside", "--close-policy", "deref")
    try:
        (child,) = api_pid(there_url) - {there.pid}
        want = figures(here_url)
        assert want["sessions"] and not any(row["exclusive_bytes"] for row in want["sessions"].values())
        assert figures(there_url) == want
        top = next(sid for sid, row in want["sessions"].items() if row["state"] == "open" and row["tagged_nodes"])
        auth = {"Authorization": f"Bearer {TOKEN}"}
        a = httpx.post(f"{here_url}/v1/sessions/{top}/close", headers=auth, timeout=10).json()
        b = httpx.post(f"{there_url}/v1/sessions/{top}/close", headers=auth, timeout=10).json()
        assert a["plan"]["policy"] == b["plan"]["policy"] == "deref"
        assert a["plan"] == b["plan"] and a["plan"]["released_holds"] > 0
        assert a["result"]["freed_tokens"] == b["result"]["freed_tokens"] == 0
        up(there, there_url)
        assert figures(there_url) == figures(here_url)
    finally:
        stop(here)
        err = stop(there)
    assert there.returncode == 0 and "Traceback" not in err, err


def test_a_kill_9_of_the_process_beside_leaves_the_engine_and_comes_back_whole(trace):
    here, here_url = start(trace, "--in-process")
    there, there_url = start_too(here, trace, "--beside")
    try:
        want = figures(here_url)
        (child,) = api_pid(there_url) - {there.pid}
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if api_pid(there_url) - {there.pid, child} and figures(there_url) == want:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert there.poll() is None, there.communicate()
            assert time.monotonic() < deadline, "radixtop's process beside the engine did not come back whole"
            time.sleep(0.3)
    finally:
        stop(here)
        err = stop(there)
    assert "started again" in err, err


def test_why_beside_names_an_evict_as_the_engine_in_process_does(trace):
    """Issue 29 beside the engine: its history is kept in radixtop's process, from the records
    (an evict the probe runs is bracketed as asked for). What left before radixtop's process took
    the whole tree is not known there, so only what the evict removed is compared."""
    import json

    here, here_url = start(trace, "--in-process")
    there, there_url = start_too(here, trace, "--beside")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        for url in (here_url, there_url):
            assert httpx.post(f"{url}/v1/evict", json={"tokens": 10**6}, headers=auth, timeout=10).status_code == 200
        prompts = [json.loads(line)["input"] for line in trace.read_text().splitlines() if '"input"' in line][:60]
        asked = 0
        for prompt in prompts:
            tokens = ",".join(map(str, prompt))
            a = httpx.get(f"{here_url}/v1/why", params={"tokens": tokens}, timeout=10).json()
            b = httpx.get(f"{there_url}/v1/why", params={"tokens": tokens}, timeout=10).json()
            assert (a["cached_tokens"], a["node_id"]) == (b["cached_tokens"], b["node_id"])
            pick = lambda w: [(x["start"], x["end"], x["node_id"], x["who"])  # noqa: E731
                              for x in w["lost"] if x["cause"] == "evict_action" and x["who"] == "radixtop's evict"]
            assert pick(a) == pick(b), prompt
            asked += bool(pick(a))
        assert asked > 10, asked
    finally:
        stop(here)
        stop(there)


@pytest.mark.parametrize(("args", "message"), [
    (["--fleet", "/nonexistent/fleet.txt"], "--fleet"),
    (["--kv-events", "tcp://127.0.0.1:9"], "--beside goes with the embedded engine"),
    (["--host", "0.0.0.0"], "without an explicit token"),
])
def test_what_beside_does_not_take_is_one_line_and_exit_2(args, message):
    env = {k: v for k, v in os.environ.items() if k != "RADIXTOP_TOKEN"}
    done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--beside", "--port",
                           str(free_port()), "--device", "cpu", "--capacity", "4096", *args],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("radixtop: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


def test_a_trace_applied_before_serving_is_in_the_history_of_what_serve_runs_by_default(trace):
    """`serve --trace` of a radixtop trace applies it at once, before it serves: the process beside
    (started after) would keep no history of it, so serve runs in one process there by default,
    and `why`, `then` and `--record` see the trace's removals and requests."""
    from radixtop.adapters.http.client import RadixtopClient

    proc, url = start(trace)
    try:
        assert api_pid(url) == {proc.pid}
        page = RadixtopClient(url, token=TOKEN, timeout=10).history(0, 0, 10)
        ops = sum(1 for line in trace.read_text().splitlines() if '"request"' in line or '"begin"' in line)
        assert page.removed_count > 0 and page.served_count >= ops > 0
    finally:
        stop(proc)


@pytest.mark.parametrize("where", ["beside", "in-process"])
def test_serve_with_a_fleet_runs_beside_and_its_process_beside_answers_the_fleet(tmp_path, where):
    """`serve --fleet` runs beside its engine too (its default): the fleet is watched, and
    /v1/fleet answered, by radixtop's process beside, never the engine's; each worker's row as
    in one process (one that refuses: reachable 0, with why)."""
    refused = f"http://127.0.0.1:{free_port()}"
    fleet = tmp_path / "fleet.txt"
    fleet.write_text(f"{refused}\n")
    proc, url = start(None, "--fleet", str(fleet), *(("--in-process",) if where == "in-process" else ()))
    try:
        if where == "in-process":
            assert api_pid(url) == {proc.pid}
        else:
            (child,) = api_pid(url) - {proc.pid}  # (the port bound by serve, served by the process beside)
        doc = httpx.get(f"{url}/v1/fleet", timeout=10).json()
        assert doc["workers"] == 1 and doc["reachable"] == 0, doc
        assert [row["worker"] for row in doc["rows"]] == [refused] and doc["rows"][0]["why"], doc
    finally:
        stop(proc)


def test_radixtop_attach_where_no_probe_waits_is_one_line(tmp_path):
    """`radixtop attach PATH` (a probe's socket: RADIXTOP_BESIDE=attach) where there is none, or a
    file that is not a socket, or a socket nobody listens at: one line each, nothing bound."""
    import socket

    plain = tmp_path / "plain"
    plain.write_text("")
    stale = tmp_path / "stale.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left.bind(str(stale))
    left.close()  # (a socket file a scheduler that died left)
    for path, code, message in ((tmp_path / "none.sock", 3, "no probe at"), (plain, 2, "is not a socket"),
                                (stale, 3, "cannot attach at")):
        done = subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", "attach", str(path), "--port",
                               str(free_port())], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "RADIXTOP_TOKEN": TOKEN})
        assert (done.returncode, done.stderr.count("\n")) == (code, 1), done.stderr
        assert done.stderr.startswith("radixtop: ") and message in done.stderr, done.stderr
