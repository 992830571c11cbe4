"""Session tagging and close: SGLang 0.5.16's SessionRadixCacheMixin rules exactly, plus a plan.

A finishing request with a session id tags the node where its key ends; a node keeps the set of
sessions that hold it. Closing a session tombstones its id, then walks up from each node it
tagged: drop the id; stop at the root, at a locked node, at a node with children, at a node that
is not an evictable leaf, or at one other sessions still hold; otherwise free the node and go on
with its parent. Shared prefixes survive until their last holder closes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixtop.gpu_backend.history import CLOSED, caused
from radixtop.gpu_backend.session_rules import exclusive_tokens, plan_release

if TYPE_CHECKING:
    from radixtop.gpu_backend.radix_cache import TreeNode

# A request that finishes after its session was closed must not tag again; the guard is bounded,
# so after 8192 later closes a very late finish can tag once more (as in SessionRadixCacheMixin).
CLOSED_SESSION_TOMBSTONE_LIMIT = 8192



@dataclass(frozen=True)
class KeptNode:
    """A node on the session's paths that the close leaves in place, and why."""

    node_id: int
    tokens: int
    reason: str


@dataclass(frozen=True)
class ClosePlan:
    """What closing ``session_id`` would do right now; computed without changing anything."""

    session_id: str
    policy: str
    known: bool
    already_closed: bool
    freed_node_ids: tuple[int, ...]
    freed_tokens: int
    freed_bytes: int
    released_holds: int
    kept: tuple[KeptNode, ...]

    @property
    def freed_nodes(self) -> int:
        return len(self.freed_node_ids)


@dataclass(frozen=True)
class CloseResult:
    """What a close did."""

    session_id: str
    policy: str
    already_closed: bool
    freed_node_ids: tuple[int, ...]
    freed_tokens: int
    freed_bytes: int
    released_holds: int

    @property
    def freed_nodes(self) -> int:
        return len(self.freed_node_ids)


class SessionRadixCacheMixin:
    """Session holders, the per-session index of tagged nodes, tombstones, close and its plan.

    Mixed into RadixCache; uses its root, allocator, evictable leaves and ``_delete_leaf``.
    """

    def _reset_session_radix_state(self) -> None:
        # Insertion-ordered (dict, not set) so that a close frees slots in a reproducible order.
        self._session_leaves: dict[str, dict[TreeNode, None]] = {}
        self._closed_session_ids: OrderedDict[str, None] = OrderedDict()
        self.closed_session_limit = CLOSED_SESSION_TOMBSTONE_LIMIT
        """Tombstones kept; the oldest is forgotten past it (its session counts as open again)."""

    # ----- queries -----

    def is_session_closed(self, session_id: str) -> bool:
        return session_id in self._closed_session_ids

    def session_ids(self) -> list[str]:
        """Sessions that hold at least one node now (the index), closed ones excluded."""
        return [s for s in self._session_leaves if s not in self._closed_session_ids]

    def closed_session_ids(self) -> list[str]:
        return list(self._closed_session_ids)

    def session_nodes(self, session_id: str) -> list[TreeNode]:
        """The nodes ``session_id`` tagged and still holds."""
        return list(self._session_leaves.get(session_id, ()))

    # ----- tagging -----

    def register_session(self, session_id: str) -> None:
        """Open (or reopen) a session id: clears its tombstone so its requests tag again."""
        self._closed_session_ids.pop(session_id, None)

    def _remember_closed_session(self, session_id: str) -> None:
        self._closed_session_ids[session_id] = None
        self._closed_session_ids.move_to_end(session_id)
        while len(self._closed_session_ids) > self.closed_session_limit:
            self._closed_session_ids.popitem(last=False)

    def _tag_session_leaf(self, session_id: str | None, node: TreeNode) -> None:
        """Add ``session_id`` to the holders of ``node``; nothing for requests without a session,
        for a closed (tombstoned) session, or for the root."""
        if session_id is None or session_id in self._closed_session_ids or node is self.root_node:
            return
        if node.session_ids is None:
            node.session_ids = set()
        node.session_ids.add(session_id)
        self._session_leaves.setdefault(session_id, {})[node] = None
        if self.ledger is not None:
            self.ledger.tag(session_id, node)
        self._mark(node)
        if self.close_policy == "deref":
            self._refresh(node)

    def _discard_session_leaf(self, node: TreeNode) -> None:
        """A node leaves the tree: drop it from the index of every session that held it."""
        if not node.session_ids:
            return
        for sid in tuple(node.session_ids):  # (the ledger drops them where the node leaves: removed)
            leaves = self._session_leaves.get(sid)
            if leaves is not None:
                leaves.pop(node, None)
                if not leaves and sid not in self._closed_session_ids:
                    self._session_leaves.pop(sid, None)
        node.session_ids = None

    # ----- close -----

    def release_radix_session(self, session_id: str) -> CloseResult:
        """Close ``session_id``. Closing an unknown or already closed session frees nothing."""
        already_closed = session_id in self._closed_session_ids
        self._remember_closed_session(session_id)
        indexed = self._session_leaves.pop(session_id, {})
        if self.ledger is not None:  # every hold of the session dropped at once, before the tree changes
            self.ledger.drop(session_id, indexed)
        if self.close_policy == "deref":
            holds = 0
            for node in indexed:
                if node.session_ids and session_id in node.session_ids:
                    self._drop_holder(node, session_id)
                    holds += 1
                    self._refresh(node)
            return CloseResult(session_id, "deref", already_closed, (), 0, 0, holds)
        # (no ledger batch: ``ledger.drop`` left each node it walked settled, so what the walk
        # frees settles only the parent it leaves, once)
        with caused(self.history, CLOSED, session_id=session_id):
            return self._release_free(session_id, already_closed, indexed)

    def _release_free(self, session_id: str, already_closed: bool, indexed: dict[TreeNode, None]) -> CloseResult:
        freed: list[int] = []
        freed_tokens = 0
        holds = sum(1 for n in indexed if n.session_ids and session_id in n.session_ids)
        free = self.token_to_kv_pool_allocator.free
        for leaf in indexed:
            if not leaf.session_ids or session_id not in leaf.session_ids:
                continue
            node = leaf
            while True:
                if node.session_ids is not None:
                    self._drop_holder(node, session_id)
                if (
                    node is self.root_node
                    or node.lock_ref != 0
                    or len(node.children) != 0
                    or node not in self.evictable_leaves
                    or node.session_ids
                ):
                    break
                parent = node.parent
                free(node.value)
                freed.append(node.id)
                freed_tokens += len(node.key)
                self._delete_leaf(node)
                node = parent
        self._flush_subtree()
        return CloseResult(
            session_id, "free", already_closed, tuple(freed), freed_tokens,
            freed_tokens * self.bytes_per_token, holds,
        )

    def plan_close(self, session_id: str) -> ClosePlan:
        """Exactly what :meth:`release_radix_session` would free now, with nothing changed
        (``session_rules.plan_release``: the mixin's walk over an overlay)."""
        known = session_id in self._session_leaves
        already_closed = session_id in self._closed_session_ids
        indexed = self._session_leaves.get(session_id, {})
        if self.close_policy == "deref":
            holding = [n for n in indexed if n.session_ids and session_id in n.session_ids]
            kept = tuple(KeptNode(n.id, len(n.key), "deref") for n in holding)
            return ClosePlan(session_id, "deref", known, already_closed, (), 0, 0, len(holding), kept)
        freed, kept, holds = plan_release(self.root_node, indexed, session_id)
        freed_tokens = sum(len(n.key) for n in freed)
        return ClosePlan(
            session_id, "free", known, already_closed, tuple(n.id for n in freed), freed_tokens,
            freed_tokens * self.bytes_per_token, holds,
            tuple(KeptNode(n.id, len(n.key), why) for n, why in kept.items()),
        )

    def exclusive_tokens_by_session(self, on_paths: Collection[TreeNode] | None = None) -> dict[str, int]:
        """Tokens each session's close would free right now, every session in one pass
        (``session_rules.exclusive_tokens``); none under the deref policy."""
        if self.close_policy == "deref":
            return {sid: 0 for sid, leaves in self._session_leaves.items() if leaves}
        return exclusive_tokens(self.root_node, self._session_leaves, on_paths)

    def _drop_holder(self, node: TreeNode, session_id: str) -> None:
        """``session_id`` no longer holds ``node`` (a close: the ledger was told by ``drop``)."""
        self._mark(node)
        node.session_ids.discard(session_id)
        if not node.session_ids:
            node.session_ids = None
