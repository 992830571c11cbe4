"""TokenToKVPoolAllocator: hands out KV-pool slots by page and refuses double or foreign frees."""

from __future__ import annotations

import numpy as np


class AllocatorError(RuntimeError):
    """A free of a slot that is not currently allocated (freed twice, or never handed out)."""


class TokenToKVPoolAllocator:
    """Slots 1..size of a KV pool (slot 0 is SGLang's padding slot and is never handed out).

    Slots are handed out in whole pages of ``page_size``; ``alloc(n)`` needs ``n`` to be a multiple
    of the page size, as SGLang's paged allocator does. Freed pages go to a release list and are
    merged on the next allocation that needs them, so a free costs O(freed slots), never O(pool).
    """

    def __init__(self, size: int, page_size: int = 1):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size or size % page_size:
            raise ValueError(f"size {size} must be a positive multiple of page_size {page_size}")
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.clear()

    def clear(self) -> None:
        """Every slot free again (SGLang's flush)."""
        # Page p (1-based) holds slots p*page_size .. p*page_size + page_size - 1.
        self._free_pages = np.arange(1, self.num_pages + 1, dtype=np.int64)
        self._release: list[np.ndarray] = []
        self._release_count = 0
        self._page_allocated = np.zeros(self.num_pages + 1, dtype=np.bool_)
        self._used_pages = 0

    def available_size(self) -> int:
        """Free slots (tokens)."""
        return (len(self._free_pages) + self._release_count) * self.page_size

    def used_size(self) -> int:
        return self._used_pages * self.page_size

    def alloc(self, need_size: int) -> np.ndarray | None:
        """Slot indices for ``need_size`` tokens, or None when fewer are free (SGLang's contract)."""
        if need_size < 0:
            raise ValueError(f"need_size must be >= 0, got {need_size}")
        if need_size % self.page_size:
            raise ValueError(f"need_size {need_size} is not a multiple of page_size {self.page_size}")
        n_pages = need_size // self.page_size
        if n_pages > len(self._free_pages) and self._release:
            self._free_pages = np.concatenate([self._free_pages, *self._release])
            self._release.clear()
            self._release_count = 0
        if n_pages > len(self._free_pages):
            return None
        pages = self._free_pages[:n_pages]
        self._free_pages = self._free_pages[n_pages:]
        self._page_allocated[pages] = True
        self._used_pages += n_pages
        if self.page_size == 1:
            return pages.copy()
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
        if pages.min() < 1 or pages.max() > self.num_pages:
            bad = pages[(pages < 1) | (pages > self.num_pages)][:5]
            raise AllocatorError(f"free of slots outside the pool (pages {bad.tolist()})")
        held = self._page_allocated[pages]
        if not held.all():
            bad = (pages[~held][:5] * p).tolist()
            raise AllocatorError(f"free of slots that are not allocated (double free?): {bad}")
        if pages.size > 1 and not (np.diff(pages) > 0).all():
            # Not one ascending run (the common case, checked first): look for a repeat.
            ordered = np.sort(pages)
            if (ordered[1:] == ordered[:-1]).any():
                raise AllocatorError("free of the same slot twice in one call")
        self._page_allocated[pages] = False
        self._used_pages -= pages.size
        self._release.append(pages)
        self._release_count += pages.size

    def is_allocated(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: is it handed out right now (for invariant checks)."""
        return self._page_allocated[np.asarray(slots, dtype=np.int64) // self.page_size]
