"""Session tagging and close: the seed's rules (SGLang 0.5.16 SessionRadixCacheMixin), plus a plan.

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

if TYPE_CHECKING:
    from gpu_backend.radix_cache import TreeNode

# A request that finishes after its session was closed must not tag again; the guard is bounded,
# so after 8192 later closes a very late finish can tag once more (as in the seed).
CLOSED_SESSION_TOMBSTONE_LIMIT = 8192

# Why an upward walk stopped, in the seed's order of checks.
STOP_ROOT = "root"
STOP_LOCKED = "locked"
STOP_CHILDREN = "has_children"
STOP_NOT_EVICTABLE = "not_evictable"
STOP_SHARED = "shared"


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
        while len(self._closed_session_ids) > CLOSED_SESSION_TOMBSTONE_LIMIT:
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
        self._mark(node)
        if self.close_policy == "deref":
            self._refresh(node)

    def _discard_session_leaf(self, node: TreeNode) -> None:
        """A node leaves the tree: drop it from the index of every session that held it."""
        if not node.session_ids:
            return
        for sid in tuple(node.session_ids):
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
        if self.close_policy == "deref":
            holds = 0
            for node in indexed:
                if node.session_ids and session_id in node.session_ids:
                    self._drop_holder(node, session_id)
                    holds += 1
                    self._refresh(node)
            return CloseResult(session_id, "deref", already_closed, (), 0, 0, holds)
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
        """Exactly what :meth:`release_radix_session` would free now, with nothing changed.

        Replays the seed's walk over an overlay (holders dropped, children deleted) instead of the
        tree itself, so walks that meet on a shared parent see each other's effect.
        """
        known = session_id in self._session_leaves
        already_closed = session_id in self._closed_session_ids
        indexed = self._session_leaves.get(session_id, {})
        holding = [n for n in indexed if n.session_ids and session_id in n.session_ids]
        if self.close_policy == "deref":
            kept = tuple(KeptNode(n.id, len(n.key), "deref") for n in holding)
            return ClosePlan(session_id, "deref", known, already_closed, (), 0, 0, len(holding), kept)
        dropped: set[TreeNode] = set()
        deleted_children: dict[TreeNode, int] = {}
        freed: list[int] = []
        kept: dict[int, KeptNode] = {}
        freed_tokens = 0
        for leaf in holding:
            if leaf in dropped:
                continue
            node = leaf
            while True:
                if node.session_ids and session_id in node.session_ids:
                    dropped.add(node)
                others = len(node.session_ids or ()) - (1 if node in dropped else 0)
                children = len(node.children) - deleted_children.get(node, 0)
                reason = None
                if node is self.root_node:
                    reason = STOP_ROOT
                elif node.lock_ref != 0:
                    reason = STOP_LOCKED
                elif children != 0:
                    reason = STOP_CHILDREN
                elif others > 0:
                    reason = STOP_SHARED
                # (With lock_ref 0 and no children left, a node is an evictable leaf.)
                if reason is not None:
                    if node is not self.root_node:
                        kept[node.id] = KeptNode(node.id, len(node.key), reason)
                    break
                freed.append(node.id)
                kept.pop(node.id, None)
                freed_tokens += len(node.key)
                parent = node.parent
                deleted_children[parent] = deleted_children.get(parent, 0) + 1
                node = parent
        return ClosePlan(
            session_id, "free", known, already_closed, tuple(freed), freed_tokens,
            freed_tokens * self.bytes_per_token, len(holding), tuple(kept.values()),
        )

    def exclusive_tokens_by_session(self, on_paths: Collection[TreeNode] | None = None) -> dict[str, int]:
        """Tokens each session's close would free right now: ``plan_close(s).freed_tokens`` for
        every session at once, in one pass over the sessions' paths (not one walk per session).

        Under the seed's rule a close of ``s`` frees node ``n`` exactly when nothing in n's
        subtree is locked, no other session holds anything there, and every leaf there is one
        ``s`` tagged (only walks from s's tags free, and they free leaves upward). So each node
        on some session's path gets an owner, bottom-up: the one session whose close frees it.

        ``on_paths``: the nodes on the sessions' paths, when the caller has them already (a set
        or a dict's keys view); found here otherwise.
        """
        if self.close_policy == "deref":
            return {sid: 0 for sid, leaves in self._session_leaves.items() if leaves}
        root = self.root_node
        if on_paths is None:
            on_paths = set()
            for leaves in self._session_leaves.values():
                for leaf in leaves:
                    node = leaf
                    while node is not root and node not in on_paths:
                        on_paths.add(node)
                        node = node.parent
        owner: dict[TreeNode, str | None] = {}
        stack: list[tuple[TreeNode, bool]] = [(n, False) for n in root.children.values() if n in on_paths]
        while stack:
            node, children_done = stack.pop()
            if not children_done:
                stack.append((node, True))
                stack.extend((c, False) for c in node.children.values() if c in on_paths)
                continue
            holders = node.session_ids
            if node.lock_ref != 0 or (holders and len(holders) > 1):
                owner[node] = None
                continue
            held_by = next(iter(holders)) if holders else None
            if not node.children:
                owner[node] = held_by
                continue
            below: str | None = None
            for child in node.children.values():
                child_owner = owner.get(child)
                if child_owner is None or (below is not None and child_owner != below):
                    below = None
                    break
                below = child_owner
            owner[node] = below if held_by is None or held_by == below else None
        exclusive = {sid: 0 for sid, leaves in self._session_leaves.items() if leaves}
        for node, sid in owner.items():
            if sid is not None:
                exclusive[sid] = exclusive.get(sid, 0) + len(node.key)
        return exclusive

    def _drop_holder(self, node: TreeNode, session_id: str) -> None:
        self._mark(node)
        node.session_ids.discard(session_id)
        if not node.session_ids:
            node.session_ids = None
