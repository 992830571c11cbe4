"""A tree's change journal: the ids of the nodes each change touched, for readers that follow the
tree (``changes(since)``) instead of reading it again."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import islice
from typing import Any

JOURNAL_LIMIT = 200_000
"""Changes kept; a reader further behind than this must resync."""


class ChangeJournal:
    """The last ``limit`` changes of a tree whose ``version`` counts them one by one: each entry is
    a node id, and the entry ``i`` places from the right end has version ``version - i`` (no tuple
    per entry on the tree's hot path). ``record(node_id)`` after each ``version += 1``;
    ``reset(version)`` where the tree was dropped (every reader resyncs)."""

    __slots__ = ("_ids", "_floor", "record")

    def __init__(self, limit: int = JOURNAL_LIMIT) -> None:
        self._ids: deque[int] = deque(maxlen=limit)
        self._floor = 0
        self.record = self._ids.append
        """Record the node id of the change that made the tree's current version."""

    def reset(self, version: int) -> None:
        """The tree was dropped at ``version``: nothing before it can be followed."""
        self._ids.clear()
        self._floor = version

    def since(self, since: int, version: int,
              nodes: Mapping[int, Any]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
        """The ids added, changed and removed after version ``since``, the tree being at ``version``
        with ``nodes`` by id (each with its ``created_version``); None where the reader must resync
        (the journal no longer reaches back that far, or the tree was reset since)."""
        ids = self._ids
        oldest = version - len(ids) + 1  # the version of ids[0]
        if since < max(self._floor, oldest - 1) or since > version:
            return None
        added, changed, removed = [], [], []
        for node_id in dict.fromkeys(islice(reversed(ids), version - since)):
            node = nodes.get(node_id)
            if node is None:
                removed.append(node_id)
            elif node.created_version > since:
                added.append(node_id)
            else:
                changed.append(node_id)
        return tuple(added), tuple(changed), tuple(removed)
