"""`radixtop attach` (issue 27): a real SGLang server started with the plugin as a probe only
(``RADIXTOP_BESIDE=attach``: no radixtop process of the plugin's, no admin API bound by it), and
radixtop's process started by hand beside it, after SGLang already served: it gets the whole tree,
every figure equal to SGLang's own; a ``kill -9`` of it leaves SGLang serving every request, and
the next `radixtop attach` gets the tree whole again. One at a time; another is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixtop.adapters.http.client import RadixtopClient
from tests.on_sglang.server import Server, free_port, launch
from tests.on_sglang.test_real_server import chat, fresh, kill_under_load, settle


def launch_for_attach(tmp_path_factory, sessions: bool) -> Server:
    """A server whose plugin is the probe only (``RADIXTOP_BESIDE=attach``), in a runtime directory
    of its own; ``options["point"]``: where its probe waits."""
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    srv = launch(tmp_path_factory.mktemp("sglang"), sessions=sessions, sleep_on_idle=True, admin=False,
                 env={"RADIXTOP_BESIDE": "attach", "XDG_RUNTIME_DIR": str(runtime)})
    srv.options["point"] = runtime / "radixtop" / f"probe-{srv.admin_url.rsplit(':', 1)[1]}.sock"
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = launch_for_attach(tmp_path_factory, sessions=True)
    yield srv
    srv.stop()


def attach(server, *extra: str) -> subprocess.Popen:
    port = server.admin_url.rsplit(":", 1)[1]
    return subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "attach", str(server.options["point"]),
                             "--port", port, *extra], env={**os.environ, "RADIXTOP_TOKEN": server.token},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def whole(proc: subprocess.Popen, client: RadixtopClient, timeout: float = 60.0) -> None:
    """Until the attached process answers with the whole tree."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            reason = client.capabilities().reason
            if "receiving" not in reason and "incomplete" not in reason:
                return
        except Exception:
            pass
        assert time.monotonic() < deadline, "radixtop attach did not get the whole tree"
        time.sleep(0.2)


def equal_to_sglangs(server, client) -> None:
    settle(server, client)
    st, m = client.stats(), server.metrics()
    assert st.evictable_tokens == m["sglang:kv_evictable_tokens"] > 0
    assert client.node(0, 0, 1).node.subtree_tokens == m["sglang:kv_evictable_tokens"] + st.protected_tokens
    assert (st.prompt_tokens, st.cached_tokens) == (m["sglang:prompt_tokens_total"], m["sglang:cached_tokens_total"])


def killed_under_load(server, proc: subprocess.Popen) -> None:
    """``kill -9`` of the attached ``proc`` while SGLang serves (it answers every request), until
    the probe says it left."""
    kill_under_load(server, proc.pid, 24)
    proc.communicate()
    deadline = time.monotonic() + 30
    while "attached to this scheduler (pid %d) left" % proc.pid not in server.log():
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.2)


def group_cmdlines(pgid: int) -> list[bytes]:
    """The command lines of the processes of group ``pgid`` (SGLang's: its launcher's session)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) == pgid:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    return found


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


def test_radixtop_attach_gets_a_running_servers_tree_and_comes_and_goes_without_harm_to_it(server):
    point: Path = server.options["point"]
    assert oct(point.stat().st_mode & 0o777) == "0o600", point.stat()
    assert "radixtop attach" in server.log() and not any(  # (no process of the plugin's in SGLang's group)
        b"radixtop.adapters.sglang.beside" in cmdline for cmdline in group_cmdlines(server.proc.pid))
    history = chat(server, sessions=3, turns=2)  # (SGLang served before anyone attached)
    first = attach(server)
    client = RadixtopClient(server.admin_url, token=server.token, timeout=30)
    try:
        whole(first, client)
        equal_to_sglangs(server, client)
        held = {row.id: row.shared_bytes + row.exclusive_bytes for row in client.sessions("id", 0, 100).sessions
                if row.id in history}
        assert len(held) == 3 and all(held.values())

        second = attach(server, "--port", str(free_port()))  # (one at a time: refused, the first goes on)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1 and "Traceback" not in err and "attached to this scheduler already" in err, err
        print(f"a second radixtop attach: {err.strip().splitlines()[-1]}")
        assert "refused a radixtop attach (pid %d)" % second.pid in server.log()
        assert client.stats().node_count > 0

        killed_under_load(server, first)
        assert server.generate(fresh(20), max_new_tokens=4)  # (nobody attached: SGLang serves on)

        third = attach(server)
        try:
            whole(third, client)
            equal_to_sglangs(server, client)
            after = {row.id: row.shared_bytes + row.exclusive_bytes for row in client.sessions("id", 0, 100).sessions
                     if row.id in history}
            assert after == held
        finally:
            err = stop(third)
        assert "Traceback" not in err, err
    finally:
        client.release()
        if first.poll() is None:
            stop(first)
