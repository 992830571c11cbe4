"""TokenToKVPoolAllocator: hands out KV-pool slots by page and refuses double or foreign frees."""

from __future__ import annotations

from collections import deque

import numpy as np

MAX_PAGE_SIZE = 1 << 16
"""The largest page, in tokens. SGLang's attention backends use pages of 1 to 256 tokens; a
request holds its last page whole (one int64 a slot, in its slot array), so a page of 10**9
tokens would cost a one-token request gigabytes."""
MAX_SLOT = 2**63 - 1
"""Slot indices are int64, as SGLang's are (torch.int64)."""


class AllocatorError(RuntimeError):
    """A free of a slot that is not currently allocated (freed twice, or never handed out)."""


class TokenToKVPoolAllocator:
    """Slots 1..size of a KV pool (slot 0 is SGLang's padding slot and is never handed out).

    Slots are handed out in whole pages of ``page_size``; ``alloc(n)`` needs ``n`` to be a multiple
    of the page size, as SGLang's paged allocator does. Pages go out in the order SGLang's
    allocator (``need_sort=False``) hands them out: ascending at first, then freed pages in the
    order they were freed.

    Memory follows the pages handed out, never ``size``, so a pool of 10**12 slots costs nothing
    until used: the free list holds runs ``(start, stop)`` of consecutive pages (the pool's
    untouched rest is one run, and so is a free of consecutive pages) and arrays of the pages of
    other frees, and the pages handed out are a :class:`PageSet`. The free list's first
    ``READ_AHEAD`` pages are spelled out, so that most allocations are one slice. An alloc or a
    free costs O(its slots) (amortized), never O(pool).
    """

    READ_AHEAD = 4096

    def __init__(self, size: int, page_size: int = 1):
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size {page_size} must be 1 to {MAX_PAGE_SIZE:,} tokens")
        if size < page_size or size % page_size:
            raise ValueError(f"size {size} must be a positive multiple of page_size {page_size}")
        if size + page_size - 1 > MAX_SLOT:
            raise ValueError(f"pool size {size} is too large: slot indices are int64 (at most 2**63-1)")
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.clear()

    def clear(self) -> None:
        """Every slot free again (SGLang's flush)."""
        # Page p (1-based) holds slots p*page_size .. p*page_size + page_size - 1.
        self._head = np.empty(0, dtype=np.int64)  # the free list's first pages, spelled out
        # The rest, oldest first: a run (start, stop), or the pages of one free.
        self._free: deque[tuple[int, int] | np.ndarray] = deque([(1, self.num_pages + 1)])
        self._free_count = self.num_pages
        self._allocated = PageSet(self.num_pages + 1)

    def available_size(self) -> int:
        """Free slots (tokens)."""
        return self._free_count * self.page_size

    def used_size(self) -> int:
        return (self.num_pages - self._free_count) * self.page_size

    def alloc(self, need_size: int) -> np.ndarray | None:
        """Slot indices for ``need_size`` tokens, or None when fewer are free (SGLang's contract)."""
        if need_size < 0:
            raise ValueError(f"need_size must be >= 0, got {need_size}")
        if need_size % self.page_size:
            raise ValueError(f"need_size {need_size} is not a multiple of page_size {self.page_size}")
        n_pages = need_size // self.page_size
        if n_pages > self._free_count:
            return None
        if n_pages > self._head.size:
            more = min(n_pages - self._head.size + self.READ_AHEAD, self._free_count - self._head.size)
            self._head = np.concatenate([self._head, *self._take_free(more)])
        # A copy: a view would keep the read-ahead alive for as long as the slots are held.
        pages, self._head = self._head[:n_pages].copy(), self._head[n_pages:]
        self._free_count -= n_pages
        self._allocated.add(pages)
        return self._slots_of(pages)

    def _take_free(self, n_pages: int) -> list[np.ndarray]:
        """The next ``n_pages`` pages of the free list, spelled out and taken off it."""
        free, taken = self._free, []
        while n_pages:
            entry = free.popleft()
            if isinstance(entry, tuple):
                start, stop = entry
                if stop - start > n_pages:
                    free.appendleft((start + n_pages, stop))
                    stop = start + n_pages
                entry = np.arange(start, stop, dtype=np.int64)
            elif entry.size > n_pages:
                free.appendleft(entry[n_pages:])
                entry = entry[:n_pages]
            taken.append(entry)
            n_pages -= entry.size
        return taken

    def _slots_of(self, pages: np.ndarray) -> np.ndarray:
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1)

    def free(self, free_index: np.ndarray) -> None:
        """Return slots to the pool. Freeing a slot twice, or one never handed out, raises."""
        idx = np.asarray(free_index, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return
        p = self.page_size
        if p == 1:
            pages = idx
        else:
            if idx.size % p or np.any(idx[::p] % p):
                raise AllocatorError(f"free of {idx.size} slots that are not whole pages of {p}")
            pages = idx[::p] // p
            expected = (pages[:, None] * p + np.arange(p)).reshape(-1)
            if not np.array_equal(expected, idx):
                raise AllocatorError("free of slots that are not whole pages")
        lo, hi = int(pages.min()), int(pages.max())
        if lo < 1 or hi > self.num_pages:
            bad = pages[(pages < 1) | (pages > self.num_pages)][:5]
            raise AllocatorError(f"free of slots outside the pool (pages {bad.tolist()})")
        ascending = pages.size == 1 or bool((np.diff(pages) > 0).all())
        if not ascending:  # (an ascending array, the common case, has no repeat)
            ordered = np.sort(pages)
            if (ordered[1:] == ordered[:-1]).any():
                raise AllocatorError("free of the same slot twice in one call")
        held = self._allocated.remove(pages)
        if held is not None:
            bad = (pages[~held][:5] * p).tolist()
            raise AllocatorError(f"free of slots that are not allocated (double free?): {bad}")
        # One run when the pages are consecutive; else a copy (the caller's array may be a view
        # of a larger one, which the free list would keep alive).
        self._free.append((lo, hi + 1) if ascending and hi - lo == pages.size - 1 else pages.copy())
        self._free_count += pages.size

    def is_allocated(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: is it handed out right now (for invariant checks)."""
        return self._allocated.contains(np.asarray(slots, dtype=np.int64).reshape(-1) // self.page_size)

    def free_slots(self) -> np.ndarray:
        """Every free slot, in the order they would be handed out (SGLang's ``free_pages``).
        One entry a slot: for censuses of small pools in tests."""
        rest = [np.arange(*e, dtype=np.int64) if isinstance(e, tuple) else e for e in self._free]
        return self._slots_of(np.concatenate([self._head, *rest]))


class PageSet:
    """A set of the page numbers below ``limit`` as bitmaps of ``2**CHUNK_BITS`` pages (a byte
    each), each made when a page in it is first added and dropped when its last page goes:
    memory follows where the pages in the set lie, not ``limit``. Up to ``ONE_BITMAP`` pages it
    is one bitmap of ``limit`` pages, kept: at most 1 MiB, and no chunk to find per call."""

    CHUNK_BITS = 16
    ONE_BITMAP = 1 << 20

    def __init__(self, limit: int) -> None:
        self._one = limit <= self.ONE_BITMAP
        self._chunk_bits = max(1, (limit - 1).bit_length()) if self._one else self.CHUNK_BITS
        self._chunks: dict[int, np.ndarray] = {}
        self._counts: dict[int, int] = {}

    def contains(self, pages: np.ndarray) -> np.ndarray:
        """Per page: is it in the set."""
        found = np.zeros(pages.shape, dtype=np.bool_)
        for chunk, where, offsets in self._groups(pages):
            bits = self._chunks.get(chunk)
            if bits is not None:
                found[where] = bits[offsets]
        return found

    def add(self, pages: np.ndarray) -> None:
        """Add pages that are not in the set (each once)."""
        for chunk, _, offsets in self._groups(pages):
            bits = self._chunks.get(chunk)
            if bits is None:
                bits = self._chunks[chunk] = np.zeros(1 << self._chunk_bits, dtype=np.bool_)
                self._counts[chunk] = 0
            bits[offsets] = True
            self._counts[chunk] += offsets.size

    def remove(self, pages: np.ndarray) -> np.ndarray | None:
        """Remove ``pages`` (each once) if every one is in the set, and return None; else change
        nothing and return per page whether it is in the set."""
        groups = self._groups(pages)
        if len(groups) == 1:  # the common case: pages handed out together lie together
            bits = self._chunks.get(groups[0][0])
            found = bits[groups[0][2]] if bits is not None else np.zeros(pages.shape, dtype=np.bool_)
        else:
            found = self.contains(pages)
        if not found.all():
            return found
        for chunk, _, offsets in groups:
            self._chunks[chunk][offsets] = False
            self._counts[chunk] -= offsets.size
            if not self._counts[chunk] and not self._one:
                del self._chunks[chunk], self._counts[chunk]
        return None

    def _groups(self, pages: np.ndarray) -> list[tuple[int, slice | np.ndarray, np.ndarray]]:
        """(chunk, where in ``pages``, offsets in the chunk) for each chunk that ``pages`` touch."""
        if self._one or pages.size == 0:
            return [(0, slice(None), pages)] if pages.size else []
        offsets = pages & ((1 << self._chunk_bits) - 1)
        first = int(pages.min()) >> self._chunk_bits
        if first == int(pages.max()) >> self._chunk_bits:
            return [(first, slice(None), offsets)]
        chunks = pages >> self._chunk_bits
        order = np.argsort(chunks, kind="stable")
        cuts = np.flatnonzero(np.diff(chunks[order])) + 1
        return [(int(chunks[where[0]]), where, offsets[where]) for where in np.split(order, cuts)]
