"""The doctor's vLLM check on figures a healthy real server never shows (a leak cannot be made on
demand): vLLM's /metrics text as vLLM 0.32 writes it, read by ``figures_of``, then
``usage_findings`` against the tree. The healthy case is checked on the real server
(test_real_vllm.py)."""

from __future__ import annotations

from radixtop.adapters.model import Geometry, Stats
from radixtop.adapters.vllm.adapter import usage_findings
from radixtop.adapters.vllm.server import figures_of


def metrics(usage: float, running: int, waiting: int = 0, blocks: int = 40) -> str:
    return "\n".join([
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {usage}',
        f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}.0',
        f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}.0',
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 312.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 128.0',
        f'vllm:cache_config_info{{block_size="32",cache_dtype="auto",engine="0",num_gpu_blocks="{blocks}"}} 1.0',
        'vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5',  # another DP rank's
    ])


STATS = Stats(target="t", capacity_tokens=1248, available_tokens=0, evictable_tokens=0, protected_tokens=None,
              session_held_tokens=None, uncached_tokens=None, unevictable_tokens=None, total_tokens=0,
              bytes_per_token=512, node_count=0, open_sessions=None, closed_sessions=None, prompt_tokens=0,
              cached_tokens=0, evicted_tokens=0, closes=0, freed_by_close_tokens=0, version=0,
              geometry=Geometry("tiny", 2, 2, 32, "bfloat16", 32, 512))


def test_figures_are_read_per_engine():
    f = figures_of(metrics(0.0, 0))
    assert (f.blocks, f.block_size, f.usable_blocks, f.usage, f.queries, f.hits) == (40, 32, 39, 0.0, 312, 128)
    assert figures_of(metrics(0.0, 0), rank=1).usage == 0.5


def test_blocks_held_with_no_request_running_are_a_leak():
    f = figures_of(metrics(3 / 39, running=0))
    (leak,) = usage_findings(f, STATS.bytes_per_token, (10, 0))
    assert leak.kind == "usage_gauge" and "3 of 39 blocks are held" in leak.summary
    assert leak.tokens == 3 * 32 and leak.bytes == 3 * 32 * 512 and "vllm#57336" in leak.meaning
    assert leak.figures["held_blocks"] == 3 and leak.figures["tree_blocks"] == 10


def test_held_blocks_while_requests_run_are_no_finding():
    assert usage_findings(figures_of(metrics(30 / 39, running=2)), STATS.bytes_per_token, (10, 0)) == []
    assert usage_findings(figures_of(metrics(0.0, running=0)), STATS.bytes_per_token, (39, 0)) == []  # idle, pool full of cache


def test_a_tree_bigger_than_the_pool_lost_removals():
    (lost,) = usage_findings(figures_of(metrics(0.0, running=0)), STATS.bytes_per_token, (38, 3))
    assert "41 blocks, 2 more than vLLM's pool has (39)" in lost.summary and lost.tokens == 64


def test_pool_figures_out_of_any_real_range_are_unknown():
    """A /metrics that says 10**30 blocks or blocks of 2**40 tokens (a broken or hostile server):
    unknown, not a capacity past what the wire carries."""
    text = metrics(0.0, 0).replace('num_gpu_blocks="40"', 'num_gpu_blocks="' + "9" * 30 + '"')
    assert figures_of(text).blocks is None and figures_of(text).usable_blocks is None
    text = metrics(0.0, 0).replace('block_size="32"', f'block_size="{2**40}"')
    assert figures_of(text).block_size is None
