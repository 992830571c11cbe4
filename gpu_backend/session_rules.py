"""SessionRadixCacheMixin's close rules (SGLang 0.5.15/0.5.16) as pure functions over any radix tree.

They read only ``parent``, ``children``, ``lock_ref``, ``key`` (its length) and, where a node is
tagged, ``session_ids`` (a set; absent or None when untagged). That is radixtop's ``TreeNode``
and SGLang's alike, so the bundled cache and the SGLang adapters plan and attribute with the
same code.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from typing import Any, TypeVar

from radixtop.gpu_backend.owner.slices import released, run_to_end

# Why an upward walk stopped, in SessionRadixCacheMixin's order of checks.
STOP_ROOT = "root"
STOP_LOCKED = "locked"
STOP_CHILDREN = "has_children"
STOP_SHARED = "shared"

Node = Any  # a tree node of either implementation
T = TypeVar("T")


def holders_of(node: Node) -> set[str] | None:
    return getattr(node, "session_ids", None)


def plan_release(root: Node, tagged: Iterable[Node], session_id: str) -> tuple[list[Node], dict[Node, str], int]:
    """What SessionRadixCacheMixin's close of ``session_id`` frees now, given the nodes it tagged (in the
    order the close visits them): (freed nodes in order, {kept node: why}, holds released).

    Replays the upward walk over an overlay (holders dropped, children deleted) instead of the
    tree, so walks that meet on a shared parent see each other's effect. With lock_ref 0 and no
    children left, a node is an evictable leaf, so the mixin's evictable check needs no overlay.
    """
    holding = [n for n in tagged if session_id in (holders_of(n) or ())]
    dropped: set[Node] = set()
    deleted_children: dict[Node, int] = {}
    freed: list[Node] = []
    kept: dict[Node, str] = {}
    for leaf in holding:
        if leaf in dropped:
            continue
        node = leaf
        while True:
            held = holders_of(node)
            if held and session_id in held:
                dropped.add(node)
            others = len(held or ()) - (1 if node in dropped else 0)
            children = len(node.children) - deleted_children.get(node, 0)
            reason = None
            if node is root:
                reason = STOP_ROOT
            elif node.lock_ref != 0:
                reason = STOP_LOCKED
            elif children != 0:
                reason = STOP_CHILDREN
            elif others > 0:
                reason = STOP_SHARED
            if reason is not None:
                if node is not root:
                    kept[node] = reason
                break
            freed.append(node)
            kept.pop(node, None)
            parent = node.parent
            deleted_children[parent] = deleted_children.get(parent, 0) + 1
            node = parent
    return freed, kept, len(holding)


def exclusive_tokens(root: Node, session_leaves: Mapping[str, Collection[Node]],
                     on_paths: Collection[Node] | None = None) -> dict[str, int]:
    """Tokens each session's close would free right now (``plan_release`` for every session
    at once), in one pass over the sessions' paths, not one walk per session.

    Under the mixin's rule a close of ``s`` frees node ``n`` exactly when nothing in n's subtree
    is locked, no other session holds anything there, and every leaf there is one ``s`` tagged
    (only walks from s's tags free, and they free leaves upward). So each node on some session's
    path gets an owner, bottom-up: the one session whose close frees it.

    ``on_paths``: the nodes on the sessions' paths, when the caller has them already (a set or
    a dict's keys view); found here otherwise.
    """
    return run_to_end(exclusive_tokens_pass(root, session_leaves, on_paths))


def exclusive_tokens_pass(root: Node, session_leaves: Mapping[str, Collection[Node]],
                           on_paths: Collection[Node] | None = None,
                           chunk: int = 1024,
                           new_map: Callable[[], Any] = dict,
                           ) -> Generator[None, None, dict[str, int]]:
    """``exclusive_tokens`` as a generator that yields after every ``chunk`` nodes, so the owner
    thread can run it between its steps. Run straight through, it is exact; with the tree
    changing between slices it never fails, and a node that changed meanwhile counts for no one
    (a node deleted since has no holders; one added since is not on the paths). ``new_map``
    makes its map of a node's owner (one entry per node on the paths: at 1M nodes, a
    ``ShardedMap`` keeps its growth out of single chunks)."""
    if on_paths is None:
        on_paths = set()
        for leaves in session_leaves.values():
            for leaf in leaves:
                node = leaf
                while node is not root and node is not None and node not in on_paths:
                    on_paths.add(node)
                    node = node.parent
    owner = new_map()
    stack: list[tuple[Node, bool]] = []
    # the walk starts at the root's children on the paths, taken from the paths a chunk at a time
    # rather than by a copy of the root's children in one (a forest: as many as its prompts)
    for k, node in enumerate(on_paths):
        if node.parent is root:
            stack.append((node, False))
        if k % chunk == chunk - 1:
            yield
    budget = chunk
    while stack:
        budget -= 1
        if not budget:
            yield
            budget = chunk
        node, children_done = stack.pop()
        children = node.children
        if not children_done:
            stack.append((node, True))
            if len(children) <= chunk:
                stack.extend([(c, False) for c in children.values() if c in on_paths])
            else:  # a wide node (a system prompt under 10k sessions): its children a chunk at a time
                kids = list(children.values())
                for start in range(0, len(kids), chunk):
                    stack.extend([(c, False) for c in kids[start : start + chunk] if c in on_paths])
                    yield
            continue
        held = holders_of(node)
        if node.lock_ref != 0 or (held and len(held) > 1):
            owner[node] = None
            continue
        held_by = next(iter(held)) if held else None
        if not children:
            owner[node] = held_by
            continue
        below: str | None = None
        for k, child in enumerate(list(children.values()) if len(children) >= chunk else children.values()):
            child_owner = owner.get(child)
            if child_owner is None or (below is not None and child_owner != below):
                below = None
                break
            below = child_owner
            if k % chunk == chunk - 1:
                yield
        owner[node] = below if held_by is None or held_by == below else None
    exclusive: dict[str, int] = {}
    for k, sid in enumerate(list(session_leaves)):  # ids only: 50k (id, leaves) pairs took ms
        if session_leaves.get(sid):
            exclusive[sid] = 0
        if k % chunk == chunk - 1:
            yield
    for node, sid in owner.items():
        budget -= 1
        if not budget:
            yield
            budget = chunk
        if sid is not None:
            exclusive[sid] = exclusive.get(sid, 0) + len(node.key)
    yield from released(owner)
    return exclusive
