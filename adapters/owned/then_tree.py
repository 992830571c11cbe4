"""The tree at a past moment, node by node (issue 29's time travel): a page of a node's children
as they were then, browsed as the tree now is (``CacheAdapter.then_children``, ``GET
/v1/then/children``, the dashboard timeline's tree).

The tree then is the tree now less the nodes stored since, plus the nodes that left since
(``gpu_backend.history.ThenFold`` over the history's changes since the moment). What is kept of a
moment asked (``ThenTree``) is that fold, fed on each read with the changes since the last only;
a node's children then are its children now that were there then (read from the tree, a page at a
time) and the nodes that left since from below it. A node that was split since shows as the nodes
it is now.

The figures of a node still in the tree, then: its subtree's tokens are its subtree's now, less
what was stored below it since, plus what left from below it since. Each branch stored or left
hangs below one node that was there then and is still here (a *boundary*); the paths from the
root to the boundaries (``CacheAdapter.paths``, read again when the fold changed) say which nodes
each branch is below. Its holders then are not kept (the tags of a live node are not journaled):
None, unknown; its lock_ref and hit_count too. A node that left says when, why and whose
(``left_at``, ``left_cause``, ``left_by``), and the sessions that held it then.

Reads of the tree and of its history are not one moment on a tree that changes while they are
read: a change between the two may be counted in a figure of the page it came with, or missed
until the next read (a node stored then is not among the nodes then: it is in the fold read after
the page)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator
from typing import Any

from radixtop.adapters.base import check_page
from radixtop.adapters.errors import AdapterError, UnknownNode, Unsupported
from radixtop.adapters.model import FIRST_TOKENS, MAX_PATHS, ROOT_ID, ChildrenPage, NodeView
from radixtop.adapters.text import decode_preview
from radixtop.gpu_backend.history import ROOT, CacheHistory, Ghost, ThenFold

from .why import changes_from, check_moment

MAX_THEN_CHILDREN = 100_000
"""A node's children read at most for a page of its children then (the rest: left out, said by
``total``)."""
LIVE_PAGE = 100
"""Children now read a read (a page of ``CacheAdapter.children``, each child's view ~5 us on the
bundled engine: 2,000 a read held it ~5 ms at once, 250 a read 1.8-2.6 ms, ``bench_then_tree.py``)."""
PATHS_A_READ = MAX_PATHS // 4
"""Boundaries whose paths one read asks for (a read of 1,024 held the bundled engine ~5 ms at once:
``bench_then_tree.py``)."""
THEN_TREES_KEPT = 2
"""Moments whose tree then is kept between reads (the one browsed, and the step before it)."""

Start = tuple[int, int]
More = Callable[[float | None, Start | None], tuple[float, tuple[list[Ghost], list[Any], Start]]]
"""Reads the history's changes (on the owner thread, in slices) from a place (None: from the moment
``at``, checked; None: as far back as it reaches): the moment, and the removals, the changes and
the place past them (``then_more``)."""


def then_more(history: CacheHistory, at: float | None,
              start: Start | None) -> Generator[None, None, tuple[float, tuple[list[Ghost], list[Any], Start]]]:
    """The owner thread's part of a read of the tree then: the changes since the moment (its first
    read) or since the last read (``start``)."""
    at, _ = check_moment(history, at)  # (a kept moment too: a gap since, or the bounds, and it is gone)
    if start is None:
        start = history.first_after(at)
    return at, (yield from changes_from(history, at, start))


class ThenTree:
    """One moment's tree then, kept between reads: the fold of the changes since it, and what the
    pages need of it (rebuilt when a read fed it changes)."""

    def __init__(self, at: float, start: Start) -> None:
        self.at = at
        self.place = start
        self.lock = threading.Lock()
        """Held while it is fed or read (``ThenTrees``): one moment's reads wait for one another only."""
        self.fold = ThenFold()
        self.version = 0
        self._built = -1
        self._deltas_of = -1
        self.new: dict[int, tuple[int, int, float]] = {}
        self.left: dict[int, Ghost] = {}
        self.ghosts_below: dict[int, list[Ghost]] = {}
        self.left_subtree: dict[int, int] = {}
        self.new_children: dict[int, int] = {}
        self.deltas: dict[int, int] = {}
        """A boundary's id -> the tokens below it then less now (what left, less what was stored)."""
        self.below: dict[int, int] = {}
        """A node's id -> the sum of the deltas of the boundaries at or below it (the paths')."""
        self.parent_of: dict[int, int | None] = {}
        """The parent of each node on the paths to the boundaries, read once (a split since: its head)."""
        self.applied: dict[int, int] = {}
        """Each boundary's delta as added up its path in ``below``."""

    def feed(self, got: tuple[list[Ghost], list[Any], Start]) -> None:
        ghosts, changes, place = got
        if ghosts or any(len(c[0]) for c in changes):
            self.fold.feed(changes, ghosts)
            self.version += 1
            parent_of, below = self.parent_of, self.below
            for head, split in self.fold.take_splits():  # (a head above a node on the paths read: on them too)
                if split in parent_of and parent_of[split] != head:
                    parent_of[head], parent_of[split] = parent_of[split], head
                    below[head] = below.get(split, 0)
        self.place = place

    def build(self) -> None:
        if self._built == self.version:
            return
        then = self.fold.result()
        self.new = {i: (_up(p), n, t) for i, (p, n, t) in then.new.items()}
        self.left = left = {g.node_id: g for g in then.left}
        below: dict[int, list[Ghost]] = {}
        for g in then.left:
            below.setdefault(_up(g.parent_id), []).append(g)
        self.ghosts_below = below
        subtree: dict[int, int] = {}
        deltas: dict[int, int] = {}
        for g in then.left:  # (each branch that left: its top's subtree, children before parents, one pass)
            if _up(g.parent_id) in left:
                continue
            order, stack = [], [g]
            while stack:
                node = stack.pop()
                order.append(node)
                stack.extend(below.get(node.node_id, ()))
            for node in reversed(order):
                subtree[node.node_id] = node.length + sum(subtree[c.node_id] for c in below.get(node.node_id, ()))
            up = _up(g.parent_id)
            deltas[up] = deltas.get(up, 0) + subtree[g.node_id]
        self.left_subtree = subtree
        new = self.new
        kids: dict[int, int] = {}
        boundary: dict[int, int] = {}  # a node stored since -> the node there then its branch hangs below
        for node_id, (parent, tokens, _) in new.items():
            kids[parent] = kids.get(parent, 0) + 1
            path = []
            while parent in new and parent not in boundary:
                path.append(parent)
                parent = new[parent][0]
            top = boundary.get(parent, parent)
            for one in path:
                boundary[one] = top
            boundary[node_id] = top
            deltas[top] = deltas.get(top, 0) - tokens
        self.new_children = kids
        self.deltas = {i: d for i, d in deltas.items() if d}
        self._built = self.version

    def boundary_of(self, ghost: Ghost) -> tuple[int, int]:
        """The node there then and now that a left node's branch hangs below, and how many left
        nodes lead up to it from this one (itself included)."""
        count, up = 1, _up(ghost.parent_id)
        while up in self.left:
            count += 1
            up = _up(self.left[up].parent_id)
        return up, count

    def read_below(self, parents: Callable[[list[int]], dict[int, int | None]]) -> None:
        """Which nodes each boundary is below: the paths to the boundaries not on those read yet
        (a split since puts its head on them as it comes), and each boundary's delta changed since
        the last read added up them."""
        if self._deltas_of == self.version:
            return
        parent_of, below, applied, deltas = self.parent_of, self.below, self.applied, self.deltas
        unknown = [i for i in deltas if i != ROOT_ID and i not in parent_of]
        for start in range(0, len(unknown), PATHS_A_READ):
            for node_id, parent in parents(unknown[start:start + PATHS_A_READ]).items():
                parent_of.setdefault(node_id, parent)
        for boundary in deltas.keys() | applied.keys():
            change = deltas.get(boundary, 0) - applied.get(boundary, 0)
            if not change or boundary == ROOT_ID:
                continue
            if boundary not in parent_of:  # (left after the history was read: the next read has it)
                continue
            up: int | None = boundary
            while up is not None and up != ROOT_ID:
                below[up] = below.get(up, 0) + change
                up = parent_of.get(up)
            if boundary in deltas:
                applied[boundary] = deltas[boundary]
            else:
                del applied[boundary]
        below[ROOT_ID] = sum(deltas.values())
        self._deltas_of = self.version


class ThenTrees:
    """The trees then an adapter keeps for reads (``THEN_TREES_KEPT``, the latest asked). Its lock
    guards which are kept only; each tree has its own (``ThenTree.lock``), so a moment's first read
    (every change since it, a second and more on a large tree) holds no read of another moment.
    Locks are taken a tree's first, then this one's, never the other way."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: OrderedDict[float, ThenTree] = OrderedDict()
        self.bytes_per_token: int | None = None

    def get(self, at: float | None, more: More) -> ThenTree:
        """The tree then at ``at`` (None: as far back as the history reaches), fed to the history's end."""
        if at is not None:
            with self.lock:
                tree = self.kept.get(at)
                if tree is not None:
                    self.kept.move_to_end(at)
            if tree is not None:
                return self._fed(tree, more)
        at, got = more(at, None)  # (its first read: every change since the moment, under no lock)
        tree = ThenTree(at, got[2])
        with tree.lock:
            with self.lock:
                kept = self.kept.get(at)
                if kept is None:  # (kept before it is fed: who finds it waits on its lock)
                    self.kept[at] = tree
                    while len(self.kept) > THEN_TREES_KEPT:
                        self.kept.popitem(last=False)
                else:
                    self.kept.move_to_end(at)
            if kept is None:
                tree.feed(got)
                return tree
        return self._fed(kept, more)  # (read meanwhile by another: the one kept)

    def _fed(self, tree: ThenTree, more: More) -> ThenTree:
        with tree.lock:
            try:
                tree.feed(more(tree.at, tree.place)[1])
            except AdapterError:  # (the history no longer reaches it: not kept)
                with self.lock:
                    if self.kept.get(tree.at) is tree:
                        del self.kept[tree.at]
                raise
        return tree


def then_children_of(adapter: Any, more: More | None, at: float | None, node_id: int, offset: int,
                     limit: int, live: Any = None) -> ChildrenPage:
    """``CacheAdapter.then_children`` of an adapter over a history (``more`` reads its changes;
    None: it keeps none), with the trees then it keeps between reads; ``live`` reads the tree now
    by the history's ids (``children``, ``node``, ``paths``, ``stats``: the adapter's own where
    its ids are the history's)."""
    if more is None:
        raise Unsupported(f"{adapter.name} keeps no history of its tree: it can say what is cached now, not then")
    trees = adapter.__dict__.get("_then_trees")
    if trees is None:
        trees = adapter.__dict__.setdefault("_then_trees", ThenTrees())
    return then_children(adapter if live is None else live, trees, more, at, node_id, offset, limit,
                         getattr(adapter, "tokenizer", None))


def then_children(adapter: Any, trees: ThenTrees, more: More, at: float | None, node_id: int,
                  offset: int, limit: int, tokenizer: Any = None) -> ChildrenPage:
    """A page of ``node_id``'s children in the tree at ``at``, the largest subtree then first."""
    check_page(offset, limit)
    tree = trees.get(at, more)
    if trees.bytes_per_token is None:
        trees.bytes_per_token = adapter.stats().bytes_per_token
    bpt = trees.bytes_per_token
    with tree.lock:
        ghost = tree.fold.left.get(node_id)
        in_new = tree.fold.is_new(node_id)
    now = time.time()
    live: list[NodeView] = []
    if ghost is None:
        if in_new:
            raise UnknownNode(f"node {node_id} was not in the tree at {_clock(tree.at)}: it was stored since")
        try:
            live = _live_children(adapter, node_id)
        except UnknownNode:  # (it left since the history was read: a node that left, if it was there then)
            with tree.lock:
                tree.feed(more(tree.at, tree.place)[1])
                ghost = tree.fold.left.get(node_id)
            if ghost is None:
                raise
        with tree.lock:  # (what was stored while the page was read is among the fold's new)
            tree.feed(more(tree.at, tree.place)[1])
    with tree.lock:
        tree.build()
        if ghost is None:  # (also once no branch is left: what was added up before is taken away)
            tree.read_below(getattr(adapter, "parents_of", None) or (
                lambda ids: {v.id: v.parent_id for v in adapter.paths(ids).nodes}))
        born = tree.fold.born_since
        views = [_kept(v, tree, bpt) for v in live if not born.get(v.id, False) and v.id not in tree.left]
        below = tree.ghosts_below.get(node_id, ())
        top, chain = (node_id, 0) if ghost is None else tree.boundary_of(ghost)
    if below:
        depth = _depth(adapter, top, views) + chain + 1
        views.extend(_left(g, tree, depth, now, bpt, tokenizer) for g in below)
    views.sort(key=lambda v: (-v.subtree_tokens, v.id))
    return ChildrenPage(node_id, offset, limit, len(views), "bytes", tuple(views[offset:offset + limit]))


def _live_children(adapter: Any, node_id: int) -> list[NodeView]:
    """Every child of ``node_id`` now (``MAX_THEN_CHILDREN`` at most), a page a read: by id, so
    that one whose place in the order moved between two pages is neither twice nor missed (the
    pages are read again, at most twice more, while some are missing)."""
    found: dict[int, NodeView] = {}
    for _ in range(3):
        offset, total = 0, None
        while total is None or (offset < total and offset < MAX_THEN_CHILDREN):
            page = adapter.children(node_id, offset, LIVE_PAGE, "bytes")
            for v in page.children:
                found[v.id] = v
            total = page.total
            offset += LIVE_PAGE
            if not page.children:
                break
        if len(found) >= min(total or 0, MAX_THEN_CHILDREN):
            break
    return list(found.values())


def _depth(adapter: Any, node_id: int, children: list[NodeView]) -> int:
    """The depth of a node there then and now (its children's less one, where they are read)."""
    if node_id == ROOT_ID:
        return 0
    if children:
        return children[0].depth - 1
    try:
        return adapter.node(node_id, 0, 1).node.depth
    except UnknownNode:  # (left after the history was read)
        return 0


def _kept(v: NodeView, tree: ThenTree, bpt: int) -> NodeView:
    """A node now as it was then: its subtree then, its children then; what is not kept, unknown."""
    subtree = v.subtree_tokens + tree.below.get(v.id, 0)
    children = v.num_children - tree.new_children.get(v.id, 0) + len(tree.ghosts_below.get(v.id, ()))
    return NodeView(v.id, v.parent_id, v.depth, v.tokens, v.first_tokens, v.text, None, None, v.access_age_s,
                    v.created_age_s, v.bytes, subtree, subtree * bpt, children, None, v.tiers)


def _left(g: Ghost, tree: ThenTree, depth: int, now: float, bpt: int, tokenizer: Any) -> NodeView:
    """A node that left since, as it was when it left (its age: since it left)."""
    first = tuple(memoryview(g.tokens).cast("q")[:FIRST_TOKENS])
    subtree = tree.left_subtree.get(g.node_id, g.length)
    parent = _up(g.parent_id)
    age = max(0.0, now - g.at)
    return NodeView(g.node_id, None if parent == ROOT_ID else parent, depth, g.length,
                    first, decode_preview(tokenizer, first), None, None, age, age,
                    g.length * bpt, subtree, subtree * bpt, len(tree.ghosts_below.get(g.node_id, ())), g.holders,
                    None, left_at=g.at, left_cause=g.cause, left_by=g.session_id or g.who or None)


def _up(parent_id: int) -> int:
    return ROOT_ID if parent_id == ROOT else parent_id


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))
