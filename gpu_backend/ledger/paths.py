"""PathSums: the sessions ranked by a sum over their paths (fair share, locked tokens), kept with
the tree, so that a page of the top K costs O(K x depth x log n) at its read and no ranking of
every session.

A figure summed over a session's path, ``sum(weight(v) for v in path(s))``, moves for every
session beneath a node whenever that node's weight moves (a fair share's weight is
``size / sessions beneath``: one session joining a shared system prompt moves the fair share of
the 50,000 beneath it), so no order of the sessions themselves can be kept. The sums are kept on
the tree instead:

* a session whose tagged nodes lie on one root path (most: a chat's turns extend each other)
  *ends* at its deepest tagged node ``e``; its figure is ``S(e)``, the weights summed from the
  root down to ``e``. Every session ending at one node has the same figure;
* a session whose tagged nodes branch is *anchored* at their deepest common ancestor ``a``; its
  figure is ``S(a) + R(s)``, ``R`` the weights of its path below ``a``, which moves only when a
  node below ``a`` on its path moves (``through[v]``: those sessions, re-summed then). Where a
  session's path may end inside its last node (``tail``: a KV-event tree's run of blocks, reached
  up to the session's last block), every session is anchored so, at its last node at least;
* each node keeps its extremes (``hk``/``lk``): the most (and least) a session ending or
  anchored in its subtree adds from the node down, its own weight included, with the least (and
  greatest) id among the sessions that add it.

A page in descending order is then a best-first walk from the root: one heap of nodes keyed by
``S(parent)`` plus their extreme (a bound on every figure beneath, and on its ties by id) and of
sessions keyed by (figure, id); a node popped pushes its sessions and its best child, a child
popped its next sibling (children kept sorted by their extremes where a node has many); the
sessions that hold nothing (figure 0) are one cursor over their ids. Ascending: the same from
the other extreme. A tie of thousands at one figure (the locked tokens of every idle session:
0) costs no walk of their subtrees: a node comes out only before the ids it could precede.

The owner tells (``SessionLedger.watch``, ``BlockLedger.watch``) which nodes' weights moved, the
paths it locked or unlocked (once per path: ``locks_moved``) and the splits; the sessions whose
tagged nodes moved come as the orders' pending sessions. A read first settles those (each
session re-placed in O(tags x depth), each moved node re-summed deepest first and its parent's
entry re-keyed), in steps, then walks the heap in one step.

Figures are compared as the rows carry them (fair share in bytes, rounded; locked tokens), by
the row's key (figure, then id). A sum made root-down differs from the row's leaf-up sum in its
last bits only: a node's bound is widened by ``SLACK`` and a byte, and a session whose rounded
bytes could fall either way (within ``UNSURE`` of a half) is keyed by its row's own figure.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Collection, Generator, Iterator
from typing import Any

from sortedcontainers import SortedList

from radixtop.gpu_backend.history import MARK_TICKS_A_SECOND
from radixtop.gpu_backend.owner.shards import ShardedMap

Node = Any

WIDE = 32
"""A node with more children with sessions beneath keeps them sorted (by each extreme)."""
ENDS_SORTED = 64
"""A node where more sessions end keeps their ids sorted."""
STEP_S = 0.001
"""A settling loop yields once it has run this long (checked every 8 items)..."""
CHUNK = 256
"""... or once it has re-ended this many sessions or re-summed this many nodes."""
UNSURE = 1e-12
"""A figure in bytes this close to a half (relative) is summed again the row's way. Two sums of
the same terms in another order differ by a few units in the last place times the terms (about
1e-14 relative for a path of 100 nodes); 1e-6 marked every figure over 5e5 bytes unsure (a
session's row made for each one a walk passed, at a real model's 128 KiB a token)."""
WALK_HOLD_S = 2.0
"""A walk under way keeps the sums from being settled for at most this long (its reader may have
stopped driving it); then a read settles them, and the walk, if resumed, starts again."""
SLACK = 1e-9
"""A node's bound in bytes is widened by this much (relative) and one byte, so that no sum made
in another order can pass it."""


class Watch:
    """What a reader of path sums (``paths.PathSums``) is told: the nodes whose weight may have
    moved since it last settled (``nodes``), the splits (``splits``: head, tail) and, for one by
    locks, the nodes from which a locked or unlocked path went up to the root (``paths``: one per
    lock, not one per node that crossed)."""

    __slots__ = ("nodes", "splits", "lock", "paths")

    def __init__(self, lock: bool) -> None:
        self.nodes: set[Node] = set()
        self.paths: set[Node] = set()
        self.splits: list[tuple[Node, Node]] = []
        self.lock = lock




class Watched:
    """A ledger that readers of path sums watch: ``watch()`` and ``unwatch()``, and what its
    changes tell (``watches``: every reader; ``beneath_nodes``: the ``nodes`` of those told when a
    node's sessions beneath move; ``lock_paths``: the ``paths`` of those by locks)."""

    watches: list[Watch]
    beneath_nodes: list[set[Node]]
    lock_paths: list[set[Node]]

    def _watchers(self) -> None:
        self.watches, self.beneath_nodes, self.lock_paths = [], [], []
        self.journal: Any = None
        """Where each move of a session's figures is told first, with the figures until then (a
        ``CacheHistory``'s ``moving``: the sessions' memory at a past moment); None: not told."""
        self._marked: set[str] = set()
        self._marked_tick: int | None = None
        """The sessions told to ``journal`` in the millisecond ``_marked_tick`` (of its clock), each
        once (its figures before its first change in it)."""

    def figures(self, sid: str) -> tuple[int, int, int]:
        """(tagged nodes, exclusive tokens, path tokens) of ``sid`` now."""
        raise NotImplementedError

    def _mark(self, sid: str) -> None:
        """Tell ``journal`` ``sid``'s figures before they move: once a millisecond (an owner's op
        moves a session's figures several times: its tag, its old leaf's untag, an owner settled;
        one mark says what they were before all of them), stamped with the millisecond's start."""
        journal = self.journal
        tick = math.floor(journal.now() * MARK_TICKS_A_SECOND)
        if tick != self._marked_tick:
            self._marked.clear()
            self._marked_tick = tick
        if sid not in self._marked:
            self._marked.add(sid)
            journal.moving(sid, *self.figures(sid), tick / MARK_TICKS_A_SECOND)

    def watch(self, lock: bool = False) -> Watch:
        """A new reader of path sums: told each node whose sessions beneath moved, or (``lock``)
        each path locked or unlocked, and each split."""
        watch = Watch(lock)
        self.watches.append(watch)
        (self.lock_paths if lock else self.beneath_nodes).append(watch.paths if lock else watch.nodes)
        return watch

    def unwatch(self, watch: Watch) -> None:
        """That reader is gone: told nothing more."""
        if watch in self.watches:
            self.watches.remove(watch)
            self.beneath_nodes = [w.nodes for w in self.watches if not w.lock]
            self.lock_paths = [w.paths for w in self.watches if w.lock]

    @property
    def lock_watched(self) -> bool:
        """Whether a reader by locks watches (the owner then tells ``locks_moved``)."""
        return bool(self.lock_paths)


class _P:
    """A node's entry: what sessions beneath it add from the node down."""

    __slots__ = ("hk", "lk", "w", "kids", "up", "ends", "anchored", "by_hi", "by_lo", "seq", "sorted_ends")

    def __init__(self, seq: int) -> None:
        self.w = 0.0
        """The node's weight when it was last summed (a walk reads this, not the tree)."""
        self.hk: tuple[float, str] = (0.0, "")
        """(minus the most a session beneath adds from here down, the least id of those)."""
        self.lk: tuple[float, _Desc] = (0.0, _Desc(""))
        """(the least a session beneath adds from here down, the greatest id of those)."""
        self.kids: dict[Node, None] = {}
        self.up: Node | None = None
        self.ends: set[str] = set()
        self.sorted_ends: SortedList | None = None
        self.anchored: dict[str, float] = {}
        self.by_hi: SortedList | None = None
        self.by_lo: SortedList | None = None
        self.seq = seq


class _Desc:
    """A session id that sorts backwards (an ascending page: ties from the last id); ``None``
    before every id (``_FIRST``)."""

    __slots__ = ("sid",)

    def __init__(self, sid: str | None) -> None:
        self.sid = sid

    def __lt__(self, other: _Desc) -> bool:
        if self.sid is None:
            return other.sid is not None
        return other.sid is not None and self.sid > other.sid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.sid == other.sid


_FIRST = _Desc(None)


class PathSums:
    """Sessions ranked by ``weight`` summed over their paths, for one ``SessionLedger``.

    ``weight(node)``: what the node adds to the figure of a session whose path goes through it
    (or below it); ``tail(node, sid)``: what it adds to ``sid``'s where ``sid``'s path may end
    inside it (a KV-event tree's node is a run of blocks, and a session reaches into it as far as
    its last stored block), None where a tagged node is on the path whole; ``alive(node)``: whether
    a session lies beneath it still; ``exact(sid)``: the session's figure as its row gives it (an
    int: bytes or tokens); ``scale``: bytes per token where the figure is a rounded fair share
    (``rounded``), else 1; ``lock``: whether the weight moves with locks (it then listens to lock
    changes, else to changes of sessions beneath).
    """

    def __init__(self, ledger: Any, weight: Callable[[Node], float], exact: Callable[[str], int],
                 leaves_of: Callable[[str], Collection[Node]], listed: Callable[[str], bool],
                 alive: Callable[[Node], bool], tail: Callable[[Node, str], float] | None = None,
                 scale: int = 1, rounded: bool = True, lock: bool = False):
        self.ledger, self.weight, self.exact = ledger, weight, exact
        self.alive, self.tail = alive, tail
        self.leaves_of, self.listed = leaves_of, listed
        self.scale, self.rounded = scale, rounded
        self.watch = ledger.watch(lock=lock)
        self.pending: set[str] = set()
        self.ready = False
        self.walking = 0
        """Walks under way (``walk``, in steps, counted by their readers): no settle meanwhile."""
        self.walk_began = 0.0
        self.generation = 0
        """Settles begun so far (a walk under way whose generation moved starts again)."""
        self.settled_at = time.monotonic()
        """When the last settle left nothing to do: what a read that could not settle is as of."""
        self._clear()

    def _clear(self) -> None:
        self.resets = self.ledger.resets
        self.entries: ShardedMap[Node, _P] = ShardedMap()
        self.end_of: ShardedMap[str, Node] = ShardedMap()
        self.anchor_of: ShardedMap[str, tuple[Node, float, list[Node]]] = ShardedMap()
        self.through: ShardedMap[Node, set[str]] = ShardedMap()
        self.untagged: SortedList = SortedList()
        self._untagged_set: set[str] = set()
        self._resum: set[str] = set()
        self._seq = itertools.count(1)
        self._dirty: set[Node] = set()
        """Nodes whose sessions ending or anchored there moved (re-summed; unlike the ledger's
        ``watch.nodes``, whose weight moved, they move no branching session's sum below them)."""
        self._heap: list[tuple[int, int, Node]] = []
        self._queued: set[Node] = set()
        self._tick = itertools.count()
        self.watch.nodes.clear()
        self.watch.splits.clear()
        self.watch.paths.clear()

    def listed_count(self) -> int:
        return len(self.untagged) + len(self.end_of) + len(self.anchor_of)

    def listed_ids(self) -> Iterator[str]:
        """Every listed session's id, as of the last ``settle`` (iterated while ``walking``)."""
        yield from self.end_of.keys()
        yield from self.anchor_of.keys()
        yield from self.untagged

    # ----- settling what moved -----

    def begin_walk(self) -> int:
        """A reader's walk starts (call ``end_walk`` when it is done, or dropped): the sums stay
        as they are until then, or for ``WALK_HOLD_S``; the generation it walks."""
        if not self.walking:
            self.walk_began = time.monotonic()
        self.walking += 1
        return self.generation

    def end_walk(self) -> None:
        self.walking -= 1

    def settle(self) -> Generator[None, None, bool]:
        """The pending sessions re-ended and the moved nodes re-summed, in steps; returns True in
        the step after which nothing is left (a caller's next work runs in that same step). While
        another read's walk is under way (in steps, for less than ``WALK_HOLD_S``) it returns
        False at once and changes nothing: the caller reads the sums as of ``settled_at``. (It
        never waits for the walk: a read run in one hold could not let the walk go on.)"""
        if self.walking and time.monotonic() - self.walk_began < WALK_HOLD_S:
            return False
        self.generation += 1  # (a walk held too long: it starts again when resumed)
        while True:
            if self.resets != self.ledger.resets:  # the tree was reset: every session placed again (rare)
                everyone = [*self.end_of, *self.anchor_of, *self.untagged]
                self._clear()
                self.pending.update(everyone)
            started = time.perf_counter()
            k = 0
            watch = self.watch
            while watch.splits:  # a split: a node came above on the paths through its tail
                head, tail = watch.splits.pop()
                watch.nodes.add(head)
                watch.nodes.add(tail)
            if watch.paths:  # paths locked or unlocked: every node on them with sessions beneath
                self._lock_paths(watch)
            while self.pending:
                self._re_end(self.pending.pop())
                k += 1
                if k >= CHUNK or k % 8 == 0 and time.perf_counter() - started > STEP_S:
                    break
            else:
                while self._resum:
                    sid = self._resum.pop()
                    if sid in self.anchor_of:
                        self._re_end(sid)
                    k += 1
                    if k >= CHUNK or k % 8 == 0 and time.perf_counter() - started > STEP_S:
                        break
                else:
                    if self._renode(started):
                        if not (self.pending or self._resum or watch.nodes or self._dirty or watch.splits or watch.paths):
                            self.settled_at = time.monotonic()
                            return True
            yield

    def _lock_paths(self, watch: Any) -> None:
        """The nodes on each path locked or unlocked since the last settle, up to the root, that
        have an entry (a session ends beneath them) or lie on a branching session's path below its
        anchor: their weight may have moved. A walk stops at a node it met already."""
        root, entries, through, nodes = self.ledger.root, self.entries, self.through, watch.nodes
        seen: set[Node] = set()
        paths = watch.paths
        for _ in range(min(CHUNK, len(paths))):  # the rest at the next step
            node = paths.pop()
            while node is not None and node is not root and node not in seen:
                seen.add(node)
                if node in entries or node in through:  # (through: a branch below an anchor)
                    nodes.add(node)
                node = node.parent
        if not paths:
            paths.clear()  # its table freed (a set drained by pop() keeps it: see SessionOrders)

    def _re_end(self, sid: str) -> None:
        """Where ``sid`` ends or is anchored now (its old place left where it moved)."""
        leaves = self.leaves_of(sid) if sid in self.ledger.tags else ()
        end = self._one_path_end(leaves) if leaves else None
        if end is not None and self.tail is None and self.end_of.get(sid) is end:
            return  # ends where it did: its figure moves only with its nodes' weights (told apart)
        self._leave(sid)
        if not leaves:
            if self.listed(sid):
                if sid not in self._untagged_set:
                    self._untagged_set.add(sid)
                    self.untagged.add(sid)
            elif sid in self._untagged_set:
                self._untagged_set.discard(sid)
                self.untagged.discard(sid)
            return
        if sid in self._untagged_set:
            self._untagged_set.discard(sid)
            self.untagged.discard(sid)
        if end is not None and self.tail is None:  # one path: it ends at its deepest tagged node
            p = self._entry(end)
            p.ends.add(sid)
            if p.sorted_ends is not None:
                p.sorted_ends.add(sid)
            elif len(p.ends) > ENDS_SORTED:
                p.sorted_ends = SortedList(p.ends)
            self.end_of[sid] = end
            self._dirty.add(end)
            return
        if end is not None:  # one path ending inside its deepest node: anchored there, plus its reach
            w = self.weight(end)
            rest = self.tail(end, sid) - w  # type: ignore[misc]
            self._anchor(sid, end, rest, [end])
            return
        root = self.ledger.root
        chains = []
        for leaf in leaves:
            chain = []
            node = leaf
            while node is not None and node is not root:
                chain.append(node)
                node = node.parent
            chains.append(chain)
        deepest = max(chains, key=len)
        union: set[Node] = set()
        for chain in chains:
            union.update(chain)
        common = set(deepest)
        for chain in chains:
            common.intersection_update(chain)
        anchor = next((v for v in deepest if v in common), root)
        below = [v for v in union if v not in common]
        weight, tail = self.weight, self.tail
        rest = 0.0
        for v in below:
            rest += weight(v) if tail is None else tail(v, sid)
        self._anchor(sid, anchor, rest, below)

    def _anchor(self, sid: str, anchor: Node, rest: float, below: list[Node]) -> None:
        """``sid`` anchored at ``anchor``, its path below adding ``rest`` (re-summed whenever a node
        of ``below`` moves)."""
        for v in below:
            users = self.through.get(v)
            if users is None:
                self.through[v] = {sid}
            else:
                users.add(sid)
        p = self._entry(anchor)
        p.anchored[sid] = rest
        self.anchor_of[sid] = (anchor, rest, below)
        self._dirty.add(anchor)

    def _one_path_end(self, leaves: Collection[Node]) -> Node | None:
        """The deepest of ``leaves`` where every other lies on its root path, else None (they
        branch). One walk up from the newest, then from each other only to the first node seen."""
        root = self.ledger.root
        ordered = list(leaves)
        end = ordered[-1]  # the newest tag: most often the deepest
        on_path: set[Node] = set()
        node = end
        while node is not None and node is not root:
            on_path.add(node)
            node = node.parent
        for leaf in ordered[:-1]:
            if leaf in on_path:
                continue
            node, below = leaf, []
            while node is not None and node is not root and node not in on_path:
                below.append(node)
                node = node.parent
            if node is not end:  # neither above the end nor below it: a branch
                return None
            on_path.update(below)  # the path goes on below the end: that leaf ends it now
            end = leaf
        return end

    def _leave(self, sid: str) -> None:
        """``sid`` off the node it ended or was anchored at."""
        old = self.end_of.pop(sid, None)
        if old is not None:
            p = self.entries.get(old)
            if p is not None:
                p.ends.discard(sid)
                if p.sorted_ends is not None:
                    p.sorted_ends.discard(sid)
                self._dirty.add(old)
        anchored = self.anchor_of.pop(sid, None)
        if anchored is not None:
            node, _, below = anchored
            p = self.entries.get(node)
            if p is not None:
                p.anchored.pop(sid, None)
                self._dirty.add(node)
            for v in below:
                users = self.through.get(v)
                if users is not None:
                    users.discard(sid)
                    if not users:
                        del self.through[v]

    def _entry(self, node: Node) -> _P:
        p = self.entries.get(node)
        if p is None:
            p = self.entries[node] = _P(next(self._seq))
        return p

    def _renode(self, started: float) -> bool:
        """The moved nodes re-summed, deepest first (a node after every child of it that moved),
        through a heap kept across steps: the moved nodes go in a chunk a step (each with its
        depth), then come out deepest first, each re-summed and, where its sums moved, its parent
        put in. False where the step ran out first."""
        nodes, dirty, heap, queued = self.watch.nodes, self._dirty, self._heap, self._queued
        root, through, tick = self.ledger.root, self.through, self._tick
        k = 0
        while nodes or dirty:
            if nodes:
                node = nodes.pop()
                users = through.get(node) if through else None
                if users:  # sessions anchored above whose path below moved: re-summed
                    self._resum.update(users)
            else:
                node = dirty.pop()
            if node not in queued:
                depth, v = 0, node
                while v is not None and v is not root:
                    depth += 1
                    v = v.parent
                queued.add(node)
                heapq.heappush(heap, (-depth, next(tick), node))
            k += 1
            if k >= CHUNK or k % 8 == 0 and time.perf_counter() - started > STEP_S:
                return False
        while heap:
            depth, _, node = heapq.heappop(heap)
            queued.discard(node)
            for up in self._resum_node(node):
                if up is not None and up not in queued:
                    queued.add(up)
                    heapq.heappush(heap, (depth + 1, next(tick), up))
            k += 1
            if heap and (k >= CHUNK or k % 8 == 0 and time.perf_counter() - started > STEP_S):
                return False
        if not heap:
            self._queued = set()  # a set drained by discard keeps its table (see SessionOrders)
        return True

    def _resum_node(self, node: Node) -> tuple[Node | None, ...]:
        """``node``'s extremes (``hk``: the most a session beneath adds from the node down, the
        least id among those; ``lk``: the least, the greatest id) from its sessions and children
        now, and its place under its parent; the nodes whose extremes this moved (to re-sum)."""
        p = self.entries.get(node)
        if p is None:
            return ()
        root = self.ledger.root
        live = node is root or ((p.ends or p.anchored or p.kids) and self.alive(node))
        if not live:  # nothing ends beneath it any more (or it left the tree)
            del self.entries[node]
            return (self._unhook(node, p),) if p.up is not None else ()
        highs: list[tuple[float, str]] = []
        lows: list[tuple[float, _Desc]] = []
        if p.ends:
            ends = p.sorted_ends
            first, last = (ends[0], ends[-1]) if ends is not None else (min(p.ends), max(p.ends))
            highs.append((-0.0, first))
            lows.append((0.0, _Desc(last)))
        if p.anchored:
            highs.append(min((-rest, sid) for sid, rest in p.anchored.items()))
            lows.append(min((rest, _Desc(sid)) for sid, rest in p.anchored.items()))
        if p.kids:
            if p.by_hi is not None:
                highs.append(p.by_hi[0][:2])
                lows.append(p.by_lo[0][:2])
            else:
                entries = self.entries
                highs.append(min(entries[c].hk for c in p.kids))
                lows.append(min(entries[c].lk for c in p.kids))
        w = 0.0 if node is root else self.weight(node)
        p.w = w
        if highs:
            h, l = min(highs), min(lows)
            hk, lk = (h[0] - w, h[1]), (l[0] + w, l[1])
        else:  # the root with nothing beneath
            hk, lk = (0.0, ""), (0.0, _Desc(""))
        parent = None if node is root else node.parent
        if p.up is not parent:  # it moved (a node split above it): off its old parent's list
            moved: list[Node | None] = []
            if p.up is not None:
                moved.append(self._unhook(node, p))
            p.hk, p.lk = hk, lk
            if parent is not None:
                self._hook(node, p, parent)
                moved.append(parent)
            return tuple(moved)
        if hk == p.hk and lk == p.lk:
            return ()
        up = self.entries.get(parent) if parent is not None else None
        if up is not None and up.by_hi is not None:
            up.by_hi.remove((*p.hk, p.seq, node))
            up.by_lo.remove((*p.lk, p.seq, node))
            up.by_hi.add((*hk, p.seq, node))
            up.by_lo.add((*lk, p.seq, node))
        p.hk, p.lk = hk, lk
        return (parent,)

    def _hook(self, node: Node, p: _P, parent: Node) -> None:
        up = self._entry(parent)
        up.kids[node] = None
        p.up = parent
        if up.by_hi is not None:
            up.by_hi.add((*p.hk, p.seq, node))
            up.by_lo.add((*p.lk, p.seq, node))
        elif len(up.kids) > WIDE:
            entries = self.entries
            up.by_hi = SortedList((*entries[c].hk, entries[c].seq, c) for c in up.kids)
            up.by_lo = SortedList((*entries[c].lk, entries[c].seq, c) for c in up.kids)

    def _unhook(self, node: Node, p: _P) -> Node | None:
        """``node`` off its registered parent's children; that parent (to re-sum)."""
        parent, p.up = p.up, None
        up = self.entries.get(parent)
        if up is not None:
            up.kids.pop(node, None)
            if up.by_hi is not None:
                up.by_hi.discard((*p.hk, p.seq, node))
                up.by_lo.discard((*p.lk, p.seq, node))
        return parent

    # ----- a page -----

    def walk(self, ascending: bool = False) -> Iterator[str]:
        """The listed sessions by (figure, id) descending, or backwards (``ascending``: from the
        order's other end), one at a time, as of the last ``settle``: it reads the sums and
        weights as they were summed, not the tree, so a walk may go on over several of the
        owner's steps between its caller's ``begin_walk`` and ``end_walk`` (no settle meanwhile).

        One heap of sessions and of nodes, each keyed by (its figure, its id) or, for a node, the
        extreme (figure, id) beneath it: a node comes out before any session it could precede. A
        rounded figure (fair share in bytes) keys a node by a bound widened past any other sum's
        rounding and by the least id (it comes out before every session of that figure)."""
        root = self.ledger.root
        p = self.entries.get(root)
        heap: list[tuple] = []
        tick = itertools.count()
        entries = self.entries
        rounded = self.rounded
        tie = _Desc if ascending else str

        def push_sid(sid: str, figure: float) -> None:
            b = self._bytes(figure, sid)
            heapq.heappush(heap, (b if ascending else -b, tie(sid), 1, next(tick), None))

        def push_node(node: Node, above: float, siblings: Any, at: int) -> None:
            e = entries[node]
            if ascending:
                value, who = e.lk
                key = (self._lower(above + value), _FIRST) if rounded else (round(above + value), who)
            else:
                value, who = e.hk
                key = (-self._upper(above - value), "") if rounded else (-round(above - value), who)
            heapq.heappush(heap, (*key, 0, next(tick), (node, above, siblings, at)))

        untagged = self.untagged
        if untagged:  # figure 0: one cursor over their ids
            at = len(untagged) - 1 if ascending else 0
            heapq.heappush(heap, (0, tie(untagged[at]), 1, next(tick), (untagged, at)))
        if p is not None and (p.kids or p.ends or p.anchored):
            push_node(root, 0.0, None, 0)
        while heap:
            key = heapq.heappop(heap)
            if key[2] == 1:  # a session
                yield key[1].sid if ascending else key[1]
                if key[4] is not None:  # the next of the same figure (ending at one node, or untagged)
                    ids, at = key[4]
                    at = at - 1 if ascending else at + 1
                    if 0 <= at < len(ids):
                        heapq.heappush(heap, (key[0], tie(ids[at]), 1, next(tick), (ids, at)))
                continue
            node, above, siblings, at = key[4]
            if siblings is not None and at + 1 < len(siblings):
                nxt = siblings[at + 1]
                push_node(nxt if type(siblings) is list else nxt[3], above, siblings, at + 1)
            e = entries[node]
            here = above + e.w
            if e.ends:
                self._push_ends(heap, e, here, ascending, tick)
            for sid, rest in e.anchored.items():
                push_sid(sid, here + rest)
            if e.kids:
                if e.by_hi is not None:  # many: walked in their kept order, one at a time
                    kids: Any = e.by_lo if ascending else e.by_hi
                    push_node(kids[0][3], here, kids, 0)
                else:
                    kids = sorted(e.kids, key=(lambda c: entries[c].lk) if ascending else (lambda c: entries[c].hk))
                    push_node(kids[0], here, kids, 0)

    def _push_ends(self, heap: list, e: _P, figure: float, ascending: bool, tick: Any) -> None:
        """The sessions ending at one node: one figure, pushed one at a time in id order (the
        next when one is taken), or each summed its row's way where the figure is unsure."""
        tie = _Desc if ascending else str
        if self._unsure(figure):
            for sid in e.ends:
                b = self.exact(sid)
                heapq.heappush(heap, (b if ascending else -b, tie(sid), 1, next(tick), None))
            return
        ends: Any = e.sorted_ends if e.sorted_ends is not None else sorted(e.ends)
        at = len(ends) - 1 if ascending else 0
        b = self._bytes(figure, None)
        heapq.heappush(heap, (b if ascending else -b, tie(ends[at]), 1, next(tick), (ends, at)))

    def _unsure(self, figure: float) -> bool:
        if not self.rounded:
            return False
        x = figure * self.scale
        return abs(x - int(x) - 0.5) <= UNSURE * max(1.0, abs(x))

    def _bytes(self, figure: float, sid: str | None) -> int:
        if not self.rounded:
            return round(figure)
        if sid is not None and self._unsure(figure):
            return self.exact(sid)
        return round(figure * self.scale)

    def _upper(self, figure: float) -> int:
        return int(figure * self.scale * (1 + SLACK)) + 1

    def _lower(self, figure: float) -> int:
        return int(figure * self.scale * (1 - SLACK)) - 1
