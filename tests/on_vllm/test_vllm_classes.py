"""What one small vLLM server cannot show, through vLLM's own publisher (``ZmqEventPublisher``) and
event classes, run in ``.venv-vllm``: a DP rank's stream at its port offset, and a hybrid model's
KV groups (full attention beside sliding window) kept apart."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from radixtop.adapters.vllm.adapter import VLLMAdapter
from tests.on_vllm.server import PYTHON, available
from tests.support import REPO
from tests.support.live_server import free_ports

pytestmark = pytest.mark.timeout(120)
SCRIPT = REPO / "tests" / "on_vllm" / "publish.py"


def stored(hashes, parent, tokens, group=0, kind="full_attention", session=None, extra=None):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None,
            "extra_keys": extra or [None] * len(hashes), "group_idx": group, "kv_cache_spec_kind": kind,
            "session_id": session}


@contextmanager
def publishing(rank: int) -> Iterator[tuple[subprocess.Popen, VLLMAdapter, int]]:
    """vLLM's publisher for ``rank`` of a server configured at ports ``base`` (events) and
    ``base + 8`` (replay), which vLLM binds at + rank; radixtop's adapter of that rank; ``base``."""
    why = available()
    if why:
        pytest.fail(why)
    base = free_ports(10)
    proc = subprocess.Popen([str(PYTHON), str(SCRIPT), str(rank), f"tcp://*:{base}", f"tcp://*:{base + 8}", "kv"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        adapter = VLLMAdapter(f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 8}", dp_rank=rank)
        try:
            yield proc, adapter, base
        finally:
            adapter.release()
    finally:
        proc.stdin.close()
        proc.wait(20)


def send(proc: subprocess.Popen, batches: list[list[dict]]) -> None:
    proc.stdin.write(json.dumps(batches) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "sent"


def caught_up(adapter: VLLMAdapter, seq: int) -> None:
    assert adapter.wait_for_seq(seq, timeout=20), adapter.status()


def test_a_dp_ranks_stream_at_its_port_offset_with_its_replay():
    with publishing(1) as (proc, adapter, base):
        assert adapter.endpoint.endswith(f":{base + 1}") and adapter.replay_endpoint.endswith(f":{base + 9}")
        send(proc, [[stored([11, 12], None, [1, 2, 3, 4, 5, 6, 7, 8], session="r1")],
                    [stored([13], 12, [9, 10, 11, 12], session="r1")]])
        caught_up(adapter, 1)
        st = adapter.status()
        assert st.batch_rank == 1 and st.complete  # the batches say their rank
        (node,) = adapter.children(0).children
        assert node.tokens == 12 and node.holders == ("r1",)


def test_a_hybrid_models_kv_groups_are_kept_apart():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    with publishing(0) as (proc, adapter, _):  # the same tokens and hashes in both groups: two trees, one per group
        send(proc, [[stored([21, 22], None, tokens, group=0),
                     stored([21, 22], None, tokens, group=1, kind="sliding_window")],
                    [{"type": "BlockRemoved", "block_hashes": [22], "medium": "GPU", "group_idx": 1}]])
        caught_up(adapter, 1)
        nodes = sorted(adapter.children(0).children, key=lambda n: -n.tokens)
        assert [n.tokens for n in nodes] == [8, 4]  # group 1 lost its second block, group 0 kept both
        groups = [adapter.node(n.id).group for n in nodes]
        assert groups == ["KV group 0 (full_attention)", "KV group 1 (sliding_window)"]
        assert adapter.stats().total_tokens == 12 and adapter.stats().evicted_tokens == 4


def test_a_lora_adapters_blocks_say_its_name():
    tokens = [1, 2, 3, 4]
    lora = {**stored([31], None, tokens), "lora_name": "support-bot", "lora_id": 1, "extra_keys": [["support-bot"]]}
    with publishing(0) as (proc, adapter, _):  # the same tokens under a LoRA adapter hash apart (vLLM keys them by it): two nodes
        send(proc, [[stored([30], None, tokens), lora]])
        caught_up(adapter, 0)
        assert {adapter.node(n.id).lora: n.tokens for n in adapter.children(0).children} == {None: 4, "support-bot": 4}
        send(proc, [[{"type": "BlockRemoved", "block_hashes": [31], "medium": "GPU", "group_idx": 0}]])
        caught_up(adapter, 1)
        assert [adapter.node(n.id).lora for n in adapter.children(0).children] == [None]
        assert adapter._lora_of == {}  # nothing kept of a removed block
