"""`radixtop attach` on SGLang 0.5.23's default Rust tree core (issue 27): the plugin as a probe
only (``RADIXTOP_BESIDE=attach``); radixtop's process started by hand gets the core's KV events
from then on, and says what it cannot know (the events before it, SGLang's warm-up's included: the
Rust core keeps no tree to send again), never a tree that looks whole, until a flush makes it
whole; a ``kill -9`` of it leaves SGLang serving, and the next one says so again."""

from __future__ import annotations

import time

import pytest

from radixtop.adapters.http.client import RadixtopClient
from tests.on_sglang.test_attach import attach, killed_under_load, launch_for_attach, stop, whole
from tests.on_sglang.test_real_server import fresh, settle


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = launch_for_attach(tmp_path_factory, sessions=False)  # (no sessions: SGLang's default, the Rust core)
    yield srv
    srv.stop()


def reason_of(proc, client: RadixtopClient) -> str:
    """The attached process's capabilities' reason, once it answers."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.capabilities().reason
        except Exception:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)


def test_radixtop_attach_follows_the_rust_cores_events_and_says_what_it_missed(server):
    first = attach(server)
    client = RadixtopClient(server.admin_url, token=server.token, timeout=30)
    try:
        assert "incomplete" in reason_of(first, client)  # (SGLang's warm-up stored blocks before it)
        client.flush()
        whole(first, client)
        for _ in range(4):
            server.generate(fresh(64), max_new_tokens=4)
        settle(server, client)
        m = server.metrics()
        assert client.node(0, 0, 1).node.subtree_tokens == m["sglang:kv_evictable_tokens"] > 0
        assert "incomplete" not in client.capabilities().reason

        killed_under_load(server, first)
        server.generate(fresh(64), max_new_tokens=4)  # (its events: nobody's tree has them)

        second = attach(server)
        try:
            assert "incomplete" in reason_of(second, client)
        finally:
            err = stop(second)
        assert "Traceback" not in err, err
    finally:
        client.release()
        if first.poll() is None:
            stop(first)
