"""A vLLM server radixtop should not believe everything of: a stand-in answering vLLM's routes
(FastAPI + uvicorn), since a real vLLM says only true things. Its model folder (``/v1/models``'
``root``) is read only from a server on this machine's loopback, and its model's name is kept
short and on one line."""

from __future__ import annotations

import json
import socket

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from radixtop.adapters.vllm.adapter import VLLMAdapter
from tests.on_vllm.server import MODEL_CONFIG
from tests.support.live_server import free_port, running_server

METRICS = ('vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0",num_gpu_blocks="40"} 1.0\n'
           'vllm:kv_cache_usage_perc{engine="0"} 0.0\n')


def stand_in(root: str, model_id: str) -> FastAPI:
    app = FastAPI()
    app.get("/metrics", response_class=PlainTextResponse)(lambda: METRICS)
    app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": model_id, "root": root}]})
    return app


def own_address() -> str:
    """This machine's address on its network (not loopback): the interface a route out would take
    (a UDP socket connects without sending anything)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
        except OSError as exc:
            pytest.fail(f"this machine has no network address besides loopback: {exc}")
        return s.getsockname()[0]


def test_a_model_folder_is_read_only_from_a_server_on_loopback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    address = own_address()
    with running_server(stand_in(str(tmp_path), "tiny"), host="0.0.0.0") as url:
        port = url.rsplit(":", 1)[1]
        near = VLLMAdapter(f"tcp://127.0.0.1:{free_port()}", "", url=f"http://127.0.0.1:{port}")
        far = VLLMAdapter(f"tcp://127.0.0.1:{free_port()}", "", url=f"http://{address}:{port}")  # this host, not loopback
        try:
            assert near.bytes_per_token == 512
            assert far.bytes_per_token == 0 and "give --model" in far.capabilities().reason
        finally:
            near.release()
            far.release()


def test_a_model_name_is_one_short_line(tmp_path):
    with running_server(stand_in(str(tmp_path), "\x1b[31mevil\nname" + "x" * 5000)) as url:
        adapter = VLLMAdapter(f"tcp://127.0.0.1:{free_port()}", "", url=url)
        try:
            assert "\x1b" not in adapter.name and "\n" not in adapter.name and len(adapter.name) < 200
        finally:
            adapter.release()
