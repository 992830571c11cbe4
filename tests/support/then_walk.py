"""The tree at a past moment read whole, page by page from the root (``then_children``), for the
real-server tests: every node then, and each one's listed children."""

from __future__ import annotations

from typing import Any

from radixtop.adapters.model import ROOT_ID


def tree_then(target: Any, at: float, limit: int = 1000) -> tuple[dict[int, Any], dict[int, list[Any]]]:
    """Every node of the tree at ``at`` by id, and each node's children then (the root's under 0)."""
    nodes: dict[int, Any] = {}
    listed: dict[int, list[Any]] = {}
    stack = [ROOT_ID]
    while stack:
        node_id = stack.pop()
        children: list[Any] = []
        while True:
            page = target.then_children(at, node_id, len(children), limit)
            children.extend(page.children)
            if len(children) >= page.total or not page.children:
                break
        listed[node_id] = children
        for child in children:
            assert child.id not in nodes, "a node listed twice"
            nodes[child.id] = child
            if child.num_children:
                stack.append(child.id)
    return nodes, listed


def check_tree_then(target: Any, view: Any) -> dict[int, Any]:
    """The tree at ``view.at`` (a ``then`` answer) agrees with it: its tokens then are the nodes'
    own, and the root's children's subtrees; the nodes that left since are its left ones, by cause;
    each node's children are as many as it says."""
    nodes, listed = tree_then(target, view.at)
    assert sum(n.tokens for n in nodes.values()) == view.tokens_then
    assert sum(n.subtree_tokens for n in listed[ROOT_ID]) == view.tokens_then
    for node_id, n in nodes.items():
        assert n.num_children == len(listed.get(node_id, ())), node_id
        assert n.subtree_tokens == n.tokens + sum(c.subtree_tokens for c in listed.get(node_id, ())), node_id
    left = [n for n in nodes.values() if n.left_at is not None]
    by_cause: dict[str, int] = {}
    for n in left:
        assert n.left_at > view.at
        by_cause[n.left_cause] = by_cause.get(n.left_cause, 0) + n.tokens
    assert by_cause == view.left_by_cause and len(left) == view.left_nodes
    return nodes
