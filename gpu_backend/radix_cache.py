"""RadixCache: SGLang's radix tree of token prefixes over KV-pool slots, with a persistent evict heap."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixtop.gpu_backend.allocator import TokenToKVPoolAllocator
from radixtop.gpu_backend.eviction import get_eviction_strategy
from radixtop.gpu_backend.history import ROOT, CacheHistory
from radixtop.gpu_backend.ledger import SessionLedger
from radixtop.gpu_backend.owner.journal import JOURNAL_LIMIT, ChangeJournal
from radixtop.gpu_backend.sessions import SessionRadixCacheMixin

_EMPTY_VALUE = np.empty(0, dtype=np.int64)
_REMOVAL_WORK = 8
"""A stale heap entry dropped counts as this many looked at in a compaction step: dropping it may
free the last reference to an evicted node (its key and slot array), so a step of 1024 drops at
most 128 (at 1M nodes, 128 such frees a step took at most 0.8 ms)."""
class TreeNode:
    """One run of tokens (``key``) and the KV slots that hold them (``value``).

    ``id`` is stable for the node's life: when a node is split, the node object that keeps the id is
    the tail (it keeps its children, holders and place in session indexes); the new head gets a
    new id, as in SGLang.
    """

    __slots__ = (
        "id",
        "key",
        "value",
        "children",
        "parent",
        "lock_ref",
        "last_access_time",
        "creation_time",
        "hit_count",
        "priority",
        "session_ids",
        "subtree_tokens",
        "created_version",
        "heap_seq",
        "ledger_rec",
    )

    def __init__(self, node_id: int, now: float, priority: int = 0):
        self.id = node_id
        self.key: tuple[int, ...] = ()
        self.value: np.ndarray = _EMPTY_VALUE
        self.children: dict[Any, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority
        # Sessions that hold this node (None when none: most nodes, and it saves a set each).
        self.session_ids: set[str] | None = None
        # The session ledger's record of this node (``ledger.figures``): None where no session lies beneath.
        self.ledger_rec: Any = None
        # Tokens in this node and everything below it (kept exact between operations).
        self.subtree_tokens = 0
        self.created_version = 0

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    device_indices: np.ndarray
    last_node: TreeNode

    @property
    def prefix_len(self) -> int:
        return len(self.device_indices)


@dataclass(frozen=True)
class LookupResult:
    """A read-only longest-prefix walk: nothing split, no access time touched."""

    prefix_len: int
    last_node: TreeNode
    # Tokens matched inside a child of ``last_node`` (a match that ends inside a node).
    partial_node: TreeNode | None = None
    partial_len: int = 0


@dataclass(frozen=True)
class InsertResult:
    prefix_len: int
    last_node: TreeNode


@dataclass(frozen=True)
class ChangeSet:
    """Node ids touched since a version (sizes, locks, holders, children); see ``changes``."""

    since: int
    version: int
    resync: bool
    added: tuple[int, ...] = ()
    changed: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


@dataclass(frozen=True)
class EvictResult:
    num_tokens_evicted: int = 0
    num_nodes_evicted: int = 0


@dataclass
class Req:
    """A request as the cache sees it between its match and its finish."""

    rid: str
    input_ids: list[int]
    session_id: str | None = None
    output_ids: list[int] = field(default_factory=list)
    priority: int = 0
    # Slots for every position: the matched prefix's, then the request's own (whole pages).
    slots: np.ndarray = field(default_factory=lambda: _EMPTY_VALUE)
    cache_protected_len: int = 0
    last_node: TreeNode | None = None


class RadixCache(SessionRadixCacheMixin):
    """SGLang's RadixCache semantics on a pure-Python tree.

    Differences that change no result: evictable leaves live in a persistent heap (entries are
    re-pushed when a node's priority changes and checked when popped) instead of a heap rebuilt on
    every ``evict``; a query is walked by offset instead of being re-sliced at every node; every
    node is reachable by id through a flat registry; each node knows its subtree's token count;
    and a bounded journal of changed node ids lets readers follow the tree incrementally
    (access-time and hit-count refreshes are not journaled: they change on every request).
    """

    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        page_size: int = 1,
        eviction_policy: str = "lru",
        close_policy: str = "free",
        clock: Callable[[], float] = time.monotonic,
        bytes_per_token: int = 0,
        ledger: bool = True,
        history: bool = True,
    ):
        if allocator.page_size != page_size:
            raise ValueError(f"allocator page_size {allocator.page_size} != cache page_size {page_size}")
        if close_policy not in ("free", "deref"):
            raise ValueError(f"unknown close policy {close_policy!r}; known: free, deref")
        self.token_to_kv_pool_allocator = allocator
        self.page_size = page_size
        self.eviction_policy = eviction_policy.lower()
        self.eviction_strategy = get_eviction_strategy(self.eviction_policy)
        self.close_policy = close_policy
        self.clock = clock
        self.bytes_per_token = bytes_per_token
        self._next_id = 0
        self.version = 0
        self._journal = ChangeJournal(JOURNAL_LIMIT)
        self._pending_subtree: dict[TreeNode, int] = {}
        self.child_watch: dict[int, set[TreeNode]] = {}
        """Parents whose children a reader keeps in order, by id, each with the children that may
        have moved in it since the reader looked: added, removed, moved below a split, resized or
        refreshed (access times are not journaled). The reader swaps each set for a new one as
        it takes it; while nothing is watched this costs the hot paths one falsy check."""
        self.background: Callable[[Iterator[None]], None] | None = None
        """Where the cache's long passes run (the engine's slices, between its steps); None: on
        the spot (a trace replay, a test)."""
        self.ledger: SessionLedger | None = None
        self.history: CacheHistory | None = CacheHistory() if history else None
        """The nodes that left the tree, when and why, bounded (``gpu_backend.history``: ``why``);
        None: not kept."""
        self.reset()
        if ledger:
            self.ledger = SessionLedger(self.root_node, frees=close_policy == "free")
            if self.history is not None:  # (each session's figures before they move: its memory then)
                self.ledger.journal = self.history
                self.history.tells_figures(self.history.since)  # (a new tree: none held anything since)
        """Every session's figures, kept as the tree changes (None: not kept, for a benchmark's
        baseline)."""

    # ----- public API -----

    def reset(self) -> None:
        """Drop the whole tree (the caller clears the allocator, as SGLang's flush does)."""
        self._next_id += 1
        # Readers of the journal must resync: everything they hold is gone.
        self.version += 1
        self._journal.reset(self.version)
        self._pending_subtree = {}
        self.root_node = TreeNode(0, self.clock(), priority=-(2**62))
        self.root_node.lock_ref = 1
        self.nodes: dict[int, TreeNode] = {0: self.root_node}
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves: set[TreeNode] = set()
        self._evict_heap: list[tuple[Any, int, TreeNode]] = []
        self._heap_seq = 0
        self._compacting: list[tuple[Any, int, TreeNode]] | None = None  # the heap a sliced compaction trims
        self._reset_session_radix_state()
        if self.ledger is not None:
            self.ledger.reset(self.root_node)

    def page_aligned(self, key: Sequence[int]) -> tuple[int, ...]:
        key = tuple(key)
        if self.page_size == 1:
            return key
        return key[: len(key) // self.page_size * self.page_size]

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Find the longest cached prefix of ``key`` and the slots that hold it.

        Side effects, as in SGLang: every node on the matched path (and the root) gets its access
        time refreshed, which moves it back in LRU order; and when the match ends inside a node,
        that node is split in two so the match ends on a node boundary (the head gets a new id,
        the tail keeps its id). With ``page_size`` > 1 the key is first cut to whole pages.
        Use :meth:`lookup` to read without changing anything.
        """
        key = self.page_aligned(key)
        if not key:
            return MatchResult(_EMPTY_VALUE, self.root_node)
        now = self.clock()
        node = self.root_node
        node.last_access_time = now
        values: list[np.ndarray] = []
        off, n, page = 0, len(key), self.page_size
        watch = self.child_watch
        while off < n:
            child = node.children.get(key[off] if page == 1 else key[off : off + page])
            if child is None:
                break
            child.last_access_time = now
            if watch and node.id in watch:
                watch[node.id].add(child)
            prefix_len = self._key_match(child.key, key, off)
            if prefix_len < len(child.key):
                self._refresh(child)
                node = self._split_node(child, prefix_len)
                values.append(node.value)
                break
            values.append(child.value)
            node = child
            off += prefix_len
        self._refresh(node)
        if not values:
            return MatchResult(_EMPTY_VALUE, node)
        return MatchResult(values[0] if len(values) == 1 else np.concatenate(values), node)

    def lookup(self, key: Sequence[int]) -> LookupResult:
        """Longest cached prefix of ``key`` without any side effect (no split, no access time)."""
        key = self.page_aligned(key)
        node, off, n, page = self.root_node, 0, len(key), self.page_size
        while off < n:
            child = node.children.get(key[off] if page == 1 else key[off : off + page])
            if child is None:
                break
            prefix_len = self._key_match(child.key, key, off)
            if prefix_len < len(child.key):
                return LookupResult(off + prefix_len, node, child, prefix_len)
            node = child
            off += prefix_len
        return LookupResult(off, node)

    def insert(self, key: Sequence[int], value: np.ndarray | None = None, priority: int = 0) -> InsertResult:
        """Insert ``key`` with its slots; returns how many leading tokens were already cached.

        The slots of that already-cached prefix are duplicates: freeing them is the caller's job,
        as in SGLang. With no ``value`` the token ids stand in for slots (tests, simulation).
        """
        key = self.page_aligned(key)
        if value is None:
            value = np.asarray(key, dtype=np.int64)
        else:
            value = value[: len(key)]
        now = self.clock()
        node = self.root_node
        node.last_access_time = now
        node.priority = max(node.priority, priority)
        if not key:
            return InsertResult(0, node)
        off, n, page = 0, len(key), self.page_size
        watch = self.child_watch
        while off < n:
            child = node.children.get(key[off] if page == 1 else key[off : off + page])
            if child is None:
                break
            if watch and node.id in watch:
                watch[node.id].add(child)
            node = child
            node.last_access_time = now
            prefix_len = self._key_match(node.key, key, off)
            off += prefix_len
            if prefix_len < len(node.key):
                self._refresh(node)
                node = self._split_node(node, prefix_len)
            node.priority = max(node.priority, priority)
            node.hit_count += 1
            self._refresh(node)
        if off < n:
            parent = node
            node = self._new_node(parent, key[off:], value[off:].copy(), now=self.clock(), priority=priority)
            node.hit_count += 1
            self.evictable_size_ += n - off
            ancestor = parent
            while ancestor is not None:
                ancestor.subtree_tokens += n - off
                self._mark(ancestor)
                ancestor = ancestor.parent
            self._update_leaf_status(parent)
            self._update_leaf_status(node)
        return InsertResult(off, node)

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """Finish a request: insert its tokens, free the duplicate slots and the unaligned tail,
        tag its session on the node where its key ends, and unlock its matched path.

        With ``is_insert=False`` (SGLang's retract and abort path) nothing is inserted and every
        slot the request owns is freed; as in SGLang, a request with an open session still tags
        the node where ``match_prefix`` of its key ends, with that match's side effects.
        """
        token_ids = req.input_ids + req.output_ids
        key_len = len(token_ids) // self.page_size * self.page_size
        allocator = self.token_to_kv_pool_allocator
        if is_insert:
            result = self.insert(token_ids[:key_len], req.slots[:key_len], req.priority)
            allocator.free(req.slots[req.cache_protected_len : result.prefix_len])
            allocator.free(req.slots[key_len:])
            self._tag_session_leaf(req.session_id, result.last_node)
        else:
            allocator.free(req.slots[req.cache_protected_len :])
            sid = req.session_id
            if sid is not None and sid not in self._closed_session_ids:
                self._tag_session_leaf(sid, self.match_prefix(token_ids[:key_len]).last_node)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
            req.last_node = None
        req.slots = _EMPTY_VALUE

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock the path from ``node`` to the root against eviction; returns the evictable delta."""
        delta = 0
        root, ledger = self.root_node, self.ledger
        if ledger is not None and ledger.lock_watched:
            ledger.locks_moved(node)
        while node is not root:
            if node.lock_ref == 0:
                n = len(node.key)
                self.evictable_size_ -= n
                self.protected_size_ += n
                delta -= n
                node.lock_ref = 1
                if ledger is not None:
                    ledger.lock_changed(node)
            else:
                node.lock_ref += 1
            self._mark(node)
            self._update_leaf_status(node)
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unlock a path locked by :meth:`inc_lock_ref`; returns the evictable delta."""
        if node is not self.root_node and node.lock_ref <= 0:
            raise ValueError(f"dec_lock_ref on node {node.id}, which is not locked")
        delta = 0
        root, ledger = self.root_node, self.ledger
        if ledger is not None and ledger.lock_watched:
            ledger.locks_moved(node)
        while node is not root:
            if node.lock_ref == 1:
                n = len(node.key)
                self.evictable_size_ += n
                self.protected_size_ -= n
                delta += n
                node.lock_ref = 0
                if ledger is not None:
                    ledger.lock_changed(node)
            else:
                node.lock_ref -= 1
            self._mark(node)
            self._update_leaf_status(node)
            node = node.parent
        return delta

    def evict(self, num_tokens: int) -> EvictResult:
        """Free whole unlocked leaves, lowest priority first (LRU by default), until at least
        ``num_tokens`` tokens are freed or nothing evictable is left."""
        with self.ledger.batch() if self.ledger is not None else nullcontext():
            return self._evict(num_tokens)

    def _evict(self, num_tokens: int) -> EvictResult:
        num_evicted = 0
        num_nodes = 0
        free = self.token_to_kv_pool_allocator.free
        while num_evicted < num_tokens:
            x = self._pop_evictable()
            if x is None:
                break
            free(x.value)
            num_evicted += len(x.value)
            num_nodes += 1
            self._delete_leaf(x)
        self._flush_subtree()
        return EvictResult(num_evicted, num_nodes)

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens held by the tree (every node is either evictable or protected)."""
        return self.evictable_size_ + self.protected_size_

    def changes(self, since: int) -> ChangeSet:
        """Ids of nodes added, changed or removed after version ``since`` (or resync: the
        journal no longer reaches back that far, or the tree was reset since)."""
        touched = self._journal.since(since, self.version, self.nodes)
        if touched is None:
            return ChangeSet(since, self.version, True)
        return ChangeSet(since, self.version, False, *touched)

    def node_count(self) -> int:
        """Nodes in the tree, the root excluded."""
        return len(self.nodes) - 1

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, parents before children (iterative: chains can be deep)."""
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def path_tokens(self, node: TreeNode) -> list[int]:
        """All token ids from the root through ``node``."""
        parts = []
        while node is not self.root_node:
            parts.append(node.key)
            node = node.parent
        out: list[int] = []
        for part in reversed(parts):
            out.extend(part)
        return out

    def pretty_print(self) -> str:
        """The tree as indented lines (tokens, first ids, lock_ref, holders); also printed."""
        lines = []
        stack = [(self.root_node, 0)]
        while stack:
            node, depth = stack.pop()
            holders = ",".join(sorted(node.session_ids)) if node.session_ids else "-"
            lines.append(f"{' ' * depth}{len(node.key)} {list(node.key[:10])} r={node.lock_ref} s={holders}")
            stack.extend((c, depth + 2) for c in reversed(list(node.children.values())))
        lines.append(f"#tokens: {self.total_size()}")
        text = "\n".join(lines)
        print(text)
        return text

    # ----- internal helpers -----

    def _child_key(self, key: tuple[int, ...]) -> Any:
        return key[0] if self.page_size == 1 else key[: self.page_size]

    def _key_match(self, node_key: tuple[int, ...], key: tuple[int, ...], off: int) -> int:
        """Length of the common prefix of ``node_key`` and ``key[off:]``, in whole pages."""
        m = len(node_key)
        if key[off : off + m] == node_key:
            return m
        n = min(m, len(key) - off)
        # Gallop in doubling windows (one C-level compare each), then bisect the window that
        # holds the first difference: no per-token Python loop on long shared prefixes.
        lo, step, matched = 0, 1, n
        while lo < n:
            hi = min(lo + step, n)
            if key[off + lo : off + hi] != node_key[lo:hi]:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if key[off + lo : off + mid] == node_key[lo:mid]:
                        lo = mid
                    else:
                        hi = mid
                matched = lo
                break
            lo = hi
            step *= 2
        page = self.page_size
        return matched if page == 1 else matched // page * page

    def _new_node(
        self, parent: TreeNode, key: tuple[int, ...], value: np.ndarray, now: float, priority: int = 0
    ) -> TreeNode:
        node = TreeNode(self._next_id, now, priority)
        self._next_id += 1
        node.parent = parent
        node.key = key
        node.value = value
        parent.children[self._child_key(key)] = node
        self.nodes[node.id] = node
        node.subtree_tokens = len(key)
        self._mark(node)
        node.created_version = self.version
        if self.ledger is not None:
            self.ledger.added(node)
        if self.history is not None:
            self.history.stored(node.id, ROOT if parent is self.root_node else parent.id, len(key))
        return node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Split ``child`` after ``split_len`` tokens; returns the new head (the tail keeps its id)."""
        parent = child.parent
        head = TreeNode(self._next_id, self.clock(), priority=child.priority)
        self._next_id += 1
        head.hit_count = child.hit_count
        head.lock_ref = child.lock_ref
        head.key = child.key[:split_len]
        head.value = child.value[:split_len].copy()
        head.parent = parent
        child.key = child.key[split_len:]
        child.value = child.value[split_len:].copy()
        child.parent = head
        if self.child_watch and parent.id in self.child_watch:
            self.child_watch[parent.id].add(child)  # (its parent's no more: the head took its place)
        head.children = {self._child_key(child.key): child}
        parent.children[self._child_key(head.key)] = head
        self.nodes[head.id] = head
        head.subtree_tokens = child.subtree_tokens
        child.subtree_tokens -= split_len
        self._mark(child)
        self._mark(head)
        head.created_version = self.version
        if self.ledger is not None:
            self.ledger.split(head, child)
        if self.history is not None:
            self.history.split(head.id, child.id, split_len)
        return head

    def _delete_leaf(self, node: TreeNode) -> None:
        """Remove a leaf. Its parent's subtree size is exact at once; the ancestors above are
        settled by ``_flush_subtree`` at the end of the operation, so freeing a whole chain
        costs O(depth) once, not once per node."""
        parent = node.parent
        holders = node.session_ids  # (the history's; dropped from the node next)
        self._discard_session_leaf(node)
        del parent.children[self._child_key(node.key)]
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.discard(node)
        del self.nodes[node.id]
        node.parent = None
        if self.child_watch and parent.id in self.child_watch:
            self.child_watch[parent.id].add(node)
        gone = len(node.key) + self._pending_subtree.pop(node, 0)
        parent.subtree_tokens -= gone
        self._pending_subtree[parent] = self._pending_subtree.get(parent, 0) + gone
        self._mark(node)
        self._mark(parent)
        self._update_leaf_status(parent)
        if self.ledger is not None:
            self.ledger.removed(node, parent)
        if self.history is not None:
            self.history.removed(node.id, ROOT if parent is self.root_node else parent.id, node.key, holders)

    def _flush_subtree(self) -> None:
        pending, self._pending_subtree = self._pending_subtree, {}
        for node, amount in pending.items():
            ancestor = node.parent
            while ancestor is not None:
                ancestor.subtree_tokens -= amount
                self._mark(ancestor)
                ancestor = ancestor.parent

    def _mark(self, node: TreeNode) -> None:
        self.version += 1
        self._journal.record(node.id)
        if self.child_watch and node.parent is not None and node.parent.id in self.child_watch:
            self.child_watch[node.parent.id].add(node)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        elif node not in self.evictable_leaves:
            self.evictable_leaves.add(node)
            self._push_evictable(node)

    def _evict_key(self, node: TreeNode) -> Any:
        priority = self.eviction_strategy.get_priority(node)
        if self.close_policy == "deref":
            # Unheld nodes go before held ones; within each, the eviction strategy decides.
            return (1 if node.session_ids else 0, priority)
        return priority

    def _push_evictable(self, node: TreeNode) -> None:
        self._heap_seq += 1
        node.heap_seq = self._heap_seq
        heapq.heappush(self._evict_heap, (self._evict_key(node), self._heap_seq, node))
        # Stale entries pile up between evictions (every touch of a leaf re-keys it): compact
        # once they outnumber live ones 4 to 1, which keeps pushes amortised O(log n).
        if self._compacting is None and len(self._evict_heap) > 4 * len(self.evictable_leaves) + 1024:
            if self.background is None:
                self._compact_heap()
            else:  # a large heap takes seconds to compact: in slices between the owner's steps
                self._compacting = self._evict_heap
                self.background(self._compact_pass())

    def _refresh(self, node: TreeNode) -> None:
        """Re-key an evictable leaf after its access time, hit count, priority or holders changed."""
        if node in self.evictable_leaves:
            self._push_evictable(node)

    def _pop_evictable(self) -> TreeNode | None:
        heap = self._evict_heap
        while heap:
            key, seq, node = heapq.heappop(heap)
            # Live: an evictable leaf's last push, under its current key. Every other entry is
            # stale for good (the node stopped being an evictable leaf, or was pushed again since:
            # a leaf that becomes evictable again is pushed again), so dropping one early, as the
            # compaction does, changes no eviction.
            if node in self.evictable_leaves and seq == node.heap_seq and key == self._evict_key(node):
                return node
        return None

    def _compact_pass(self, chunk: int = 1024) -> Iterator[None]:
        """The compaction as a pass that yields every ``chunk`` entries looked at: the heap's stale
        entries dropped in place, from its last entry back to its first, each removal restoring
        the heap (as ``heappop`` does), so evictions and pushes go on using it between the steps.

        No step allocates or lists anything proportional to the cache: no second heap (a list
        grown to the ~780k live entries of a 1M-node tree was reallocated into fresh memory, steps
        of 4-5.6 ms with ~1,000-1,500 page faults) and no walk of the tree (a node's children
        listed at once: 100k children in the bench's tree). Dropped entries are freed as they go,
        ``_REMOVAL_WORK`` each against the chunk; at 1M nodes no step took 1 ms of CPU. The price:
        every entry is looked at in Python (3.1M at 1M nodes: 3.8 s of CPU in all, 2.3x the walk
        and the freeing of an old heap that this replaced).

        Correct under the owner's changes between steps: only entries that fail
        ``_pop_evictable``'s test are dropped, and that test stays failed, so no eviction changes.
        A pop moves entries only towards the front, but for the last entry (looked at already, or
        pushed since), so the entries not yet looked at stay before the cursor; a push may move
        one of them behind it, which leaves a stale entry for the next compaction. A reset ends
        the pass."""
        heap = self._compacting
        leaves, key_of = self.evictable_leaves, self._evict_key
        sift_up, sift_down = heapq._siftdown, heapq._siftup  # heapq's own (its names: towards the root, away)
        i = len(heap) - 1
        while True:
            n = len(heap)  # evictions between steps shorten it
            i = min(i, n - 1)
            budget = chunk
            while budget > 0 and i >= 0:
                key, seq, node = heap[i]
                budget -= 1
                if seq == node.heap_seq and node in leaves and key == key_of(node):
                    i -= 1
                    continue
                # stale: the last entry (looked at already, or pushed since) takes its place and
                # moves up or down to restore the heap; an ancestor of ``i`` that it passes on its
                # way up ends on ``i``, and is looked at next
                last = heap.pop()
                n -= 1
                budget -= _REMOVAL_WORK
                if i < n:
                    heap[i] = last
                    if i and last < heap[(i - 1) >> 1]:
                        sift_up(heap, 0, i)
                        continue
                    if 2 * i + 1 < n:
                        sift_down(heap, i)
                        budget -= (n // (i + 1)).bit_length()
                i -= 1
            if i < 0:
                break
            yield
            if self._compacting is not heap:  # the cache was reset meanwhile
                return
            leaves = self.evictable_leaves
        self._compacting = None

    def _compact_heap(self) -> None:
        """The compaction at once (no background to run ``_compact_pass``): the live entries only."""
        leaves, key_of = self.evictable_leaves, self._evict_key
        self._evict_heap = [(key, seq, node) for key, seq, node in self._evict_heap
                            if node in leaves and seq == node.heap_seq and key == key_of(node)]
        heapq.heapify(self._evict_heap)
