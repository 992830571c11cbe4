"""The real vLLM server, one per test module that asks for it (``vllm``): launching one costs
30-60 s here. Without ``.venv-vllm`` (``bash .ci/setup-vllm``) the tests fail and say so."""

from __future__ import annotations

import pytest

from tests.on_vllm.server import available, launch


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    why = available()
    if why:
        pytest.fail(why)
    server = launch(tmp_path_factory.mktemp("vllm"), blocks=40)
    try:
        yield server
    finally:
        server.stop()
