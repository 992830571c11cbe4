"""How to read each radix tree SGLang ships (imports nothing from sglang at module level).

* ``RadixCache`` of 0.5.15/0.5.16 with ``SessionRadixCacheMixin``: holders in
  ``node.session_ids`` (present only while non-empty), the index in ``cache._session_leaves``,
  tombstones in ``cache._closed_session_ids``; close frees (the seed's rule).
* ``RadixCache`` of 0.5.17+: the same node fields, no sessions.
* ``UnifiedRadixCache`` of 0.5.17+ with its Python tree core: KV fields per component in
  ``node.component_data[FULL]`` (``value``, ``lock_ref``, ``session_ids`` on each session's
  frontier nodes, ``session_ref``); every live node in ``tree_core._node_arena``; close only
  dereferences (eviction reclaims later). With the Rust core there are no Python nodes at all.

See docs/sglang-internals.md for where each fact comes from.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

FULL = 0  # ComponentType.FULL: component_data is a list indexed by the enum's int value


class SGLangTree:
    """One SGLang tree cache object, read through the fields its version has."""

    kind = "RadixCache"
    policy: str | None = None
    """Close policy: "free" (frees now), "deref" (drops references only), None (no sessions)."""
    clock_is_time = True
    """``last_access_time`` is ``time.monotonic()`` (an age can be shown), not a counter."""
    has_nodes = True
    reason = ""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.page_size = int(getattr(cache, "page_size", 1) or 1)

    @property
    def root(self) -> Any:
        return self.cache.root_node

    def lock_ref(self, node: Any) -> int:
        return node.lock_ref

    def holders(self, node: Any) -> set[str] | None:
        return getattr(node, "session_ids", None)

    def session_leaves(self) -> Mapping[str, Collection[Any]]:
        return {}

    def closed(self) -> Collection[str]:
        return ()

    def release(self, session_id: str) -> None:
        raise NotImplementedError

    def node_by_id(self, node_id: int) -> Any | None:
        """A registry lookup where the tree keeps one (None: not there, or no registry)."""
        return None

    has_registry = False

    def evictable_size(self) -> int:
        return int(self.cache.evictable_size())

    def protected_size(self) -> int:
        return int(self.cache.protected_size())

    def evict(self, num_tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        result = self.cache.evict(EvictParams(num_tokens=num_tokens))
        return int(getattr(result, "num_tokens_evicted", 0) or 0)


class SessionRadixTree(SGLangTree):
    """0.5.15/0.5.16 ``RadixCache`` with ``--enable-session-radix-cache``."""

    kind = "RadixCache+sessions"
    policy = "free"

    def session_leaves(self) -> Mapping[str, Collection[Any]]:
        return getattr(self.cache, "_session_leaves", None) or {}

    def closed(self) -> Collection[str]:
        return getattr(self.cache, "_closed_session_ids", None) or {}

    def release(self, session_id: str) -> None:
        self.cache.release_radix_session(session_id)


class UnifiedTree(SGLangTree):
    """0.5.17+ ``UnifiedRadixCache`` with the Python tree core."""

    kind = "UnifiedRadixCache"
    clock_is_time = False  # a global float counter (components/base.py), not wall time
    has_registry = True

    def __init__(self, cache: Any) -> None:
        super().__init__(cache)
        self.sessions_on = bool(getattr(cache, "enable_session_radix_cache", False))
        self.policy = "deref" if self.sessions_on else None
        self.full = cache.components[FULL] if hasattr(cache, "components") else None

    def lock_ref(self, node: Any) -> int:
        return node.component_data[FULL].lock_ref

    def holders(self, node: Any) -> set[str] | None:
        return node.component_data[FULL].session_ids

    def session_leaves(self) -> Mapping[str, Collection[Any]]:
        if not self.sessions_on or self.full is None:
            return {}
        return getattr(self.full, "_session_leaves", None) or {}

    def closed(self) -> Collection[str]:
        refs = getattr(self.cache, "session_refs", None)
        return getattr(refs, "_closed_session_ids", None) or {}

    def release(self, session_id: str) -> None:
        self.cache.release_radix_session(session_id)

    def node_by_id(self, node_id: int) -> Any | None:
        return self.cache.tree_core._node_arena.get(node_id)


class RustUnifiedTree(SGLangTree):
    """0.5.17+ ``UnifiedRadixCache`` with the Rust tree core: totals only, no Python nodes."""

    kind = "UnifiedRadixCache (rust core)"
    has_nodes = False
    reason = ("the server's UnifiedRadixCache runs the Rust tree core, which exposes no Python "
              "nodes: start it with SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python (or "
              "--enable-session-radix-cache) to see the tree")


def tree_for(cache: Any) -> SGLangTree:
    """The reader for ``cache`` (a live SGLang tree cache object)."""
    if hasattr(cache, "tree_core"):
        backend = str(getattr(cache, "_tree_core_backend", "python"))
        if backend != "python" or not hasattr(cache.tree_core, "_node_arena"):
            return RustUnifiedTree(cache)
        return UnifiedTree(cache)
    if getattr(cache, "enable_session_radix_cache", False) and hasattr(cache, "release_radix_session") \
            and hasattr(cache, "_reset_session_radix_state"):
        return SessionRadixTree(cache)
    return SGLangTree(cache)
