"""KV geometry, the allocator's contract, and the torch pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixtop.gpu_backend.allocator import AllocatorError, TokenToKVPoolAllocator
from radixtop.gpu_backend.kv_geometry import PRESETS, KVGeometry, get_geometry
from radixtop.gpu_backend.kv_pool import KVPool, MHATokenToKVPool


def test_bytes_per_token_of_presets():
    # layers x 2 (K and V) x kv heads x head dim x dtype size
    assert get_geometry("llama-3-8b").bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert get_geometry("llama-3-70b").bytes_per_token == 80 * 2 * 8 * 128 * 2
    assert get_geometry("qwen2.5-7b").bytes_per_token == 28 * 2 * 4 * 128 * 2
    assert get_geometry("tiny").bytes_per_token == 2 * 2 * 2 * 8 * 4
    assert {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "tiny"} <= set(PRESETS)


def test_geometry_rejects_bad_values():
    with pytest.raises(ValueError, match="unknown model preset"):
        get_geometry("gpt-17")
    with pytest.raises(ValueError, match="dtype"):
        KVGeometry("x", 1, 1, 1, dtype="int3")
    with pytest.raises(ValueError, match="num_layers"):
        KVGeometry("x", 0, 1, 1)


def test_alloc_free_available():
    a = TokenToKVPoolAllocator(8)
    assert a.available_size() == 8
    slots = a.alloc(5)
    assert sorted(slots.tolist()) == [1, 2, 3, 4, 5]  # slot 0 is the padding slot
    assert a.available_size() == 3 and a.used_size() == 5
    assert a.alloc(4) is None  # SGLang's contract: None, and nothing taken
    assert a.available_size() == 3
    a.free(slots[:2])
    assert a.available_size() == 5
    again = a.alloc(5)  # merges the released slots back
    assert len(set(again.tolist())) == 5 and a.available_size() == 0


def test_double_free_and_foreign_free_are_errors_and_change_nothing():
    a = TokenToKVPoolAllocator(8)
    slots = a.alloc(3)
    a.free(slots[:1])
    with pytest.raises(AllocatorError, match="not allocated"):
        a.free(slots[:2])  # slots[0] again
    assert a.available_size() == 6  # the refused free changed nothing
    with pytest.raises(AllocatorError, match="outside the pool"):
        a.free(np.array([0]))
    with pytest.raises(AllocatorError, match="outside the pool"):
        a.free(np.array([9]))
    with pytest.raises(AllocatorError, match="not allocated"):
        a.free(np.array([7]))  # inside the pool, never handed out
    with pytest.raises(AllocatorError, match="twice in one call"):
        a.free(np.array([slots[1], slots[1]]))
    a.free(slots[1:])
    assert a.available_size() == 8


def test_paged_allocator_hands_out_whole_pages():
    a = TokenToKVPoolAllocator(16, page_size=4)
    slots = a.alloc(8)
    assert slots.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="multiple of page_size"):
        a.alloc(3)
    with pytest.raises(AllocatorError, match="whole pages"):
        a.free(slots[:3])
    a.free(slots[4:])
    assert a.available_size() == 12


def test_free_cost_does_not_scan_the_pool():
    # A free touches only the freed pages: the release list grows by exactly what was freed.
    a = TokenToKVPoolAllocator(1 << 20)
    slots = a.alloc(10)
    a.free(slots)
    assert a._release_count == 10 and len(a._release[-1]) == 10


def test_pool_holds_real_tensors_and_memory_figures():
    g = get_geometry("tiny")
    pool = KVPool(g, 32, device="cpu")
    assert len(pool.kv.k_buffer) == g.num_layers
    assert pool.kv.k_buffer[0].shape == (33, g.num_kv_heads, g.head_dim)
    assert pool.kv.k_buffer[0].dtype == torch.float32
    assert pool.kv.buffer_bytes() == 33 * g.bytes_per_token
    slots = pool.allocator.alloc(3)
    pool.write_tokens(slots, [7, 8, 9])
    k, v = pool.kv.get_kv(1, slots)
    assert k[:, 0, 0].tolist() == [8.0, 9.0, 10.0]  # token id + layer
    assert v[:, 0, 0].tolist() == [-8.0, -9.0, -10.0]
    mem = pool.memory()
    assert (mem.capacity_tokens, mem.used_tokens, mem.free_tokens) == (32, 3, 29)
    assert mem.used_bytes == 3 * g.bytes_per_token and mem.capacity_bytes == 32 * g.bytes_per_token


def test_meta_pool_simulates_a_large_gpu_without_memory():
    g = get_geometry("llama-3-70b")
    kv = MHATokenToKVPool(g, 1_000_000, device="meta")
    assert kv.is_simulated
    assert kv.buffer_bytes() == 1_000_001 * g.bytes_per_token  # ~305 GiB, and none allocated
    assert kv.k_buffer[0].device.type == "meta"
