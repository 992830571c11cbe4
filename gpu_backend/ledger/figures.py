"""SessionLedger: each session's figures kept with the tree, updated by every change in O(depth).

The tree's owner (the bundled cache, or the hooks on an SGLang cache) tells the ledger what
changed, after it changed: a session tagged or untagged a node, a leaf was added or removed, a
node was split, a node's lock count crossed zero, the tree was reset. The ledger keeps, per node,

* ``below[n]``: for each session beneath n, how many reasons it has to be: n tagged by it, and
  each child of n with it beneath (its keys: the sessions beneath n; a session's *path* is every
  node with it below);
* ``owner[n]``: the one session whose close frees n now, under SessionRadixCacheMixin's rule: n
  is unlocked, every leaf of its subtree is tagged, and one session alone holds anything there.
  Bottom-up: a leaf is owned by its only holder; an inner node by the owner of all its children,
  where it holds nothing else (``kids[n]`` counts its children's owners);

and per session its exclusive tokens (the nodes it owns), its path tokens, and its tagged nodes.
A change moves an owner or a count on the path from the change to the root only, so each costs
O(depth) at most, and a tag or untag only the part of the path the session comes to or leaves
(a turn below a session's path: its new node); a split gives the new node one reason per session
of its child's ``below`` (C speed). Fair shares and locked tokens depend on every session
beneath a node, so they are summed per session when read (``shares``: O(the session's path)),
and their orders kept on the tree (``paths.PathSums``).

A node's figures are one record (``_Rec``), kept only while a session lies beneath it, on the
node itself (its ``ledger_rec``; None where it has none): a change reads it with the node it
walks to (a map by node cost a lookup of ~0.5 µs a node at 1M nodes, most of it a cache miss),
and no map of every node on the sessions' paths is ever rebuilt whole in one insert. One ledger
per tree: a node has one record. The root has none: every holding session lies beneath it, and
it is never owned, so no walk goes up to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from radixtop.gpu_backend.ledger.paths import Watched

Node = Any  # a tree node: ``parent``, ``children``, ``lock_ref``, ``ledger_rec``; its size through ``size``


def _key_len(node: Node) -> int:
    return len(node.key)


class _Rec:
    """A node's figures: each session's tagged nodes below it (``below``), the sessions that hold
    it (``held``), the one whose close frees it (``owner``), and its children's owners (``kids``)."""

    __slots__ = ("below", "held", "owner", "kids")

    def __init__(self) -> None:
        self.below: dict[str, int] = {}
        self.held: set[str] | None = None
        self.owner: str | None = None
        self.kids: dict[str, int] | None = None


class _Batch:
    __slots__ = ("ledger", "outer")

    def __init__(self, ledger: SessionLedger) -> None:
        self.ledger = ledger
        self.outer = False

    def __enter__(self) -> None:
        self.outer = self.ledger._deferred is None
        if self.outer:
            self.ledger._deferred = set()

    def __exit__(self, *exc: object) -> None:
        if self.outer:
            ledger, nodes = self.ledger, self.ledger._deferred
            ledger._deferred = None
            for node in nodes:  # each after its last change: the owners end as if settled each time
                ledger._settle(node)


class SessionLedger(Watched):
    """Figures of every session that holds a node of one tree (owner thread only).

    ``size(node)``: a node's tokens; ``frees``: a close frees a session's exclusive nodes
    (SessionRadixCacheMixin's ``free`` policy); False (``deref``) keeps exclusive at 0.
    Each session whose exclusive, path or tagged figure moved is added to ``moved`` (a set: one
    C call where the tree changes), which ``SessionOrders`` takes at its next read.
    """

    def __init__(self, root: Node, size: Callable[[Node], int] = _key_len, frees: bool = True,
                 lock_of: Callable[[Node], int] | None = None, locks_told: bool = True):
        self.size = size
        self.locks_told = locks_told
        """Every lock count crossing zero is told (``lock_changed``): False where no lock is
        followed (a deref tree), so ``moves`` does not see locks move."""
        self.frees = frees
        self.lock_of = lock_of
        """A node's lock count, where it is not ``node.lock_ref``."""
        self.tell_locks: Callable[[], bool] | None = None
        """Where locks are not told yet: starts telling them (True once it does)."""
        self.moved: set[str] = set()
        self.seen: dict[str, float] = {}
        """Each session's last activity told (``touch``: a request of it finished, it closed), as
        ``time.monotonic()``, where the tree's owner tells it."""
        self._deferred: set[Node] | None = None
        self.moves = 0
        """Changes told so far (a reader's stamp: nothing moved since while it is the same)."""
        self.tags: dict[str, int] = {}
        self.resets = 0
        """Resets so far (a reader of path sums starts again after one)."""
        self._watchers()
        self.reset(root)

    def reset(self, root: Node) -> None:
        """A new, empty tree: every session's figures go to 0."""
        try:
            root.ledger_rec = None  # (a new tree; a tree that had records starts again by ``rebuild``)
        except AttributeError as exc:  # slots without it: say so here, not in the owner's next change
            raise TypeError(f"a {type(root).__name__} cannot keep the ledger's record ({exc})") from exc
        if not hasattr(type(root), "ledger_rec"):  # a tree whose nodes have no such slot (SGLang's):
            type(root).ledger_rec = None  # every node's reads None until a record is set on it
        old = getattr(self, "root", None)
        if old is not None and old is not root:  # the tree before: a request still running may name
            _clear(old)  # one of its nodes, which must read as holding nothing (one walk, at a flush)
        touched = list(self.tags)
        self.moves += 1
        if self.journal is not None:
            for sid in touched:
                self._mark(sid)
        self.resets += 1
        self.root = root
        self.exclusive: dict[str, int] = {}
        self.path: dict[str, int] = {}
        self.tags = {}
        for sid in touched:
            self.moved.add(sid)

    def records(self) -> Iterable[tuple[Node, _Rec]]:
        """Each node of the tree with its record (a walk of the whole tree: for tests)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.ledger_rec is not None:
                yield node, node.ledger_rec

    # ----- reads -----

    def beneath(self, node: Node) -> int:
        """Sessions with a tagged node in ``node``'s subtree (for the root: every holding session)."""
        if node is self.root:
            return len(self.tags)
        rec = node.ledger_rec
        return len(rec.below) if rec is not None else 0

    def figures(self, sid: str) -> tuple[int, int, int]:
        """(tagged nodes, exclusive tokens, path tokens) of ``sid`` now."""
        return self.tags.get(sid, 0), self.exclusive.get(sid, 0), self.path.get(sid, 0)

    def shares(self, sid: str, leaves: Iterable[Node]) -> tuple[float, int]:
        """(fair-share tokens, locked tokens) of ``sid``, whose tagged nodes are ``leaves``: its
        path's nodes, each split evenly among the sessions beneath it, and those locked. Summed
        in the order of ``leaves`` (the from-scratch computation's order, to the last bit)."""
        size, root, lock_of = self.size, self.root, self.lock_of
        keyed = size is _key_len
        seen: set[Node] = set()
        fair, locked = 0.0, 0
        for leaf in leaves:
            node = leaf
            while node is not root and node is not None and node not in seen:
                seen.add(node)
                n = len(node.key) if keyed else size(node)
                fair += n / len(node.ledger_rec.below)
                if (node.lock_ref if lock_of is None else lock_of(node)) > 0:
                    locked += n
                node = node.parent
        return fair, locked

    def alive(self, node: Node) -> bool:
        """Whether a session lies beneath ``node`` (it has a record)."""
        return node.ledger_rec is not None

    def fair_weight(self, node: Node) -> float:
        """``node``'s tokens split among the sessions beneath it (a path sum's weight)."""
        rec = node.ledger_rec
        return self.size(node) / len(rec.below) if rec is not None and rec.below else 0.0

    def locked_weight(self, node: Node) -> float:
        """``node``'s tokens where it is locked, else 0 (a path sum's weight)."""
        return float(self.size(node)) if self.lock_count(node) > 0 else 0.0

    def lock_count(self, node: Node) -> int:
        """``node``'s lock count (``lock_of``, else ``node.lock_ref``)."""
        return node.lock_ref if self.lock_of is None else self.lock_of(node)

    # ----- what changed -----

    def tag(self, sid: str, node: Node) -> None:
        """``sid`` now holds ``node`` (no-op where it did already)."""
        self.moves += 1
        rec = node.ledger_rec
        if rec is not None and rec.held is not None and sid in rec.held:
            return
        if self.journal is not None:
            self._mark(sid)
        self._carry(sid, node, 1)
        rec = node.ledger_rec
        if rec.held is None:
            rec.held = {sid}
        else:
            rec.held.add(sid)
        self.tags[sid] = self.tags.get(sid, 0) + 1
        self.moved.add(sid)
        if self.frees:
            self._settle_now_or_later(node)

    def untag(self, sid: str, node: Node) -> None:
        """``sid`` no longer holds ``node`` (no-op where it did not)."""
        self.moves += 1
        rec = node.ledger_rec
        if rec is None or rec.held is None or sid not in rec.held:
            return
        if self.journal is not None:
            self._mark(sid)
        rec.held.discard(sid)
        if not rec.held:
            rec.held = None
        self._carry(sid, node, -1)
        self._one_tag_fewer(sid)
        if self.frees:
            self._settle_now_or_later(node)

    def drop(self, sid: str, nodes: Iterable[Node]) -> None:
        """``sid`` no longer holds ``nodes`` (distinct; a close's, before the tree changes): an
        ``untag`` of each. Where they are every node it holds, outside a ``batch``, it lies
        beneath no node after and owns none (an owner holds something beneath), so its path is
        walked once: its key dropped from each node's ``below`` (no reasons counted, no part
        walked twice), each node it owned unowned (the parent's count of owned children down as
        the walk comes to it), its exclusive, path and tags to 0. A child owned by no one keeps
        its parent unowned, until it leaves the tree (``removed`` then settles the parent). The
        nodes it held where another session lies beneath are settled (it may own them now);
        what the close then frees leaves as ever, with no record left to drop."""
        held, root = [], self.root
        for node in nodes:
            rec = node.ledger_rec
            if rec is not None:
                holders = rec.held
                if holders is not None and sid in holders:
                    held.append((node, rec))
        if len(held) != self.tags.get(sid, 0) or self._deferred is not None:
            # (inside a batch, a node settled at its end may still name the session its owner)
            for node, _ in held:
                self.untag(sid, node)
            return
        self.moves += 1
        if self.journal is not None:
            self._mark(sid)
        for _, rec in held:
            holders = rec.held
            holders.discard(sid)  # type: ignore[union-attr]
            if not holders:
                rec.held = None
        walked: list[Node] = []  # each node it lay beneath
        gone: list[Node] = []  # each node whose record went
        for node, rec in held:
            owned = False  # the child this walk came from was the session's (now no one's)
            while True:
                if owned:
                    kids = rec.kids
                    count = kids[sid] - 1  # type: ignore[index]
                    if count:
                        kids[sid] = count  # type: ignore[index]
                    elif len(kids) == 1:  # type: ignore[arg-type]
                        rec.kids = None
                    else:
                        del kids[sid]  # type: ignore[union-attr]
                below = rec.below
                if below.pop(sid, None) is None:  # from another of its nodes: walked from here up
                    if not below and rec.owner is None and rec.kids is None and rec.held is None:
                        node.ledger_rec = None
                        gone.append(node)
                    break
                walked.append(node)
                owned = rec.owner == sid
                if owned:
                    rec.owner = None
                if not below and rec.owner is None and rec.kids is None and rec.held is None:
                    node.ledger_rec = None
                    gone.append(node)
                node = node.parent
                if node is None or node is root:
                    break
                rec = node.ledger_rec
                if rec is None:
                    break
        for beneath in self.beneath_nodes:
            beneath.update(walked)
        if gone:
            for watch in self.watches:  # their entries go (as ``removed`` tells of a record)
                watch.nodes.update(gone)
        self.exclusive.pop(sid, None)  # (every node it owned was on its path)
        self.path.pop(sid, None)
        self.tags.pop(sid, None)
        self.moved.add(sid)
        if self.frees:
            settle = self._settle_now_or_later
            for node, rec in held:
                if rec.below:  # another session lies beneath: it may own it now
                    settle(node)

    def touch(self, sid: str, t: float | None = None) -> None:
        """A request of ``sid`` finished (or it closed) now, or at ``t`` (``time.monotonic()``):
        its last activity."""
        self.moves += 1
        self.seen[sid] = time.monotonic() if t is None else t
        self.moved.add(sid)

    def listing_moved(self, sid: str) -> None:
        """``sid`` opened or closed, or its tombstone came or went: its figures did not move, its
        listing may have (the orders re-key it at their next read)."""
        self.moves += 1
        self.moved.add(sid)

    def listings_moved(self, sids: Iterable[str]) -> None:
        """``listing_moved`` for many at once (a set update: no loop in Python)."""
        self.moves += 1
        self.moved.update(sids)

    def added(self, node: Node) -> None:
        """``node`` is a new leaf, holding nothing and unlocked, under its parent."""
        self.moves += 1
        parent = node.parent
        if self.frees and parent is not None:
            rec = parent.ledger_rec
            if rec is not None and rec.owner is not None:
                self._settle_now_or_later(parent)  # one more child, owned by no one: the parent no longer owned

    def split(self, head: Node, tail: Node) -> None:
        """``head`` took the first part of ``tail``'s tokens, above it (holding nothing, locked as
        it is). The same sessions lie beneath both and the same one owns both, so no session's
        figures move."""
        self.moves += 1
        rec = tail.ledger_rec
        if rec is None:
            return
        for watch in self.watches:
            watch.splits.append((head, tail))
        made = head.ledger_rec = _Rec()
        made.below = dict.fromkeys(rec.below, 1)  # one reason each: its one child, the tail
        if rec.owner is not None:
            made.owner = rec.owner
            made.kids = {rec.owner: 1}
            # the parent counted the tail's owner; it counts the head's now: the same

    def removed(self, node: Node, parent: Node | None) -> None:
        """``node``, a leaf, left the tree; it was ``parent``'s child. What it still held (a
        cache that drops holders without telling) is untagged here."""
        self.moves += 1
        rec = node.ledger_rec
        if rec is not None:
            for watch in self.watches:
                watch.nodes.add(node)
            for sid in list(rec.held or ()):
                if self.journal is not None:
                    self._mark(sid)
                rec.held.discard(sid)
                self._carry(sid, node, -1, parent)
                self._one_tag_fewer(sid)
            rec, node.ledger_rec = node.ledger_rec, None
            if rec is not None and rec.owner is not None:
                self._credit(rec.owner, -self.size(node))
                if parent is not None:
                    self._count_kid(parent, rec.owner, -1)
        if self.frees and parent is not None:
            if parent.ledger_rec is not None:  # one child fewer: the rest may be one session's now
                self._settle_now_or_later(parent)  # (a node no session lies beneath has no owner to gain or lose)

    def lock_changed(self, node: Node) -> None:
        """``node``'s lock count went from 0 to more, or back to 0. Only a node some session lies
        beneath can gain or lose an owner: the others (most nodes a request locks) are left."""
        self.moves += 1
        if not self.frees:
            return
        rec = node.ledger_rec
        if rec is None:
            return
        if self.lock_count(node) != 0:
            if rec.owner is None:  # a lock only takes an owner away
                return
        elif rec.held is None and rec.kids is None:  # unlocked, but no holder, no owned child
            return
        self._settle_now_or_later(node)

    def locks_moved(self, node: Node) -> None:
        """A lock or an unlock of the path from ``node`` to the root (once per path, where a
        reader of path sums by locks is watching: ``lock_watched``)."""
        for paths in self.lock_paths:
            paths.add(node)

    def rebuild(self, root: Node, holders: Callable[[Node], Iterable[str] | None]) -> None:
        """Start again from the tree as it is (a change the ledger was not told of): one walk,
        for the rare path that needs it."""
        self.reset(root)
        stack = [root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.ledger_rec = None  # (a parent before its children: no tag below has reached it yet)
            for sid in holders(node) or ():
                self.tag(sid, node)

    def batch(self) -> _Batch:
        """``with ledger.batch():`` around an operation that changes many nodes near each other (a
        close, an evict): each node's owner is settled once, at the end, not at every change."""
        return _Batch(self)

    # ----- upkeep -----

    def _settle_now_or_later(self, node: Node) -> None:
        if self._deferred is None:
            self._settle(node)
        else:
            self._deferred.add(node)

    def _carry(self, sid: str, node: Node, delta: int, parent: Node | None = None) -> None:
        """One more (``delta`` 1) or one fewer (-1) reason for ``sid`` to be beneath ``node``: a tag
        of it, or a child with ``sid`` beneath. Where the session comes to lie beneath the node (or
        no longer does), its parent gains (or loses) that reason in turn, and the node moves the
        session's path tokens; where it lay beneath it already (or still does), nothing above
        moves, so the walk stops there: a tag below a session's path costs the new part of it, not
        the depth. ``parent``: where the walk goes on from a node already unlinked. A node's record
        goes when no session lies beneath it."""
        size = None if self.size is _key_len else self.size
        watching, root = self.beneath_nodes, self.root
        gained = 0
        first = True
        while node is not None and node is not root:
            rec = node.ledger_rec
            if delta > 0:
                if rec is None:
                    node.ledger_rec = rec = _Rec()
                counts = rec.below
                was = counts.get(sid, 0)
                counts[sid] = was + 1
                if was:
                    break
                gained += len(node.key) if size is None else size(node)
                for nodes in watching:
                    nodes.add(node)
            else:
                if rec is None:
                    break
                counts = rec.below
                left = counts.get(sid, 0) - 1
                if left > 0:
                    counts[sid] = left
                    break
                if left < 0:
                    break
                del counts[sid]
                gained -= len(node.key) if size is None else size(node)
                for nodes in watching:
                    nodes.add(node)
                if not counts and rec.owner is None and rec.kids is None and rec.held is None:
                    node.ledger_rec = None
            node = parent if first and parent is not None else node.parent
            first = False
        if gained:
            path = self.path.get(sid, 0) + gained
            if path:
                self.path[sid] = path
            else:
                self.path.pop(sid, None)

    def _settle(self, node: Node) -> None:
        """Recompute ``node``'s owner and, while it moves, its ancestors'. A node's owner: none where
        it is locked or two sessions hold it; a leaf's only holder; an inner node's children's
        one owner, where all of them have it and the node holds no one else. (Inline, with the
        credit and the parent's count: this runs at every tag and unlock.)"""
        root, lock_of, moved = self.root, self.lock_of, self.moved
        exclusive = self.exclusive
        keyed = self.size is _key_len
        rec = node.ledger_rec
        while node is not None and node is not root:
            if rec is None:
                return  # no session beneath: no owner, and none before
            new = None
            if (node.lock_ref if lock_of is None else lock_of(node)) == 0:
                held = rec.held
                if held is None or len(held) == 1:
                    mine = next(iter(held)) if held is not None else None
                    children = len(node.children)
                    if not children:
                        new = mine
                    else:
                        kids = rec.kids
                        if kids is not None and len(kids) == 1:
                            for sid, count in kids.items():
                                if count == children and (mine is None or mine == sid):
                                    new = sid
            old = rec.owner
            if new == old:
                return
            n = len(node.key) if keyed else self.size(node)
            parent = node.parent
            up = parent.ledger_rec if parent is not None else None
            if self.journal is not None:
                if old is not None:
                    self._mark(old)
                if new is not None:
                    self._mark(new)
            if old is not None:
                left = exclusive[old] - n
                if left:
                    exclusive[old] = left
                else:
                    del exclusive[old]
                moved.add(old)
                if up is not None:
                    kids = up.kids
                    count = kids[old] - 1
                    if count:
                        kids[old] = count
                    elif len(kids) == 1:
                        up.kids = None
                        if not up.below and up.held is None and up.owner is None:
                            parent.ledger_rec = None  # nothing left to keep
                    else:
                        del kids[old]
            rec.owner = new
            if new is None and not rec.below and rec.held is None and rec.kids is None:
                node.ledger_rec = None  # (its last reason went before its owner)
            if new is not None:
                exclusive[new] = exclusive.get(new, 0) + n
                moved.add(new)
                if up is not None:
                    if up.kids is None:
                        up.kids = {new: 1}
                    else:
                        up.kids[new] = up.kids.get(new, 0) + 1
            node, rec = parent, up

    def _one_tag_fewer(self, sid: str) -> None:
        left = self.tags[sid] - 1
        if left:
            self.tags[sid] = left
        else:
            del self.tags[sid]
        self.moved.add(sid)

    def _credit(self, sid: str, tokens: int) -> None:
        if self.journal is not None:
            self._mark(sid)
        total = self.exclusive.get(sid, 0) + tokens
        if total:
            self.exclusive[sid] = total
        else:
            self.exclusive.pop(sid, None)
        self.moved.add(sid)

    def _count_kid(self, parent: Node, sid: str, delta: int) -> None:
        rec = parent.ledger_rec
        if rec is None:  # an owned child has its owner's tags below it, so below its parent too
            return
        kids = rec.kids
        if kids is None:
            rec.kids = kids = {}
        count = kids.get(sid, 0) + delta
        if count:
            kids[sid] = count
        else:
            del kids[sid]
            if not kids:
                rec.kids = None
                if not rec.below and rec.held is None and rec.owner is None:
                    parent.ledger_rec = None  # nothing left to keep



def _clear(root: Node) -> None:
    """No record left on ``root``'s tree."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.ledger_rec is not None:
            node.ledger_rec = None
        stack.extend(node.children.values())
