"""The block tree a KV-event stream builds: blocks by hash, the radix tree over them, its change
journal and what it attributes to sessions (no ZMQ, no threads: ``adapter.EventTreeAdapter`` feeds it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from radixtop.adapters.events.figures import BlockLedger
from radixtop.adapters.events.wire import BlockHash, Cleared, Event, Removed
from radixtop.adapters.model import Changes
from radixtop.gpu_backend.history import FLUSHED, ROOT, CacheHistory
from radixtop.gpu_backend.owner.journal import JOURNAL_LIMIT, ChangeJournal
from radixtop.gpu_backend.owner.shards import ShardedMap

BlockKey = Union[BlockHash, tuple[int, BlockHash]]
"""A block's hash, or (group_idx, hash) for vLLM's hybrid models (one block tree per KV group)."""


class _Block:
    __slots__ = ("key", "parent_key", "tokens", "node", "refs", "sessions")

    def __init__(self, key: BlockKey, parent_key: BlockKey | None, tokens: tuple[int, ...]):
        self.key, self.parent_key, self.tokens = key, parent_key, tokens
        self.node: BlockNode | None = None  # None while detached (its parent block is unknown)
        self.refs = 1
        self.sessions: frozenset[str] = frozenset()  # the sessions whose requests stored it


class BlockNode:
    """A run of blocks, each the only child of the one before (no branch inside a node)."""

    __slots__ = ("id", "parent", "blocks", "children", "tokens", "subtree_tokens", "created",
                 "accessed", "created_version", "holders", "under", "part", "excl", "partial")

    def __init__(self, node_id: int, parent: BlockNode | None, ts: float):
        self.id, self.parent = node_id, parent
        self.blocks: list[_Block] = []
        self.children: dict[BlockKey, BlockNode] = {}  # by the child's first block
        self.tokens = self.subtree_tokens = 0
        self.created = self.accessed = ts
        self.created_version = 0
        self.holders: dict[str, int] = {}
        """Session -> how many of this node's blocks its requests stored."""
        self.under: dict[str, int] | None = None
        """Session -> how many blocks it stored in the nodes below (``BlockLedger``)."""
        self.part: dict[str, int] | None = None
        """Session -> the end of the last block it stored here, in tokens (``BlockLedger``)."""
        self.excl: tuple[str, int] | None = None
        """The session this node's tokens are exclusive to, and how many (``BlockLedger``)."""
        self.partial: list[int] | None = None
        """The ends of the sessions not under this node, sorted (``BlockLedger``'s fair shares;
        None: to be made at the next read)."""

    def depth(self) -> int:
        depth, node = 0, self.parent
        while node is not None:
            depth, node = depth + 1, node.parent
        return depth

    def token_slice(self, offset: int, limit: int) -> tuple[int, ...]:
        out: list[int] = []
        for block in self.blocks:
            if len(out) >= limit:
                break
            n = len(block.tokens)
            if offset >= n:
                offset -= n
                continue
            out.extend(block.tokens[offset : offset + limit - len(out)])
            offset = 0
        return tuple(out)


@dataclass(frozen=True, slots=True)
class SessionFigures:
    """One session's share of the tree, in tokens. Its *path*: the blocks its requests stored
    and every block above them. ``exclusive``: on no other session's path; ``path - exclusive``
    is shared; ``fair``: each block of the path split evenly among the sessions whose paths
    cross it. ``last_store``: the batch time of its latest store."""

    tagged_nodes: int
    exclusive: int
    path: int
    fair: float
    last_store: float | None


@dataclass(frozen=True, slots=True)
class TreeAttribution:
    version: int
    sessions: dict[str, SessionFigures]
    beneath: dict[int, int]
    """Node id -> distinct sessions whose stored blocks are in it or below it."""


@dataclass(frozen=True, slots=True)
class TreeMatch:
    matched: int
    node: BlockNode
    partial: BlockNode | None
    partial_tokens: int


class BlockTree:
    """Stored blocks by hash, and the radix tree over them (root id 0, ids never reused).

    A block stored under the last block of a childless node extends that node; under a block
    inside a node, the node splits there (the head keeps its id). A block whose parent is
    unknown waits, detached and not shown, until its parent is stored; removing a block that
    still has descendants (vLLM may evict a parent first) detaches them. A hash stored twice
    (duplicate events) needs as many removals. ``version`` counts changes; the journal of
    touched ids answers ``changes(since)`` like the bundled cache's. A block stored by a
    session's request (``session``) holds that session: a node's ``holders`` are the sessions
    of its blocks, and ``holding`` counts, per session, the nodes it holds.
    """

    def __init__(self, history: CacheHistory | None = None) -> None:
        self.version = 0
        self._next_id = 1
        self._journal = ChangeJournal(JOURNAL_LIMIT)
        self.unknown_removes = 0
        self.history = history
        """The blocks that left the tree, when and why (``gpu_backend.history``: ``why``), each kept
        under its hash (``block_id``) below its parent's: a block's hash names its content and its
        whole prefix for all its life, as a node's id does in a radix tree. None where the stream
        does not say why a block leaves."""
        self.clear(0.0)

    def clear(self, ts: float) -> None:
        self.root = BlockNode(0, None, ts)
        # every node and every block, in shards: a dict of a million rebuilt its table in one
        # insert, holding the GIL (and a scheduler in the same process) ~50 ms (``ShardedMap``)
        self.nodes: ShardedMap[int, BlockNode] = ShardedMap({0: self.root})
        self.blocks: ShardedMap[BlockKey, _Block] = ShardedMap()
        self.keys_by_id: ShardedMap[int, BlockKey] = ShardedMap()
        """The key of each block in the tree whose key is not its id (``block_id``: a digest's bytes,
        a KV group's): what finds a block the history names (kept with a history only)."""
        self.waiting: dict[BlockKey, list[_Block]] = {}
        self.namespaces: dict[BlockKey, Any] = {}
        """The namespace of each block below the root stored by a LoRA's or a salted request
        (``(lora_name, cache_salt, first_extra_keys)``; the default one is not kept): a prompt (of the default
        namespace) matches none of them, and its removal is told with it, so that a prompt is
        explained by the removals of its own namespace only."""
        self.detached_tokens = 0
        self.copies = 0
        """Stores of a block beyond its first, not yet removed: vLLM keeps each copy apart in its
        pool (it recomputes a prompt's last full block and caches it again under the same hash)."""
        self.last_store: dict[str, float] = {}
        old = getattr(self, "ledger", None)
        if old is not None and old.journal is not None:  # (every session's figures go to 0 at once)
            for sid in list(old.held):
                old._mark(sid)
        self.ledger = BlockLedger(self.root)
        if self.history is not None:  # (each session's figures before they move: its memory then)
            self.ledger.journal = self.history
            self.history.tells_figures(self.history.since)  # (from the tree's start: it was empty; once)
        """Every session's figures, kept as the tree changes (``settle()`` before reading them)."""
        self.version += 1
        self._journal.reset(self.version)

    @property
    def holding(self) -> Mapping[str, int]:
        """Session -> the nodes it holds (the ledger's ``held``, counted)."""
        return self.ledger.tags

    def detached_blocks(self) -> int:
        return sum(len(w) for w in self.waiting.values())

    def _hold(self, node: BlockNode, sessions: frozenset[str], sign: int, tell: bool = True) -> None:
        """A block's ``sessions`` join (+1) or leave (-1) ``node``'s holders (``tell``: the
        ledger hears of it; a split tells it at once)."""
        for sid in sessions:
            n = node.holders.get(sid, 0) + sign
            crossed = n <= 0 or sid not in node.holders
            if n > 0:
                node.holders[sid] = n
            else:
                del node.holders[sid]
            if tell:
                self.ledger.held_by(node, sid, sign, crossed)

    def _touch(self, node: BlockNode) -> None:
        self.version += 1
        self._journal.record(node.id)

    def _resize(self, node: BlockNode, n: int, ts: float | None = None, own: bool = True) -> None:
        """``n`` more tokens in ``node`` (``own``) or below it, counted up to the root."""
        if own:
            node.tokens += n
            self.ledger.resized(node, n)
        up: BlockNode | None = node
        while up is not None:
            up.subtree_tokens += n
            if ts is not None:
                up.accessed = ts
            up = up.parent

    def apply(self, event: Event, ts: float) -> int:
        """Apply one event; the tokens it removed. vLLM's KV groups (``group_idx``) key their
        blocks apart; a removal goes leaf-first (SGLang lists a node's pages root-ward first).
        The sessions' figures are settled at the next read, or by whoever applies a batch
        (``ledger.settle()``: what the batch moved, no more)."""
        if isinstance(event, Cleared):
            if self.history is not None:
                self._flushed()
            self.clear(ts)
            return 0
        group = event.group_idx
        if isinstance(event, Removed):
            return sum(self.remove(h if group is None else (group, h)) for h in reversed(event.block_hashes))
        parent = event.parent_block_hash
        if parent is not None and group is not None:
            parent = (group, parent)
        blocks, session = event.blocks(), event.session_id
        namespaced = event.lora_name is not None or event.cache_salt is not None or event.first_extra_keys is not None
        if parent is None and (self.namespaces or namespaced):
            first = blocks[0][0] if group is None else (group, blocks[0][0])
            if not namespaced:
                self.namespaces.pop(first, None)  # (the same hash stored by the default: its too)
            elif first not in self.blocks:
                self.namespaces[first] = (event.lora_name, event.cache_salt, event.first_extra_keys)
        i = 0
        while i < len(blocks):
            h, tokens = blocks[i]
            key = h if group is None else (group, h)
            if parent is not None and key not in self.blocks:  # the common case in one go: below
                taken = self._extend(blocks, i, group, parent, ts, session)
                if taken:
                    i += taken
                    last = blocks[i - 1][0]
                    parent = last if group is None else (group, last)
                    continue
            self.store(key, parent, tokens, ts, session)
            parent = key
            i += 1
        return 0

    def _extend(self, blocks: list[tuple[BlockHash, tuple[int, ...]]], i: int, group: int | None,
                parent_key: BlockKey, ts: float, session: str | None) -> int:
        """New blocks ``i..`` that extend a childless node whose last block is their parent (a
        prompt growing a leaf: most of what a server stores) join that node at once: one resize
        up the tree, one journal entry, however many blocks. Stops before a block already known
        or one that detached blocks wait for; returns how many it took (0: not this case)."""
        above = self.blocks.get(parent_key)
        node = above.node if above is not None else None
        if node is None or node.children or node.blocks[-1] is not above:
            return 0
        sessions = frozenset((session,)) if session is not None else frozenset()
        known, waiting = self.blocks, self.waiting
        taken = added = 0
        for h, tokens in blocks[i:]:
            key = h if group is None else (group, h)
            if key in known or key in waiting:
                break
            block = known[key] = _Block(key, parent_key, tokens)
            block.node, block.sessions = node, sessions
            node.blocks.append(block)
            if self.history is not None:
                self._told_stored(block)
            added += len(tokens)
            taken += 1
            parent_key = key
        if taken:
            if session is not None:
                self.last_store[session] = ts
                self.ledger.stored_at(session)
                self._hold(node, sessions, taken)
            self._resize(node, added, ts)
            self._touch(node)
        return taken

    def store(self, key: BlockKey, parent_key: BlockKey | None, tokens: tuple[int, ...], ts: float,
              session: str | None = None) -> None:
        if session is not None:
            self.last_store[session] = ts
            self.ledger.stored_at(session)
        block = self.blocks.get(key)
        if block is not None:
            block.refs += 1
            self.copies += 1
            if session is not None and session not in block.sessions:
                added = frozenset((session,))
                block.sessions |= added
                if block.node is not None:
                    self._hold(block.node, added, +1)
                    self._touch(block.node)
            return
        block = self.blocks[key] = _Block(key, parent_key, tokens)
        if session is not None:
            block.sessions = frozenset((session,))
        pending = [block]
        while pending:
            block = pending.pop()
            self._attach(block, ts)
            if block.node is not None:
                waiters = self.waiting.pop(block.key, ())
                self.detached_tokens -= sum(len(w.tokens) for w in waiters)
                pending.extend(waiters)

    def _attach(self, block: _Block, ts: float) -> None:
        if block.parent_key is None:
            parent = self.root
        else:
            above = self.blocks.get(block.parent_key)
            if above is None or above.node is None:
                self.waiting.setdefault(block.parent_key, []).append(block)
                self.detached_tokens += len(block.tokens)
                return
            parent = above.node
            if parent.blocks[-1] is not above:
                self._split(parent, parent.blocks.index(above) + 1)
            elif not parent.children:
                parent.blocks.append(block)
                block.node = parent
                if self.history is not None:
                    self._told_stored(block)
                self._hold(parent, block.sessions, +1)
                self._resize(parent, len(block.tokens), ts)
                self._touch(parent)
                return
        node = BlockNode(self._next_id, parent, ts)
        self._next_id += 1
        node.blocks.append(block)
        block.node = node
        if self.history is not None:
            self._told_stored(block)
        self._hold(node, block.sessions, +1)
        parent.children[block.key] = node
        self.nodes[node.id] = node
        self._resize(node, len(block.tokens), ts)
        self._touch(parent)
        self._touch(node)
        node.created_version = self.version

    def _split(self, node: BlockNode, at: int) -> None:
        """Blocks ``at..`` of ``node`` (and its children) move to a new child node."""
        self.ledger.before_split(node)
        tail = BlockNode(self._next_id, node, node.created)
        self._next_id += 1
        tail.accessed = node.accessed
        tail.blocks = node.blocks[at:]
        del node.blocks[at:]
        tail.children, node.children = node.children, {tail.blocks[0].key: tail}
        for child in tail.children.values():
            child.parent = tail
        for block in tail.blocks:
            block.node = tail
            self._hold(node, block.sessions, -1, tell=False)
            self._hold(tail, block.sessions, +1, tell=False)
        tail.tokens = sum(len(b.tokens) for b in tail.blocks)
        node.tokens -= tail.tokens
        tail.subtree_tokens = node.subtree_tokens - node.tokens
        self.ledger.split(node, tail)
        self.nodes[tail.id] = tail
        self._touch(node)
        self._touch(tail)
        tail.created_version = self.version

    def remove(self, key: BlockKey) -> int:
        """Drop one reference to a block; the tokens it freed (0 while others remain)."""
        block = self.blocks.get(key)
        if block is None:
            self.unknown_removes += 1
            return 0
        block.refs -= 1
        if block.refs:
            self.copies -= 1
            return 0
        del self.blocks[key]
        n, node = len(block.tokens), block.node
        if node is None:
            waiters = self.waiting[block.parent_key]
            waiters.remove(block)
            if not waiters:
                del self.waiting[block.parent_key]
            self.detached_tokens -= n
            return n
        if node.blocks[-1] is not block:
            self._split(node, node.blocks.index(block) + 1)
        for child in list(node.children.values()):
            self._detach(child)
        node.blocks.pop()
        if self.history is not None:
            self._told_removed(block)
        if self.namespaces and block.parent_key is None:
            self.namespaces.pop(key, None)  # (with a history or without)
        self._hold(node, block.sessions, -1)
        block.node = None
        self._resize(node, -n)
        self._touch(node)
        if not node.blocks:
            del self.nodes[node.id]
            del node.parent.children[key]
            self._touch(node.parent)
        return n

    def _flushed(self) -> None:
        """Every block in the tree left at once (``AllBlocksCleared``): told to the history as
        flushed."""
        assert self.history is not None
        with self.history.cause(FLUSHED):
            self._told_gone(self.root)

    def _told_gone(self, top: BlockNode) -> None:
        """Every block of ``top``'s subtree told to the history as gone now, the deepest first
        (past its bound the leaves go, not the prefixes before them)."""
        assert self.history is not None
        order: list[BlockNode] = []
        stack = [top]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        for node in reversed(order):
            for block in reversed(node.blocks):
                self._told_removed(block)

    def _told_stored(self, block: _Block) -> None:
        """``block`` joined the tree now (stored, or back in reach below a parent stored again)."""
        assert self.history is not None
        parent, key = block.parent_key, block.key
        self.history.stored(number := block_id(key), ROOT if parent is None else block_id(parent), len(block.tokens))
        if not isinstance(key, int):
            self.keys_by_id[number] = key

    def _told_removed(self, block: _Block) -> None:
        """``block`` left the tree now: told to the history, under its parent block (or the root)."""
        assert self.history is not None
        parent, key = block.parent_key, block.key
        self.history.removed(number := block_id(key), ROOT if parent is None else block_id(parent), block.tokens,
                             block.sessions, self.namespaces.get(key) if parent is None and self.namespaces else None)
        if not isinstance(key, int):
            self.keys_by_id.pop(number, None)

    def block_of(self, number: int) -> _Block | None:
        """The block in the tree now that the history names ``number`` (``block_id``), or None."""
        key = self.keys_by_id.get(number)
        if key is not None:
            block = self.blocks.get(key)
        else:  # (an int hash is its id, or its id less 2**64 where the engine's hash is signed)
            block = self.blocks.get(number)
            if block is None and number >= 1 << 63:
                block = self.blocks.get(number - (1 << 64))
        return block if block is not None and block.node is not None else None

    @staticmethod
    def block_path(found: TreeMatch) -> list[tuple[int, int]]:
        """``(block_id, end)`` of each block of a match's path (a ``why``'s live path): up from its
        node, then its whole blocks in the node it ends inside."""
        path: list[tuple[int, int]] = []
        end = found.matched - found.partial_tokens
        node: BlockNode | None = found.node
        while node is not None:
            for block in reversed(node.blocks):
                path.append((block_id(block.key), end))
                end -= len(block.tokens)
            node = node.parent
        path.reverse()
        end = found.matched - found.partial_tokens
        for block in found.partial.blocks if found.partial is not None else ():
            end += len(block.tokens)
            if end > found.matched:
                break
            path.append((block_id(block.key), end))
        return path

    def _detach(self, top: BlockNode) -> None:
        """Take ``top``'s subtree out of the tree; its blocks wait for their parents."""
        self.ledger.detached(top)
        parent = top.parent
        del parent.children[top.blocks[0].key]
        self._resize(parent, -top.subtree_tokens, own=False)
        self._touch(parent)
        stack = [top]
        if self.history is not None:  # its blocks are out of every prompt's reach from now: lost with the block above
            self._told_gone(top)
        while stack:
            node = stack.pop()
            del self.nodes[node.id]
            self._touch(node)
            node.holders = {}  # the ledger let them go (``detached``)
            for block in node.blocks:
                block.node = None
                self.waiting.setdefault(block.parent_key, []).append(block)
                self.detached_tokens += len(block.tokens)
            stack.extend(node.children.values())

    def match(self, tokens: tuple[int, ...]) -> TreeMatch:
        """``tokens``' cached path, in the default namespace (a LoRA's or a salted request's
        blocks below the root, ``namespaces``, are others' even where their tokens are the same)."""
        node, pos = self.root, 0
        other = self.namespaces
        while pos < len(tokens):
            child = next((c for c in node.children.values()
                          if tokens[pos : pos + len(c.blocks[0].tokens)] == c.blocks[0].tokens
                          and not (other and node is self.root and c.blocks[0].key in other)), None)
            if child is None:
                break
            matched = 0
            for block in child.blocks:
                if tokens[pos + matched : pos + matched + len(block.tokens)] != block.tokens:
                    break
                matched += len(block.tokens)
            if matched < child.tokens:
                return TreeMatch(pos + matched, node, child, matched)
            node, pos = child, pos + matched
        return TreeMatch(pos, node, None, 0)

    def changes(self, since: int) -> Changes:
        touched = self._journal.since(since, self.version, self.nodes)
        if touched is None:
            return Changes(since, self.version, True)
        return Changes(since, self.version, False, *touched)

    def attribute(self) -> TreeAttribution:
        """Every holding session's figures (:class:`SessionFigures`), in one pass, children
        before parents; within a node, blocks leaf-first (the sessions beneath only grow)."""
        tagged: Counter[str] = Counter()
        exclusive: Counter[str] = Counter()
        path: Counter[str] = Counter()
        fair: dict[str, float] = {}
        beneath: dict[int, int] = {}
        top: dict[int, frozenset[str]] = {}

        def add(tokens: int, sids: frozenset[str]) -> None:
            if not tokens or not sids:
                return
            share = tokens / len(sids)
            for sid in sids:
                path[sid] += tokens
                fair[sid] = fair.get(sid, 0.0) + share
            if len(sids) == 1:
                exclusive[next(iter(sids))] += tokens

        for node in reversed(list(self.iter_nodes())):
            sids: frozenset[str] = frozenset().union(*(top.pop(c.id) for c in node.children.values()))
            run = 0
            for block in reversed(node.blocks):
                if not block.sessions <= sids:
                    add(run, sids)
                    run, sids = 0, sids | block.sessions
                run += len(block.tokens)
            add(run, sids)
            top[node.id] = sids
            beneath[node.id] = len(sids)
            tagged.update(node.holders.keys())
        beneath[0] = len(frozenset().union(*top.values()))
        sessions = {sid: SessionFigures(tagged[sid], exclusive[sid], path[sid], fair.get(sid, 0.0),
                                        self.last_store.get(sid)) for sid in tagged}
        return TreeAttribution(self.version, sessions, beneath)

    def iter_nodes(self) -> Iterator[BlockNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def block_id(key: BlockKey) -> int:
    """A block's key as the history's int id: its hash (a digest's last 8 bytes, where the stream
    sends bytes), mixed with its KV group where it has one (vLLM's hybrid models)."""
    group, h = key if isinstance(key, tuple) else (None, key)
    if isinstance(h, bytes):
        h = int.from_bytes(h[-8:], "big")
    h &= (1 << 64) - 1  # (SGLang's Rust core hashes to a signed int: the same bits, unsigned)
    return h if group is None else (h ^ (group * 0x9E3779B97F4A7C15)) & ((1 << 64) - 1)
