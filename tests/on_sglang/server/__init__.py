"""A real SGLang server for the tests: ``python -m sglang.launch_server`` on CPU, with radixtop's plugin.

SGLang's own HTTP server, TokenizerManager, scheduler and detokenizer processes, started from the
sglang installed in this interpreter's venv (0.5.16 in ``.venv``, 0.5.23 in ``.venv-sglang23``, both
set up by ``.ci/setup*``), over a tiny randomly initialised Llama (no weights: ``--load-format
dummy``; no tokenizer: requests carry ``input_ids``). Two stand-ins make it start without a GPU, in
every process it spawns (``boot/`` is on their PYTHONPATH): ``sitecustomize.py`` installs the
torchvision stand-in (PyPI's torchvision cannot load beside the CPU torch), and ``sgl_kernel/``
answers the few ``*_cpu`` ops SGLang imports at module level with functions that raise if called.

``launch()`` waits for SGLang's ``/health`` and the plugin's ``/healthz``; ``Server.stop()`` ends
the launcher with SIGTERM (it drains, then ends its children) and makes sure no process of its
group is left.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import REPO
from tests.support.server_process import metric_totals, stop_group, wait_healthy

BOOT = Path(__file__).resolve().parent / "boot"
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu", "tie_word_embeddings": False,
}
BYTES_PER_TOKEN = 2 * 2 * (16 + 16) * 2
"""2 layers x 2 KV heads x (head_dim 16 for K + 16 for V) x 2 bytes (bf16)."""
VOCAB = 1000
TOKEN = "radixtop-test-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                                "pad_token_id": 0}))
    return folder


def sglang_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class Server:
    """One running server: SGLang's HTTP API at ``url``, radixtop's plugin at ``admin_url``."""

    version: str
    url: str
    admin_url: str
    token: str
    proc: subprocess.Popen
    log_path: Path
    options: dict[str, Any] = field(default_factory=dict)
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60.0, trust_env=False))

    # ----- SGLang's own routes -----

    def generate(self, input_ids: list[int], max_new_tokens: int = 8, session_id: str | None = None,
                 **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"input_ids": input_ids,
                                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                    "ignore_eos": True}}
        if session_id is not None:
            body["session_id"] = session_id
        body.update(extra)
        reply = self.client.post(f"{self.url}/generate", json=body)
        reply.raise_for_status()
        return reply.json()

    def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return self.client.post(f"{self.url}{path}", json=body or {})

    def get(self, path: str) -> httpx.Response:
        return self.client.get(f"{self.url}{path}")

    def metrics(self) -> dict[str, float]:
        """SGLang's /metrics, each sample summed over its label sets (one scheduler here)."""
        return metric_totals(self.get("/metrics").text)

    # ----- radixtop's plugin -----

    def admin(self, path: str, method: str = "GET", **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return self.client.request(method, f"{self.admin_url}{path}", headers=headers, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to the launcher (it drains, then ends its children); then nothing of its group may be left."""
        self.client.close()
        stop_group(self.proc, f"SGLang {self.version}", timeout)


def launch(workdir: Path, *, sessions: bool = True, core: str | None = None, metrics: bool = True,
           sleep_on_idle: bool = False, max_total_tokens: int = 4096, extra_args: tuple[str, ...] = (),
           env: dict[str, str] | None = None, timeout: float = 300.0, admin: bool = True) -> Server:
    """Start a server from this venv's sglang and wait until SGLang and the plugin answer.

    ``sessions``: ``--enable-session-radix-cache`` (with ``--radix-eviction-policy priority``, which
    0.5.16 requires with it); ``core``: ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` on 0.5.23
    (``python`` or ``rust``; None keeps SGLang's default); ``admin`` false: SGLang's answer only
    (the plugin serves no admin API of its own: ``RADIXTOP_BESIDE=attach``)."""
    version = sglang_version()
    if version is None:
        raise RuntimeError("sglang is not installed in this venv (bash .ci/setup)")
    model = write_model(workdir / "tiny-llama")
    port, admin_port = free_port(), free_port()
    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "dummy",
            "--skip-tokenizer-init", "--device", "cpu", "--attention-backend", "torch_native",
            "--sampling-backend", "pytorch", "--disable-cuda-graph", "--grammar-backend", "none",
            "--disable-overlap-schedule", "--max-total-tokens", str(max_total_tokens),
            "--mem-fraction-static", "0.05", "--host", "127.0.0.1", "--port", str(port)]
    if sessions:
        args += ["--enable-session-radix-cache", "--radix-eviction-policy", "priority"]
    if metrics:
        args.append("--enable-metrics")
    if sleep_on_idle:
        args.append("--sleep-on-idle")
    args += list(extra_args)
    child_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(BOOT), str(REPO)]),
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_PLUGINS": "radixtop",
        "RADIXTOP_PORT": str(admin_port),
        "RADIXTOP_TOKEN": TOKEN,
        "RADIXTOP_TORCHVISION_STUB": "visible" if version.startswith("0.5.16") else "hidden",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    if core is not None:
        child_env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = core
    log_path = workdir / f"sglang-{version}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, cwd=workdir, env=child_env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(version, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", TOKEN, proc, log_path,
                    {"sessions": sessions, "core": core, "metrics": metrics, "sleep_on_idle": sleep_on_idle,
                     "max_total_tokens": max_total_tokens})
    try:
        wait_healthy(server.proc, server.client,
                     [f"{server.url}/health", *((f"{server.admin_url}/healthz",) if admin else ())], timeout)
    except BaseException:
        tail = server.log()[-4000:]
        server.stop()
        raise RuntimeError(f"SGLang {version} did not start (log {log_path}):\n{tail}") from None
    return server

