"""KV geometry, the allocator's contract, and the torch pool."""

from __future__ import annotations

import tracemalloc
from contextlib import contextmanager, nullcontext

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.gpu_backend.allocator import MAX_PAGE_SIZE, AllocatorError, PageSet, TokenToKVPoolAllocator
from radixtop.gpu_backend.kv_geometry import PRESETS, KVGeometry, get_geometry
from radixtop.gpu_backend.kv_pool import KVPool, KVPoolError, MHATokenToKVPool


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
    # A free touches only the freed pages: the free list grows by exactly what was freed (here
    # one run of 10 pages, [1, 11), after the pool's untouched rest).
    a = TokenToKVPoolAllocator(1 << 20)
    slots = a.alloc(10)
    before = list(a._free)
    a.free(slots)
    assert list(a._free) == [*before, (1, 11)] and a.available_size() == 1 << 20


def test_a_huge_pool_costs_memory_only_for_what_is_used():
    # 10**12 slots: one int64 per slot would be 7.3 TiB. Free ranges and the handed-out set cost
    # what is handed out, not what could be.
    tracemalloc.start()
    try:
        for page_size in (1, 64):
            a = TokenToKVPoolAllocator(10**12, page_size)
            assert a.available_size() == 10**12
            held = [a.alloc(64 * page_size) for _ in range(100)]
            a.free(held[10])
            a.free(held[50][page_size:])
            assert a.is_allocated(held[11]).all() and not a.is_allocated(held[10]).any()
            with pytest.raises(AllocatorError, match="not allocated"):
                a.free(held[10])
            assert a.used_size() == (100 * 64 - 64 - 63) * page_size
            last = a.alloc(2 * page_size)
            assert last.tolist() == list(range(6401 * page_size, 6403 * page_size))  # fresh pages first
            a.clear()
            assert a.available_size() == 10**12 and a.used_size() == 0
        assert tracemalloc.get_traced_memory()[1] < 8 * 2**20
    finally:
        tracemalloc.stop()


class ListModel:
    """SGLang's TokenToKVPoolAllocator with need_sort=False, one list entry per page: alloc
    takes from the head, free appends to the tail in the order given."""

    def __init__(self, num_pages: int):
        self.free_pages = list(range(1, num_pages + 1))

    def alloc(self, n_pages: int) -> list[int] | None:
        if n_pages > len(self.free_pages):
            return None
        taken, self.free_pages = self.free_pages[:n_pages], self.free_pages[n_pages:]
        return taken

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)


@contextmanager
def small_chunks():
    """The allocator with a read-ahead of 3 pages and its PageSet in chunks of 8 pages, so that a
    small pool goes through every path a huge one takes."""
    saved = TokenToKVPoolAllocator.READ_AHEAD, PageSet.ONE_BITMAP, PageSet.CHUNK_BITS
    TokenToKVPoolAllocator.READ_AHEAD, PageSet.ONE_BITMAP, PageSet.CHUNK_BITS = 3, 4, 3
    try:
        yield
    finally:
        TokenToKVPoolAllocator.READ_AHEAD, PageSet.ONE_BITMAP, PageSet.CHUNK_BITS = saved


@settings(max_examples=150, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), small=st.booleans(), data=st.data())
def test_slots_are_handed_out_in_sglangs_order(page_size, small, data):
    """Pages in ascending order at first, then freed ones in the order they were freed: as
    SGLang's allocator (need_sort=False) hands them out, whatever the free ranges look like."""
    with small_chunks() if small else nullcontext():
        check_order_against_the_model(page_size, data)


def check_order_against_the_model(page_size, data) -> None:
    num_pages = 24
    a, model = TokenToKVPoolAllocator(num_pages * page_size, page_size), ListModel(num_pages)
    held: list[int] = []
    for _ in range(data.draw(st.integers(1, 40))):
        if held and data.draw(st.booleans()):
            chosen = data.draw(st.lists(st.sampled_from(held), unique=True, min_size=1))
            a.free(np.array([q * page_size + i for q in chosen for i in range(page_size)], dtype=np.int64))
            model.free(chosen)
            held = [q for q in held if q not in chosen]
        else:
            n = data.draw(st.integers(0, 10))
            got, want = a.alloc(n * page_size), model.alloc(n)
            if want is None:
                assert got is None
                continue
            assert got.tolist() == [q * page_size + i for q in want for i in range(page_size)]
            held += want
        assert a.available_size() == len(model.free_pages) * page_size
        assert a.used_size() == len(held) * page_size
        slots = np.arange(page_size, (num_pages + 1) * page_size)
        assert a.is_allocated(slots).tolist() == [s // page_size in held for s in slots]
    assert a.free_slots().tolist() == [q * page_size + i for q in model.free_pages for i in range(page_size)]


def test_pools_beyond_what_can_be_indexed_or_paged_are_refused():
    with pytest.raises(ValueError, match="page_size .* must be 1 to 65,536"):
        TokenToKVPoolAllocator(10**9, page_size=10**9)
    with pytest.raises(ValueError, match="slot indices are int64"):
        TokenToKVPoolAllocator(2**63)
    TokenToKVPoolAllocator(2**62, page_size=MAX_PAGE_SIZE)  # the largest sizes are fine, and cheap


def test_a_pool_the_device_cannot_hold_is_a_clear_error():
    g = get_geometry("tiny")
    with pytest.raises(KVPoolError, match=r"a KV pool of 238,418\.6 GiB on cpu: more than the [\d,.]+ GiB of memory available"):
        KVPool(g, 10**12, device="cpu")
    with pytest.raises(KVPoolError, match="unknown device 'gpu'; use cpu, cuda or meta"):
        KVPool(g, 64, device="gpu")
    with pytest.raises(KVPoolError, match="bytes do not fit in 64 bits"):
        KVPool(get_geometry("llama-3-70b"), 10**18, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(KVPoolError, match="device cuda: CUDA is not available"):
            KVPool(g, 64, device="cuda")
    assert KVPool(get_geometry("llama-3-70b"), 10**12, device="meta").memory().capacity_tokens == 10**12


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
