"""BlockLedger: every session's figures over a KV-event block tree, kept as the tree changes.

A session's *path* is every block its requests stored and every block above them. Within a node
(a run of blocks, no branch inside) a session's path covers a prefix of the node: all of it where
the session stored a block in a node below (it is ``under`` the node), else up to the end of the
last block it stored in the node (its ``part``). So per node the ledger keeps, for the sessions
beneath it, only those two facts, and the figures follow:

* ``path[sid]``: the sum of the session's reach in every node, moved when a reach moves;
* ``exclusive[sid]``: the tokens on no other session's path. In a node they are the reach of the
  one session that reaches furthest, less the next furthest (none where two sessions are under it);
  each node's share is kept (``node.excl``) and moved when its node's reaches move;
* fair share: each token split evenly among the sessions whose paths cross it, summed at read over
  the session's path (``shares``), O(path x the node's partial sessions).

A change moves the counts of the node's ancestors only (``under``: how many blocks each session
stored below), so O(depth); a session's reach in the node itself is settled at the next read
(``settle``), by a scan from the node's end to its last block. ``BlockTree.attribute`` computes the
same from scratch, the tests' oracle.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from radixtop.gpu_backend.ledger.paths import Watched

if TYPE_CHECKING:
    from radixtop.adapters.events.block_tree import BlockNode


class BlockLedger(Watched):
    """Figures of the sessions of one ``BlockTree`` (the tree's thread, or under its lock).

    The interface ``SessionOrders`` reads: ``tags``, ``exclusive``, ``figures(sid)``,
    ``shares(sid, nodes)``, ``moved`` (the sessions whose figures moved since the orders took
    them) and ``moves`` (a stamp)."""

    locks_told = True
    """Locks are not in the events: the locked tokens of every session are 0, and stay 0."""
    has_locks = False
    """(so the sessions by locked tokens are the sessions by id)"""
    resets = 0
    """A new tree makes a new ledger: this one is never reset."""

    def __init__(self, root: BlockNode | None = None) -> None:
        self.root = root
        """The tree's root (the path sums' walks stop there)."""
        self._watchers()
        self.clear()

    def clear(self) -> None:
        self.path: dict[str, int] = {}
        self.exclusive: dict[str, int] = {}
        self.held: dict[str, dict[BlockNode, None]] = {}
        """Session -> the nodes it holds (stored a block of), in the order it came to hold them."""
        self.tags: Mapping[str, int] = _Counts(self.held)
        """Session -> how many nodes it holds (the tree's ``holding``)."""
        self.moved: set[str] = set()
        self.moves = 0
        self._ends: dict[BlockNode, set[str]] = {}
        """Nodes whose sessions' ends (their last stored block) moved, to settle."""
        self._excl: set[BlockNode] = set()
        """Nodes whose exclusive share may have moved, to settle."""

    # ----- reads -----

    def figures(self, sid: str) -> tuple[int, int, int]:
        """(nodes held, exclusive tokens, path tokens) of ``sid`` now (after ``settle``)."""
        held = self.held.get(sid)
        return len(held) if held else 0, self.exclusive.get(sid, 0), self.path.get(sid, 0)

    def beneath(self, node: BlockNode) -> int:
        """Distinct sessions whose stored blocks are in ``node`` or below it."""
        if node.parent is None:
            return len(self.held)
        under = node.under or {}
        return len(under) + sum(1 for sid in node.holders if sid not in under)

    def shares(self, sid: str, nodes: Iterable[BlockNode]) -> tuple[float, int]:
        """(fair-share tokens, locked tokens) of ``sid``, whose held nodes are ``nodes``."""
        fair, seen = 0.0, set()
        for leaf in nodes:
            node = leaf
            while node.parent is not None and node not in seen:
                seen.add(node)
                fair += _fair_in(node, sid)
                node = node.parent
        return fair, 0

    def settle(self) -> None:
        """Bring every figure up to the tree's last change (before a read)."""
        if self._ends:
            ends, self._ends = self._ends, {}
            for node, sids in ends.items():
                self._settle_ends(node, sids)
        if self._excl:
            nodes, self._excl = self._excl, set()
            for node in nodes:
                self._settle_excl(node)

    # ----- the sessions ranked by fair share (``paths.PathSums``) -----

    def _moved_node(self, node: BlockNode) -> None:
        """A node whose sessions or reaches moved (its fair share's weight, or its tail)."""
        for watch in self.watches:
            watch.nodes.add(node)

    @staticmethod
    def alive(node: BlockNode) -> bool:
        """Whether a session's path reaches into ``node`` still."""
        return bool(node.under) or bool(node.part)

    @staticmethod
    def fair_weight(node: BlockNode) -> float:
        """``node``'s fair share for a session under it (its whole run of blocks)."""
        return _fair_upto(node, node.tokens)

    @staticmethod
    def fair_tail(node: BlockNode, sid: str) -> float:
        """``sid``'s fair share of ``node``: all of it where the session is under it, else up to
        the end of its last block there."""
        return _fair_in(node, sid)

    # ----- what the tree tells -----

    def held_by(self, node: BlockNode, sid: str, delta: int, crossed: bool = True) -> None:
        """``delta`` more (or fewer) of ``node``'s blocks are stored by ``sid`` (its holders
        already counted; ``crossed``: it came to hold the node, or no longer does)."""
        self.moves += 1
        if self.journal is not None:
            self._mark(sid)
        self.moved.add(sid)
        ends = self._ends.get(node)
        if ends is None:
            self._ends[node] = {sid}
        else:
            ends.add(sid)
        if crossed:
            held = self.held.get(sid)
            if sid in node.holders:
                if held is None:
                    held = self.held[sid] = {}
                held[node] = None
            elif held is not None:
                held.pop(node, None)
                if not held:
                    del self.held[sid]
        self._carry(node.parent, sid, delta)

    def resized(self, node: BlockNode, delta: int) -> None:
        """``node`` has ``delta`` more tokens (its own blocks)."""
        self.moves += 1
        if self.watches:
            self._moved_node(node)
        if node.under:
            path = self.path
            for sid in node.under:
                if self.journal is not None:
                    self._mark(sid)
                path[sid] += delta
                self.moved.add(sid)
        self._excl.add(node)

    def before_split(self, node: BlockNode) -> None:
        """``node`` is about to split: what it owes is settled while its blocks are in place."""
        sids = self._ends.pop(node, None)
        if sids:
            self._settle_ends(node, sids)

    def split(self, head: BlockNode, tail: BlockNode) -> None:
        """``tail`` took ``head``'s blocks from ``head.tokens`` on, and its children. Every
        session's path is what it was: a session under the old node is under both; one with
        blocks in the tail is now under the head and reaches into the tail as far as before."""
        self.moves += 1
        tail.under = dict(head.under) if head.under else None
        under = head.under if head.under is not None else {}
        head.under = under
        part = head.part or {}
        tail_part: dict[str, int] = {}
        cut = head.tokens
        for sid, blocks in tail.holders.items():
            if self.journal is not None:
                self._mark(sid)
            under[sid] = under.get(sid, 0) + blocks
            tail_part[sid] = part[sid] - cut
            held = self.held.setdefault(sid, {})
            held[tail] = None
            if sid in head.holders:  # its end in the head: the last of its blocks left there
                self._ends.setdefault(head, set()).add(sid)
            else:
                del part[sid]
                held.pop(head, None)
            self.moved.add(sid)
        tail.part = tail_part or None
        head.part = part or None
        head.partial = tail.partial = None
        for watch in self.watches:  # the tail came below the head, above the head's children
            watch.splits.append((tail, head))
            watch.nodes.update(tail.children.values())
        self._excl.add(head)
        self._excl.add(tail)

    def detached(self, top: BlockNode) -> None:
        """``top``'s subtree is about to leave the tree: every session's figures lose it."""
        self.moves += 1
        if self.watches:
            self._moved_node(top)
        path, moved = self.path, self.moved
        stored: dict[str, int] = {}
        stack = [top]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            under, part = node.under or {}, node.part or {}
            if self.journal is not None:
                for sid in itertools.chain(under, part, node.holders):
                    self._mark(sid)
            for sid in under:
                _add(path, sid, -node.tokens)
            for sid, end in part.items():
                if sid not in under:
                    _add(path, sid, -end)
            for sid, blocks in node.holders.items():
                stored[sid] = stored.get(sid, 0) + blocks
                held = self.held.get(sid)
                if held is not None:
                    held.pop(node, None)
                    if not held:
                        del self.held[sid]
            moved.update(under)
            moved.update(part)
            self._set_excl(node, None)
            node.under = node.part = node.partial = None
            self._ends.pop(node, None)
            self._excl.discard(node)
        for sid, blocks in stored.items():
            self._carry(top.parent, sid, -blocks)

    def stored_at(self, sid: str) -> None:
        """``sid``'s last store moved (its activity)."""
        self.moves += 1
        self.moved.add(sid)

    # ----- the upkeep -----

    def _carry(self, node: BlockNode | None, sid: str, delta: int) -> None:
        """``delta`` more of ``sid``'s blocks below ``node`` and each of its ancestors; where a
        count leaves or reaches 0 the session's reach there moves between its part and all."""
        path = self.path
        while node is not None and node.parent is not None:  # not the root: it has no tokens
            under = node.under
            if under is None:
                under = node.under = {}
            before = under.get(sid, 0)
            now = before + delta
            if now > 0:
                under[sid] = now
            else:
                del under[sid]
            if (before > 0) != (now > 0):
                if self.watches:
                    self._moved_node(node)
                part = node.part.get(sid, 0) if node.part else 0
                if self.journal is not None:
                    self._mark(sid)
                _add(path, sid, (node.tokens - part) if now > 0 else (part - node.tokens))
                self._excl.add(node)
                node.partial = None
            node = node.parent

    def _settle_ends(self, node: BlockNode, sids: set[str]) -> None:
        """The end of the last block each of ``sids`` stored in ``node``; where the session is not
        under the node, its path moves with it."""
        found: dict[str, int] = {}
        if len(sids) == 1:  # the common case: one session stored blocks here, most often the last
            (one,) = sids
            if one in node.holders:
                pos = node.tokens
                for block in reversed(node.blocks):
                    if one in block.sessions:
                        found[one] = pos
                        break
                    pos -= len(block.tokens)
            want: set[str] = set()
        else:
            want = {sid for sid in sids if sid in node.holders}
        if want:
            pos = node.tokens
            for block in reversed(node.blocks):
                hit = want.intersection(block.sessions)
                if hit:
                    for sid in hit:
                        found[sid] = pos
                    want -= hit
                    if not want:
                        break
                pos -= len(block.tokens)
        part = node.part
        if part is None:
            part = node.part = {}
        under = node.under or {}
        node.partial = None
        for sid in sids:
            old, new = part.get(sid, 0), found.get(sid, 0)
            if new:
                part[sid] = new
            else:
                part.pop(sid, None)
            if old != new and sid not in under:  # (marked as it came into ``_ends``: held_by, split)
                _add(self.path, sid, new - old)
                self.moved.add(sid)
        if not part:
            node.part = None
        self._excl.add(node)
        if self.watches:
            self._moved_node(node)

    def _settle_excl(self, node: BlockNode) -> None:
        """The tokens of ``node`` on one session's path only, and whose: the furthest reach less
        the next furthest (none where two sessions are under the node)."""
        under, part = node.under or {}, node.part or {}
        mine: tuple[str, int] | None = None
        if not under and len(part) == 1:  # a session's own leaf
            ((sid, end),) = part.items()
            mine = (sid, end)
        elif len(under) == 1:
            (sid,) = under
            other = max((end for s, end in part.items() if s != sid), default=0)
            if node.tokens > other:
                mine = (sid, node.tokens - other)
        elif not under and part:
            first, second, sid = 0, 0, ""
            for s, end in part.items():
                if end > first:
                    first, second, sid = end, first, s
                elif end > second:
                    second = end
            if first > second:
                mine = (sid, first - second)
        self._set_excl(node, mine)

    def _set_excl(self, node: BlockNode, mine: tuple[str, int] | None) -> None:
        old = node.excl
        if old == mine:
            return
        if self.journal is not None:
            if old is not None:
                self._mark(old[0])
            if mine is not None:
                self._mark(mine[0])
        if old is not None:
            _add(self.exclusive, old[0], -old[1])
            self.moved.add(old[0])
        if mine is not None:
            _add(self.exclusive, mine[0], mine[1])
            self.moved.add(mine[0])
        node.excl = mine


def _add(counts: dict[str, int], sid: str, delta: int) -> None:
    n = counts.get(sid, 0) + delta
    if n:
        counts[sid] = n
    else:
        counts.pop(sid, None)


def _fair_in(node: BlockNode, sid: str) -> float:
    """``sid``'s fair share of ``node``: each token of its reach over the sessions that reach it."""
    under, part = node.under or {}, node.part or {}
    return _fair_upto(node, node.tokens if sid in under else part.get(sid, 0))


def _fair_upto(node: BlockNode, reach: int) -> float:
    """The fair share of ``node``'s first ``reach`` tokens for a session that reaches that far."""
    under, part = node.under or {}, node.part or {}
    ends = node.partial
    if ends is None:  # kept until the node's sessions move: a shared prompt's holders are many
        ends = node.partial = sorted(end for s, end in part.items() if s not in under)
    count, fair, prev = len(under) + len(ends), 0.0, 0
    for end in ends:
        if end > prev:
            top = min(end, reach)
            if top > prev:
                fair += (top - prev) / count
            prev = end
            if prev >= reach:
                return fair
        count -= 1
    if reach > prev and count:
        fair += (reach - prev) / count
    return fair


class _Counts(Mapping[str, int]):
    """How many nodes each session holds, read from the ledger's ``held`` (not kept apart)."""

    def __init__(self, held: dict[str, dict[BlockNode, None]]) -> None:
        self._held = held

    def __getitem__(self, sid: str) -> int:
        return len(self._held[sid])

    def __contains__(self, sid: object) -> bool:
        return sid in self._held

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)
