"""``why`` over a tree that keeps its history (``gpu_backend.history.CacheHistory``): the prompt's
cached path read from the live tree, then what of the rest was cached before (issue 29)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixtop.adapters.model import LostView, WhyView
from radixtop.gpu_backend.history import CacheHistory, Lost


def lost_view(lost: Lost) -> LostView:
    g = lost.ghost
    protected, capacity = g.pool if g.pool is not None else (None, None)
    return LostView(lost.start, lost.end, g.cause, g.at, g.node_id, g.session_id,  # type: ignore[arg-type]
                    g.holders, protected, capacity, g.who)


def live_path(node: Any, end: int, root: Any) -> list[tuple[int, int]]:
    """``(id, end)`` of each node from ``root`` down to ``node`` (whose path ends at token ``end``),
    walked up by ``parent`` and ``key`` (no pass over the tree: the path's nodes only)."""
    path: list[tuple[int, int]] = []
    while node is not None:
        path.append((node.id, end))
        if node is root:
            break
        end -= len(node.key)
        node = node.parent
    path.reverse()
    return path


def why_view(history: CacheHistory, tokens: Sequence[int], live: list[tuple[int, int]], cached: int,
             node_id: int, partial_node_id: int | None, partial_tokens: int, page_size: int = 1) -> WhyView:
    lost = history.explain(tokens, live, cached, page_size)
    return WhyView(len(tokens), cached, cached, node_id, partial_node_id, partial_tokens,
                   tuple(lost_view(one) for one in lost), history.reaches_back_to())
