"""``radixtop serve --read-only`` over a server's own routes: the adapter refuses every action
itself, before any request reaches the server (``serve`` sets ``read_only`` on the adapter it opened)."""

from __future__ import annotations

import pytest

from radixtop.adapters.errors import ReadOnly
from radixtop.adapters.sglang.routes import SGLangRoutesAdapter
from radixtop.adapters.vllm.adapter import VLLMAdapter
from tests.support.live_server import free_port


def test_a_read_only_sglang_routes_target_refuses_close_and_flush_without_asking_sglang():
    adapter = SGLangRoutesAdapter(f"http://127.0.0.1:{free_port()}", timeout=0.5)  # nothing listens there
    adapter.read_only = True
    try:
        with pytest.raises(ReadOnly, match="flush refused"):
            adapter.flush()
        with pytest.raises(ReadOnly, match="close of session 's' refused"):
            adapter.close_session("s")
    finally:
        adapter.release()


def test_a_read_only_vllm_target_refuses_flush():
    adapter = VLLMAdapter(f"tcp://127.0.0.1:{free_port()}")
    adapter.read_only = True
    try:
        with pytest.raises(ReadOnly, match="flush refused"):
            adapter.flush()
        assert not adapter.capabilities().flush and adapter.capabilities().read_only
    finally:
        adapter.release()
