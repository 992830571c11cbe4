"""Eviction strategies: a node's priority, smallest evicted first (SGLang's evict_policy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixtop.gpu_backend.radix_cache import TreeNode


class EvictionStrategy:
    name = ""

    def get_priority(self, node: TreeNode) -> Any:
        raise NotImplementedError


class LRUStrategy(EvictionStrategy):
    name = "lru"

    def get_priority(self, node: TreeNode) -> float:
        return node.last_access_time


class LFUStrategy(EvictionStrategy):
    name = "lfu"

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.hit_count, node.last_access_time)


class FIFOStrategy(EvictionStrategy):
    name = "fifo"

    def get_priority(self, node: TreeNode) -> float:
        return node.creation_time


class MRUStrategy(EvictionStrategy):
    name = "mru"

    def get_priority(self, node: TreeNode) -> float:
        return -node.last_access_time


class FILOStrategy(EvictionStrategy):
    name = "filo"

    def get_priority(self, node: TreeNode) -> float:
        return -node.creation_time


class PriorityStrategy(EvictionStrategy):
    """Lower request priority evicted first, then LRU within a priority."""

    name = "priority"

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.priority, node.last_access_time)


EVICTION_STRATEGIES: dict[str, type[EvictionStrategy]] = {
    s.name: s for s in (LRUStrategy, LFUStrategy, FIFOStrategy, MRUStrategy, FILOStrategy, PriorityStrategy)
}


def get_eviction_strategy(policy: str) -> EvictionStrategy:
    try:
        return EVICTION_STRATEGIES[policy.lower()]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {policy!r}; known: {', '.join(EVICTION_STRATEGIES)}"
        ) from None
