"""How to read each radix tree SGLang ships (imports nothing from sglang at module level).

* ``RadixCache`` of 0.5.15/0.5.16 with ``SessionRadixCacheMixin``: holders in
  ``node.session_ids`` (present only while non-empty), the index in ``cache._session_leaves``,
  tombstones in ``cache._closed_session_ids``; close frees (SessionRadixCacheMixin's rule).
* ``RadixCache`` of 0.5.15/0.5.16 without the flag: the same, no sessions until it is set.
* ``RadixCache`` of 0.5.17+: the same node fields, no session support at all.
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

NO_SESSIONS_FLAG = ("no sessions: start SGLang with --enable-session-radix-cache to see holders, "
                    "sessions and close")
NO_SESSIONS_17 = ("no sessions: SGLang 0.5.17+ RadixCache has none (--enable-session-radix-cache "
                  "needs UnifiedRadixCache, the default tree since 0.5.23), so holders, sessions "
                  "and close are unavailable")
NO_SESSIONS_RUST = ("no sessions: the Rust tree core runs only without --enable-session-radix-cache "
                    "(the flag selects the Python core)")


class SGLangTree:
    """One SGLang tree cache object, read through the fields its version has."""

    kind = "RadixCache"
    policy: str | None = None
    """Close policy: "free" (frees now), "deref" (drops references only), None (no sessions)."""
    clock_is_time = True
    """``last_access_time`` is ``time.monotonic()`` (an age can be shown), not a counter."""
    has_nodes = True
    reason = ""
    sessions_reason = NO_SESSIONS_FLAG
    """Why there are no sessions (shown when ``policy`` is None)."""

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

    def device_evicted(self, node: Any) -> bool:
        """No KV on the device (a host-only node a match stops at, as SGLang's does)."""
        return node.value is None

    def on_host(self, node: Any) -> bool:
        """A HiCache copy in host memory (``host_value``, what SGLang's ``backuped`` reads)."""
        return getattr(node, "host_value", None) is not None

    def tiers(self, node: Any) -> tuple[str, ...]:
        """The tiers holding the node's KV that its fields tell: the device, host memory (disk and
        external copies are not on the node: unknown here, never claimed)."""
        return (() if self.device_evicted(node) else ("GPU",)) + (("host",) if self.on_host(node) else ())

    def session_leaves(self) -> Mapping[str, Collection[Any]]:
        return {}

    def closed(self) -> Collection[str]:
        return ()

    def open_ids(self) -> Collection[str]:
        """Sessions the tree itself knows to be open (beyond those holding nodes)."""
        return ()

    def node_count(self) -> int | None:
        """Nodes in the tree, the root excluded, where the tree counts them (None: walk)."""
        return None

    def release_session(self, session_id: str) -> None:
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

    def evict_counted(self, num_tokens: int) -> tuple[int, int | None]:
        """(tokens, nodes) SGLang's own ``evict`` freed; nodes counted from its ``_delete_leaf``
        calls, wrapped for this call only (owner thread); None where there is nothing to count
        them by (the Rust tree core)."""
        cache, deleted = self.cache, [0]
        delete_leaf = getattr(cache, "_delete_leaf", None)
        if delete_leaf is None:
            return self.evict(num_tokens), None
        own = vars(cache).get("_delete_leaf") if hasattr(cache, "__dict__") else None

        def counting(node, *args, **kwargs):
            deleted[0] += 1
            return delete_leaf(node, *args, **kwargs)

        cache._delete_leaf = counting
        try:
            tokens = self.evict(num_tokens)
        finally:
            if own is not None:
                cache._delete_leaf = own
            else:
                del cache._delete_leaf
        return tokens, deleted[0]


class PlainRadixTree(SGLangTree):
    """0.5.17+ ``RadixCache``: the 0.5.16 node fields, and no session support at all (the
    session mixin is gone; ``release_radix_session`` is ``BasePrefixCache``'s no-op)."""

    sessions_reason = NO_SESSIONS_17


class SessionRadixTree(SGLangTree):
    """0.5.15/0.5.16 ``RadixCache`` with ``--enable-session-radix-cache``."""

    kind = "RadixCache+sessions"
    policy = "free"

    def __init__(self, cache: Any) -> None:
        super().__init__(cache)
        # (radixtop's copy of its own engine beside it: that engine's policy, "deref" where it says so)
        self.policy = getattr(cache, "mirrored_close_policy", "free")

    def session_leaves(self) -> Mapping[str, Collection[Any]]:
        return getattr(self.cache, "_session_leaves", None) or {}

    def closed(self) -> Collection[str]:
        return getattr(self.cache, "_closed_session_ids", None) or {}

    def release_session(self, session_id: str) -> None:
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

    def device_evicted(self, node: Any) -> bool:
        return node.component_data[FULL].value is None

    def on_host(self, node: Any) -> bool:
        return node.component_data[FULL].host_value is not None

    def session_leaves(self) -> Mapping[str, Collection[Any]]:
        if not self.sessions_on or self.full is None:
            return {}
        return getattr(self.full, "_session_leaves", None) or {}

    def _refs(self) -> Any:
        return getattr(self.cache, "session_refs", None) if self.sessions_on else None

    def closed(self) -> Collection[str]:
        return getattr(self._refs(), "_closed_session_ids", None) or {}

    def open_ids(self) -> Collection[str]:
        # Every request with a session id opens (or re-opens) its generation on arrival
        # (Scheduler -> ensure_session_generation); a close drops it.
        return getattr(self._refs(), "_session_generations", None) or {}

    def release_session(self, session_id: str) -> None:
        self.cache.release_radix_session(session_id)

    def node_by_id(self, node_id: int) -> Any | None:
        return self.cache.tree_core._node_arena.get(node_id)

    def node_count(self) -> int | None:
        return len(self.cache.tree_core._node_arena) - 1  # the arena holds the root too

    def evict_counted(self, num_tokens: int) -> tuple[int, int]:
        """Nodes counted from the arena: eviction deletes nodes from the tree core, never the
        cache's own ``_delete_leaf`` (it has none)."""
        before = len(self.cache.tree_core._node_arena)
        tokens = self.evict(num_tokens)
        return tokens, max(0, before - len(self.cache.tree_core._node_arena))


class RustUnifiedTree(SGLangTree):
    """0.5.17+ ``UnifiedRadixCache`` with the Rust tree core: totals only, no Python nodes."""

    kind = "UnifiedRadixCache (rust core)"
    has_nodes = False
    clock_is_time = False
    sessions_reason = NO_SESSIONS_RUST
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
    if not hasattr(cache, "_reset_session_radix_state"):  # the 0.5.15/0.5.16 session mixin
        return PlainRadixTree(cache)
    return SGLangTree(cache)
