"""The event tree adapter: the read-only contract over a tree kept from KV-event batches.

A server's prefix cache reports every change as ``BlockStored`` (blocks with a parent-hash chain),
``BlockRemoved`` and ``AllBlocksCleared`` (``wire``). Whoever delivers the batches (``zmq``'s
``KVEventsAdapter`` over a server's ZMQ stream, ``core``'s ``CoreEvents`` from SGLang's Rust tree
core in process) feeds them here, and the blocks become a radix tree (``block_tree``): a node is a
run of blocks with no branch inside, so SGLang's one-token pages (its default ``page_size`` of 1)
still read as whole prompts. Nothing in the events says what is locked: actions, lock counts,
hit counts and capacity are unavailable, and the capabilities say so. Sessions are known where
the stream says which session's request stored each block (``session_id``, SGLang 0.5.19+): a
node's holders are those sessions, and their figures are kept as the tree changes
(``figures.BlockLedger``); before the stream has carried one, sessions are unavailable
(unknown, not none).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NoReturn

from radixtop.adapters.base import (
    CacheAdapter,
    check_child_order,
    check_history_read,
    check_page,
    check_paths,
    check_query,
    check_sessions_read,
    path_nodes,
)
from radixtop.adapters.errors import BadRequest, UnknownSession, Unsupported, read_only, unknown_node
from radixtop.adapters.events.block_tree import BlockNode, BlockTree, block_id
from radixtop.adapters.events.wire import Batch, Cleared, DecodeError, Removed, Stored, decode_batch
from radixtop.adapters.model import (
    FIRST_TOKENS,
    MAX_HISTORY_PAGE,
    MEDIUM_TIERS,
    ROOT_ID,
    Capabilities,
    Changes,
    ChildrenPage,
    ClosePlanView,
    CloseResultView,
    EvictResultView,
    FlushResultView,
    Geometry,
    HistoryPage,
    MatchView,
    NodeDetail,
    NodeView,
    PathsView,
    SessionDetail,
    SessionsPage,
    SessionView,
    SessionWhyView,
    Stats,
    ThenView,
    WhyView,
)
from radixtop.adapters.owned.records import ids_of
from radixtop.adapters.owned.sessions import session_row, sessions_page_pass
from radixtop.adapters.owned.then_tree import More, Start, then_children_of, then_more
from radixtop.adapters.owned.why import (
    answer_session,
    history_page,
    journal_read,
    session_story,
    then_pass,
    then_view,
    why_view,
)
from radixtop.adapters.text import TEXT_TOKENS, decode_preview
from radixtop.gpu_backend.history import UNKNOWN, CacheHistory
from radixtop.gpu_backend.ledger import SessionOrders
from radixtop.gpu_backend.owner.slices import run_to_end

log = logging.getLogger(__name__)

_CHILD_KEYS = {
    "bytes": lambda n: (-n.subtree_tokens, n.id),
    "recency": lambda n: (-n.accessed, n.id),
    "tokens": lambda n: (-n.tokens, n.id),
}


@dataclass(frozen=True)
class StreamStatus:
    """Where the subscription stands. ``batch_rank``: the DP rank the batches carry; ``last_seq``:
    the last batch applied (-1 before any); ``complete``: no batch missing since the stream's
    start or its last AllBlocksCleared; ``missed_batches``: neither received nor replayed;
    ``restarts``: new publishers seen (the tree restarted); ``skipped_medium_events``: events of
    another storage tier (HiCache host/disk copies: kept as the nodes' other tiers, not as nodes); ``detached_*``: stored blocks whose parent
    block is unknown (never seen, or removed first), kept aside and not shown."""

    dp_rank: int
    endpoint: str
    replay_endpoint: str | None
    batch_rank: int | None
    last_seq: int
    batches: int
    events: int
    complete: bool
    missed_batches: int
    replays: int
    replayed_batches: int
    restarts: int
    unknown_events: dict[str, int]
    malformed_events: int
    bad_batches: int
    skipped_medium_events: int
    unknown_removes: int
    detached_blocks: int
    detached_tokens: int
    block_size: int
    last_batch_age_s: float | None
    last_error: str | None


def _no_locks(view: SessionView) -> SessionView:
    """A session as the events tell it: its locked tokens unknown (no lock is in them)."""
    return dataclasses.replace(view, locked_tokens=None)


class EventTreeAdapter(CacheAdapter):
    """A read-only CacheAdapter over a tree kept from KV-event batches, whoever delivers them:
    :class:`KVEventsAdapter` subscribes to a server's ZMQ stream; the SGLang plugin feeds the
    batches its cache records in process (``adapters.sglang.events.core``).

    Batches are applied to a :class:`BlockTree` under a lock; every read takes the lock, so a
    view is a consistent snapshot between two batches.
    """

    def __init__(self, *, name: str, endpoint: str = "in process", replay_endpoint: str | None = None,
                 dp_rank: int = 0, bytes_per_token: int = 0, geometry: Geometry | None = None,
                 capacity_tokens: int = 0, medium: str = "GPU", tokenizer: Any = None,
                 no_history: str | None = None):
        """``bytes_per_token`` (or ``geometry``) and ``capacity_tokens`` are not in the events:
        give them, or bytes and available space read 0. ``medium``: the storage tier whose blocks make
        the tree (events without a medium count as this one); events of other tiers say which
        tiers also hold each node, and how many tokens each tier holds. ``no_history``: keep none
        (where the tree lives inside the engine's own process: its memory and time are the
        engine's), and say this where one is asked for."""
        self.dp_rank = dp_rank
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.name = name
        self.geometry = geometry
        self.bytes_per_token = geometry.bytes_per_token if geometry else bytes_per_token
        self.capacity_tokens = capacity_tokens
        self.medium = medium
        self._main_tier = MEDIUM_TIERS.get(medium, medium)
        self._tiers: dict[str, dict[Any, list[int]]] = {}
        """Blocks other tiers hold (tier -> block key -> [tokens, stores]), from events of their medium."""
        self._tier_tokens: Counter[str] = Counter()
        """Tokens each other tier holds, kept as its blocks come and go (a poll sums nothing)."""
        self.tokenizer = tokenizer
        self._lock = threading.Condition()
        self._batch_ts: float | None = None
        """The moment of the batch being applied (its ``ts``: when the engine made it), the
        history's clock: a removal is kept at the time it happened, however late it is read."""
        self._no_history = no_history
        history = None if no_history else CacheHistory(
            clock=lambda: time.time() if self._batch_ts is None else self._batch_ts, cause=self.removals_are)
        self._tree = BlockTree(history)
        self._counts: Counter[str] = Counter()
        self._unknown: Counter[str] = Counter()
        self._last_seq = -1
        self._last_ts: float | None = None
        self._complete = True
        self._batch_rank: int | None = None
        self._block_size = 0
        self._removed_tokens = 0
        self._last_batch_at: float | None = None
        self._last_error: str | None = None
        self._sessions_seen = False  # a BlockStored with a session_id has been applied
        self._group_kinds: dict[int, str] = {}
        self._lora_of: dict[Any, str] = {}
        """The LoRA adapter of each cached block stored under one (vLLM's ``lora_name``), by block key."""
        """A hybrid model's KV-cache groups (vLLM's ``group_idx``) and their kinds, as stored."""
        self._orders: SessionOrders | None = None
        """The sessions in order, over the tree's ledger (made again when the tree is cleared)."""

    removals_are: str = UNKNOWN
    """Why a ``BlockRemoved`` happens where the stream's engine tells no other way (``history``'s
    cause: vLLM's ``evicted``); ``unknown`` where it may mean several (SGLang's: an eviction for
    room or a session's close): the history keeps when each block left, and says its cause is not
    told (the plugin beside SGLang's scheduler tells it)."""

    source = "rebuilt from KV events"
    """How the tree is known, for the capabilities' reason."""

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _restart(self) -> None:
        with self._lock:
            self._tree.clear(time.time())
            self._gap()  # (what left while the stream was away is not known)
            self._tiers.clear()
            self._tier_tokens.clear()
            self._counts["restarts"] += 1
            self._sessions_seen = False
            self._last_seq, self._last_ts, self._complete = -1, None, True

    def missed(self, n: int) -> None:
        """``n`` batches never came and none will (a gap no replay fills): the tree is incomplete."""
        self._missed(n)

    def _missed(self, n: int) -> None:
        with self._lock:
            self._counts["missed_batches"] += n
            self._complete = False
            self._gap()  # (what those batches removed is not known)

    def _gap(self) -> None:
        """The history is complete from now on only (the moment it is found: the wall clock's, not
        the last batch's; a cause told ends with it)."""
        self._batch_ts = None
        if self._tree.history is not None:
            self._tree.history.gap()

    def caused(self, cause: str, who: str = "") -> None:
        """The removals applied from now on are for ``cause`` (an action radixtop asked of the
        engine), until the next: the source tells it in order among the batches (the probe's
        ``CAUSED`` frames; ``CacheHistory.told``)."""
        with self._lock:
            if self._tree.history is not None:
                self._tree.history.told(cause, who)

    def tells_requests(self) -> None:
        """The source tells the engine's requests from now on (``served``)."""
        with self._lock:
            if self._tree.history is not None:
                self._tree.history.tells_requests()

    def served(self, payload: bytes) -> None:
        """The requests the engine admitted and gave back (a ``probe.SERVED`` frame: msgpack of
        ``[[session_id, rid, prompt_tokens, cached_tokens, "begin" | "finish" | "abort", prompt_ids,
        output_ids, at, begun], ...]``), told to the history at the moment the engine admitted or
        gave each back: a ``begin`` row its begin (its hit), a ``finish`` or ``abort`` row its end,
        and its begin too where that was not told at its admission (``begun`` false), with their
        token ids where they came. A frame that is not one is logged and dropped, never the
        applying thread down for it."""
        import msgspec

        try:
            rows = [(None if sid is None else str(sid), str(rid), max(0, int(prompt)), max(0, int(cached)),
                     how if how in ("begin", "abort") else "finish", ids_of(prompt_ids), ids_of(output_ids),
                     float(at), begun is True)
                    for sid, rid, prompt, cached, how, prompt_ids, output_ids, at, begun
                    in msgspec.msgpack.decode(payload)]
            if any(not math.isfinite(row[7]) or max(row[2], row[3]) >> 63 for row in rows):  # (a count is int64)
                raise ValueError("a moment or a count that is not one")
        except Exception:  # (anything: never the applying thread down for a frame)
            log.warning("radixtop: a SERVED frame that is not one: %r", bytes(payload[:80]))
            return
        with self._lock:
            history = self._tree.history
            if history is not None and history.served_since is not None:
                for sid, rid, prompt, cached, how, prompt_ids, output_ids, at, begun in rows:
                    if how == "begin" or not begun:
                        history.served(sid, prompt, cached, rid, prompt_ids, at=at)
                    if how != "begin":
                        history.did(how, sid, rid, output_ids, at=at)

    def apply(self, seq: int, payload: bytes) -> None:
        """Apply batch ``seq`` (an encoded ``KVEventBatch``) from a source that delivers every
        batch in order."""
        self._apply(seq, payload)

    def apply_batch(self, seq: int, batch: Batch) -> None:
        """Apply batch ``seq``, already decoded (the plugin's in-process events: no wire between)."""
        self._apply_decoded(seq, batch)

    def skipped(self, seq: int, error: str) -> None:
        """Batch ``seq`` could not be applied: the tree may be incomplete from here on."""
        with self._lock:
            self._counts["bad_batches"] += 1
            self._last_seq, self._complete, self._last_error = seq, False, error
            self._lock.notify_all()

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            with self._lock:
                self._counts["bad_batches"] += 1
                self._last_seq, self._complete = seq, False
                self._last_error = f"batch {seq}: {exc}"
                self._lock.notify_all()
            return
        self._apply_decoded(seq, batch)

    def _apply_decoded(self, seq: int, batch: Batch) -> None:
        with self._lock:
            self._batch_ts = batch.ts
            for event in batch.events:
                if not isinstance(event, Cleared) and event.medium not in (None, self.medium):
                    self._counts["skipped_medium_events"] += 1
                    self._other_tier(event)
                    continue
                self._removed_tokens += self._tree.apply(event, batch.ts)
                if isinstance(event, Cleared):
                    self._lora_of.clear()
                    self._tiers.clear()
                    self._tier_tokens.clear()
                    self._complete = True
                elif isinstance(event, Stored):
                    self._block_size = event.block_size
                    self._sessions_seen |= event.session_id is not None
                    if event.group_idx is not None and event.kind is not None:
                        self._group_kinds[event.group_idx] = event.kind
                    if event.lora_name is not None:
                        group = event.group_idx
                        for h in event.block_hashes:
                            self._lora_of[h if group is None else (group, h)] = event.lora_name
                else:
                    self._counts["removed_blocks"] += len(event.block_hashes)
                    if self._lora_of:
                        group = event.group_idx
                        for h in event.block_hashes:
                            key = h if group is None else (group, h)
                            if key not in self._tree.blocks:  # its last copy went
                                self._lora_of.pop(key, None)
            self._tree.ledger.settle()  # the sessions' figures, as of this batch
            self._unknown.update(batch.unknown)
            self._counts["malformed_events"] += batch.malformed
            self._counts["events"] += len(batch.events)
            self._counts["batches"] += 1
            if batch.rank is not None:
                self._batch_rank = batch.rank
            self._last_seq, self._last_ts = seq, batch.ts
            self._last_batch_at = time.monotonic()
            self._lock.notify_all()

    def _other_tier(self, event: Stored | Removed) -> None:
        """A copy in another tier (HiCache's host memory, disk or an external store): its blocks
        are kept by tier, to say which tiers hold each node of the tree and how much each holds."""
        tier = MEDIUM_TIERS.get(event.medium or "", event.medium or "?")
        blocks = self._tiers.setdefault(tier, {})
        group = event.group_idx
        if isinstance(event, Removed):  # one removal per store, as the tree counts them
            for h in event.block_hashes:
                key = h if group is None else (group, h)
                held = blocks.get(key)
                if held is not None:
                    held[1] -= 1
                    if not held[1]:
                        del blocks[key]
                        self._tier_tokens[tier] -= held[0]
        else:
            for h, tokens in event.blocks():
                key = h if group is None else (group, h)
                held = blocks.get(key)
                if held is None:
                    blocks[key] = [len(tokens), 1]
                    self._tier_tokens[tier] += len(tokens)
                else:
                    held[1] += 1

    def _node_tiers(self, node: BlockNode) -> tuple[str, ...]:
        """The main tier (the tree is its blocks), then every other tier that holds all of the
        node's blocks (the root holds no KV: none)."""
        if not node.blocks:
            return ()
        return (self._main_tier,) + tuple(tier for tier, blocks in self._tiers.items()
                                          if all(b.key in blocks for b in node.blocks))

    def wait_for_seq(self, seq: int, timeout: float = 5.0) -> bool:
        """Block until batch ``seq`` has been applied (or missed); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._last_seq >= seq, timeout)

    # ----- reads -----

    def status(self) -> StreamStatus:
        with self._lock:
            c, tree = self._counts, self._tree
            age = None if self._last_batch_at is None else time.monotonic() - self._last_batch_at
            return StreamStatus(
                self.dp_rank, self.endpoint, self.replay_endpoint, self._batch_rank, self._last_seq,
                c["batches"], c["events"], self._complete, c["missed_batches"], c["replays"],
                c["replayed_batches"], c["restarts"], dict(self._unknown), c["malformed_events"],
                c["bad_batches"], c["skipped_medium_events"], tree.unknown_removes,
                tree.detached_blocks(), tree.detached_tokens, self._block_size, age, self._last_error)

    def capabilities(self) -> Capabilities:
        st, sessions = self.status(), self.sessions_seen()
        if sessions:
            notes = ["read-only: rebuilt from KV events, which allow no action and carry no locks, hit counts "
                     "or capacity; sessions are those whose requests stored each block (session_id)"]
        else:
            notes = ["read-only: rebuilt from KV events, which carry no sessions (no session_id yet: SGLang "
                     "0.5.19+ sends it), locks, hit counts or capacity, and allow no action"]
        if not self.bytes_per_token:
            notes.append("bytes per token unknown (give a geometry)")
        if st.last_seq < 0:
            notes.append(f"no event batch received yet from {self.endpoint}")
        notes += self.health_notes(st)
        return Capabilities(tree=True, sessions=sessions, close=False, evict=False, flush=False,
                            changes=True, read_only=True, reason="; ".join(notes) + ".")

    def sessions_seen(self) -> bool:
        """A BlockStored with a session_id has been applied (sessions can be told)."""
        with self._lock:
            return self._sessions_seen

    def health_notes(self, st: StreamStatus | None = None) -> list[str]:
        """What may be missing from the tree: batches missed or failed, blocks detached."""
        st = st or self.status()
        notes = []
        if not st.complete:
            notes.append(f"the tree may be incomplete ({st.missed_batches} batches missed; "
                         "replay unavailable or its buffer had dropped them)")
        if st.detached_blocks:
            notes.append(f"{st.detached_blocks} blocks whose parent is unknown are not shown")
        return notes

    def stats(self) -> Stats:
        bpt, cap = self.bytes_per_token, self.capacity_tokens
        with self._lock:
            tree = self._tree
            total, nodes, version = tree.root.subtree_tokens, len(tree.nodes) - 1, tree.version
            removed, block_size = self._removed_tokens, self._block_size
            holding = len(tree.holding) if self._sessions_seen else None
            tiers = {self._main_tier: total, **{t: self._tier_tokens[t] for t in self._tiers}}
        g = self.geometry
        if g is None:
            geometry = Geometry("unknown", 0, 0, 0, "unknown", block_size, bpt)
        else:
            geometry = dataclasses.replace(g, page_size=block_size or g.page_size)
        # Locks are not in the events: every cached token counts as evictable, and what holds
        # slots outside the tree is unknown.
        return Stats(target=self.name, capacity_tokens=cap, available_tokens=max(cap - total, 0) if cap else 0,
                     evictable_tokens=total, protected_tokens=None, session_held_tokens=None,
                     uncached_tokens=None, unevictable_tokens=None, total_tokens=total,
                     bytes_per_token=bpt, node_count=nodes, open_sessions=holding, closed_sessions=None,
                     prompt_tokens=0, cached_tokens=0, evicted_tokens=removed, closes=0,
                     freed_by_close_tokens=0, version=version, geometry=geometry, tier_tokens=tiers)

    def _lookup(self, node_id: int) -> BlockNode:
        node = self._tree.nodes.get(node_id)
        if node is None:
            raise unknown_node(node_id, "removed, or never existed")
        return node

    def _view(self, node: BlockNode, depth: int, now: float) -> NodeView:
        bpt = self.bytes_per_token
        first = node.token_slice(0, FIRST_TOKENS)
        return NodeView(
            id=node.id, parent_id=node.parent.id if node.parent is not None else None, depth=depth,
            tokens=node.tokens, first_tokens=first, text=decode_preview(self.tokenizer, first),
            lock_ref=None, hit_count=None,  # not in the events: unknown
            access_age_s=max(0.0, now - node.accessed), created_age_s=max(0.0, now - node.created),
            bytes=node.tokens * bpt, subtree_tokens=node.subtree_tokens,
            subtree_bytes=node.subtree_tokens * bpt, num_children=len(node.children),
            holders=tuple(sorted(node.holders)) if self._sessions_seen else None, tiers=self._node_tiers(node))

    def children(self, node_id: int, offset: int = 0, limit: int = 100, order: str = "bytes") -> ChildrenPage:
        check_page(offset, limit)
        check_child_order(order)
        now = time.time()
        with self._lock:
            node = self._lookup(node_id)
            kids = list(node.children.values())
            key = _CHILD_KEYS[order]
            if offset + limit < len(kids) // 4:
                page = heapq.nsmallest(offset + limit, kids, key=key)[offset:]
            else:
                page = sorted(kids, key=key)[offset : offset + limit]
            depth = node.depth() + 1
            views = tuple(self._view(k, depth, now) for k in page)
            return ChildrenPage(node_id, offset, limit, len(kids), order, views)

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 256) -> NodeDetail:
        check_page(token_offset, token_limit)
        with self._lock:
            node = self._lookup(node_id)
            path_tokens, up = 0, node
            while up is not None:
                path_tokens += up.tokens
                up = up.parent
            if self._sessions_seen:
                self._tree.ledger.settle()
                beneath = self._tree.ledger.beneath(node)
            else:
                beneath = None
            return NodeDetail(node=self._view(node, node.depth(), time.time()), group=self._group_of(node),
                              lora=self._lora_of.get(node.blocks[0].key) if node.blocks else None,
                              token_ids=node.token_slice(token_offset, token_limit),
                              token_offset=token_offset, path_tokens=path_tokens, sessions_beneath=beneath,
                              text=decode_preview(self.tokenizer,
                                                  node.token_slice(token_offset, min(token_limit, TEXT_TOKENS))))

    def _group_of(self, node: BlockNode) -> str | None:
        """"KV group G (kind)" where the model has several groups (its blocks are keyed (G, hash))."""
        if len(self._group_kinds) < 2 or not node.blocks or not isinstance(node.blocks[0].key, tuple):
            return None
        group = node.blocks[0].key[0]
        kind = self._group_kinds.get(group)
        return f"KV group {group}" + (f" ({kind})" if kind else "")

    def paths(self, node_ids: Sequence[int]) -> PathsView:
        """``CacheAdapter.paths`` under the tree's lock: one moment of the stream."""
        asked = check_paths(node_ids)
        now = time.time()
        with self._lock:
            nodes, missing, capped = run_to_end(path_nodes(asked, self._tree.nodes.get, lambda n: n.parent))
            views = tuple(self._view(node, depth, now) for node, depth in nodes)
        return PathsView(asked, views, tuple(missing), capped)

    def match(self, tokens: list[int]) -> MatchView:
        """The longest prefix of ``tokens`` made of whole cached blocks (a prefix cache reuses
        whole pages only); a pure walk, nothing changes."""
        check_query(tokens)
        with self._lock:
            found = self._tree.match(tuple(tokens))
        return MatchView(len(tokens), found.matched, found.node.id,
                         found.partial.id if found.partial is not None else None,
                         found.partial_tokens, found.matched * self.bytes_per_token)

    def _history(self) -> CacheHistory:
        history = self._tree.history
        if history is None:
            raise Unsupported(self._no_history or f"{self.name} keeps no history of its tree")
        return history

    def why(self, tokens: list[int]) -> WhyView:
        """Over the blocks that left the tree (each under its hash below its parent's): a prefix
        cache reuses whole blocks only, so a lost run is whole blocks too."""
        check_query(tokens)
        with self._lock:
            history = self._history()
            tree = self._tree
            found = tree.match(tuple(tokens))
            live = tree.block_path(found)
            return why_view(history, tokens, live, found.matched, found.node.id,
                            None if found.partial is None else found.partial.id, found.partial_tokens,
                            max(1, self._block_size), unit="block")

    def why_session(self, session_id: str) -> SessionWhyView:
        story = self._sliced(lambda: session_story(self._history()))
        return answer_session(session_id, story, self.session, unit="block")

    def _sliced(self, make: Callable[[], Generator[None, None, Any]]) -> Any:
        """A pass over the history (``make``: its generator, made under the lock) run under the
        stream's lock a slice at a time: the batches that come meanwhile are applied between two
        slices, not after the whole pass (the passes see what the bounds drop between slices; a
        gap between two is BadRequest)."""
        passing: Generator[None, None, Any] | None = None
        gaps = 0
        while True:
            with self._lock:
                history = self._history()
                if passing is None:
                    passing, gaps = make(), history.gaps
                elif history.gaps != gaps:  # (a batch missed, a restart: what left meanwhile is not known)
                    passing.close()
                    raise BadRequest("the stream had a gap while its history was read (a batch missed, or the "
                                     "stream started again): ask again")
                try:
                    next(passing)
                except StopIteration as done:
                    return done.value
            time.sleep(0)  # (the interpreter to a thread that waits for the lock: the applying one)

    def history(self, after: int = 0, served_after: int = 0, limit: int = MAX_HISTORY_PAGE) -> HistoryPage:
        check_history_read(after, served_after, limit)
        with self._lock:
            read = journal_read(self._history(), after, served_after, limit)
        return history_page(read)

    def then(self, at: float | None = None) -> ThenView:
        """The blocks in the tree at ``at`` told from those now: each block stored or back in reach
        since, each that left since (radixtop's own thread: the stream's, not an engine's)."""
        tree = self._tree
        read = self._sliced(lambda: then_pass(self._history(), at, lambda: tree.root.subtree_tokens,
                                              tree.ledger if self._sessions_seen else None, self.bytes_per_token))
        return then_view(read, unit="block")

    def then_children(self, at: float | None, node_id: int = 0, offset: int = 0, limit: int = 100) -> ChildrenPage:
        """Block by block (the history names blocks, by ``block_id``; a node of the tree now is a
        run of them): a block's children are the next in its run, or the first of each node below."""
        self._history()  # (Unsupported where none is kept, saying why)
        return then_children_of(self, self._then_more(), at, node_id, offset, limit, live=_Blocks(self))

    def _then_more(self) -> More:
        def more(at: float | None, start: Start | None) -> Any:
            return self._sliced(lambda: then_more(self._history(), at, start))

        return more

    def changes(self, since: int) -> Changes:
        if since < 0:
            raise BadRequest(f"since must be >= 0, got {since}")
        with self._lock:
            return self._tree.changes(since)

    def export(self) -> Iterator[dict[str, Any]]:
        with self._lock:  # copy first: rows are yielded after the lock is released
            version = self._tree.version
            sessions = self._sessions_seen
            rows = [(n.id, n.parent.id, n.tokens, tuple(sorted(n.holders)) if sessions else None)
                    for n in self._tree.iter_nodes()]
        yield {"version": version, "bytes_per_token": self.bytes_per_token, "node_count": len(rows),
               "root_id": ROOT_ID}
        for node_id, parent, tokens, holders in rows:
            yield {"id": node_id, "parent": parent, "tokens": tokens, "lock_ref": None, "hit_count": None,
                   "holders": holders}

    # ----- sessions: who stored each block, where the stream says -----

    def _no_sessions(self) -> NoReturn:
        raise Unsupported(f"{self.name}: this KV-event stream has carried no session_id (SGLang 0.5.19+ sends it)")

    def _sessions(self) -> SessionOrders:
        """The tree's figures settled, and the sessions' orders over them (under the lock)."""
        if not self._sessions_seen:
            self._no_sessions()
        tree = self._tree
        tree.ledger.settle()
        orders = self._orders
        if orders is None or orders.ledger is not tree.ledger:
            ledger = tree.ledger
            orders = self._orders = SessionOrders(
                ledger, self.bytes_per_token, known=ledger.tags.__contains__, is_closed=lambda sid: False,
                seen_at=tree.last_store.get, leaves_of=lambda sid: ledger.held.get(sid, ()),
                everyone=lambda: ledger.tags)
        return orders

    def sessions(self, order: str = "exclusive_bytes", offset: int = 0, limit: int = 100, contains: str = "",
                 reverse: bool = False) -> SessionsPage:
        """The sessions whose requests stored blocks still cached (all "open": the events do not
        say when a session closes; locks are not in them, so ``locked_tokens`` is unknown). Figures
        and order as of the last event applied (the ledger keeps them as the tree changes)."""
        check_sessions_read(order, offset, limit, contains)
        with self._lock:
            page = run_to_end(sessions_page_pass(self._sessions(), order, offset, limit, contains, reverse,
                                                 clock=time.time))
        return dataclasses.replace(page, sessions=tuple(_no_locks(v) for v in page.sessions))

    def session(self, session_id: str) -> SessionDetail:
        with self._lock:
            orders = self._sessions()
            if session_id not in self._tree.holding:
                raise UnknownSession(f"no cached block was stored by session {session_id!r}")
            view = _no_locks(session_row(orders, session_id, clock=time.time))
            node_ids = tuple(n.id for n in self._tree.ledger.held.get(session_id, ()))
        return SessionDetail(view, node_ids)

    def plan_close(self, session_id: str) -> ClosePlanView:
        with self._lock:
            if not self._sessions_seen:
                self._no_sessions()
        self._refuse(f"close of session {session_id!r}")

    # ----- actions -----

    def _refuse(self, action: str) -> NoReturn:
        raise read_only(self.name, action, "it only listens to KV events")

    def close_session(self, session_id: str) -> CloseResultView:
        self._refuse(f"close of session {session_id!r}")

    def evict(self, num_tokens: int) -> EvictResultView:
        self._refuse(f"evict of {num_tokens} tokens")

    def flush(self) -> FlushResultView:
        self._refuse("flush")


class _Blocks:
    """The reads of the tree now block by block that a page of the tree then needs
    (``then_tree.then_children``'s ``live``): ids are the history's (``block_id``)."""

    def __init__(self, adapter: EventTreeAdapter) -> None:
        self.adapter = adapter

    def stats(self) -> Stats:
        return self.adapter.stats()

    def _block(self, number: int) -> Any:
        block = self.adapter._tree.block_of(number)
        if block is None:
            raise unknown_node(number, "no such block in the tree now")
        return block

    def _depth(self, block: Any) -> int:
        node = block.node
        depth = node.blocks.index(block) + 1
        node = node.parent
        while node is not None:
            depth += len(node.blocks)
            node = node.parent
        return depth

    def _view(self, block: Any, depth: int, now: float) -> NodeView:
        a, node = self.adapter, block.node
        subtree, tokens, bpt = self._subtree(block), len(block.tokens), a.bytes_per_token
        first = tuple(block.tokens[:FIRST_TOKENS])
        parent = block.parent_key
        return NodeView(
            id=block_id(block.key), parent_id=None if parent is None else block_id(parent), depth=depth, tokens=tokens,
            first_tokens=first, text=decode_preview(a.tokenizer, first), lock_ref=None, hit_count=None,
            access_age_s=max(0.0, now - node.accessed), created_age_s=max(0.0, now - node.created),
            bytes=tokens * bpt, subtree_tokens=subtree, subtree_bytes=subtree * bpt,
            num_children=1 if node.blocks[-1] is not block else len(node.children),
            holders=tuple(sorted(block.sessions)) if a._sessions_seen else None, tiers=a._node_tiers(node))

    def children(self, node_id: int, offset: int, limit: int, order: str) -> ChildrenPage:
        now = time.time()
        with self.adapter._lock:
            tree = self.adapter._tree
            if node_id == ROOT_ID:
                kids, depth = [c.blocks[0] for c in tree.root.children.values() if c.blocks], 1
            else:
                block = self._block(node_id)
                node, depth = block.node, self._depth(block) + 1
                at = node.blocks.index(block)
                kids = [node.blocks[at + 1]] if at + 1 < len(node.blocks) else [c.blocks[0] for c in node.children.values()]
            ranked = sorted(kids, key=lambda b: (-self._subtree(b), block_id(b.key)))  # (views of the page only)
            views = tuple(self._view(k, depth, now) for k in ranked[offset:offset + limit])
        return ChildrenPage(node_id, offset, limit, len(kids), "bytes", views)

    @staticmethod
    def _subtree(block: Any) -> int:
        """The tokens of ``block`` and all below it."""
        node = block.node
        if node.blocks[0] is block:
            return node.subtree_tokens
        return node.subtree_tokens - sum(len(b.tokens) for b in node.blocks[:node.blocks.index(block)])

    def node(self, node_id: int, token_offset: int = 0, token_limit: int = 1) -> Any:
        with self.adapter._lock:
            block = self._block(node_id)
            return SimpleNamespace(node=self._view(block, self._depth(block), time.time()))

    def paths(self, node_ids: list[int]) -> Any:
        """Each block's path up to the root, as (id, parent id)s."""
        nodes: dict[int, Any] = {}
        with self.adapter._lock:
            blocks = self.adapter._tree.blocks
            for number in node_ids:
                block = self.adapter._tree.block_of(number)
                while block is not None:
                    own = block_id(block.key)
                    if own in nodes:
                        break
                    parent = block.parent_key
                    nodes[own] = SimpleNamespace(id=own, parent_id=None if parent is None else block_id(parent))
                    block = None if parent is None else blocks.get(parent)
        return SimpleNamespace(nodes=list(nodes.values()))
