"""The adapter contract's plain data: frozen view types (no torch, no textual); errors are in ``errors``.

Every face (dashboard, commands, HTTP API) sees a cache only through these types. They hold ints,
floats, strings, tuples and None; never tensors, never live tree nodes. Byte figures are plain
integers (a face formats them); times are ages in seconds relative to when the view was taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

CHILD_ORDERS: tuple[str, ...] = ("bytes", "recency", "tokens")
SESSION_ORDERS: tuple[str, ...] = ("exclusive_bytes", "shared_bytes", "fair_share_bytes", "locked_tokens",
                                   "tagged_nodes", "last_activity", "state", "id")
ROOT_ID = 0
FIRST_TOKENS = 16
"""A node view's ``first_tokens``: how many of its leading token ids it carries (the preview)."""


# ----- views -----


def _plain(value: Any) -> Any:
    if isinstance(value, _View):
        return value.to_dict()
    if isinstance(value, tuple) and value and isinstance(value[0], _View):
        return tuple(v.to_dict() for v in value)
    if isinstance(value, dict):
        return dict(value)
    return value


class _View:
    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON; like ``dataclasses.asdict`` without its deep copies (these views
        hold only immutable values), which cost more than building a page of 1000 rows."""
        return {name: _plain(getattr(self, name)) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Capabilities(_View):
    """What a target can do; a face hides what it cannot and says why."""

    tree: bool = True
    sessions: bool = True
    close: bool = True
    evict: bool = True
    flush: bool = True
    changes: bool = True
    read_only: bool = False
    reason: str = ""
    """Why something is missing, in one sentence (empty when nothing is)."""


@dataclass(frozen=True)
class Geometry(_View):
    """A model's KV geometry as a view: what a token's K and V cost in the pool."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    bytes_per_token: int

    @classmethod
    def of(cls, g: Any) -> Geometry:
        """The view of a geometry that has these fields (the backend's ``KVGeometry``)."""
        return cls(g.name, g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.page_size, g.bytes_per_token)


TIERS = ("GPU", "host", "disk", "external")
"""Storage tiers, device first: SGLang's HiCache keeps copies in host memory, on disk (its
storage backends) or in an external cache; its KV events name them by ``medium``."""
MEDIUM_TIERS = {"GPU": "GPU", "CPU_PINNED": "host", "CPU": "host", "DISK": "disk", "EXTERNAL": "external"}
"""KV events' ``medium`` (SGLang's ``StorageMedium``) -> tier."""


@dataclass(frozen=True)
class Bucket(_View):
    """One component's pool as SGLang's own leak check reads it (its idle and busy memory checks:
    ``available + evictable + protected + session_held + uncached == total``), by the same
    names. ``component``: SGLang's pool name (``full``, ``swa``, ``mamba``); ``uncached``: the
    slots running requests own beyond their cached prefix (None where the target cannot tell)."""

    component: str
    total: int
    available: int
    evictable: int
    protected: int
    session_held: int
    uncached: int | None

    @property
    def unaccounted(self) -> int | None:
        """``total`` less every bucket: 0 when they add up (SGLang's check passes); otherwise
        tokens no bucket explains, a leak (or, negative, slots counted twice). None: unknown."""
        if self.uncached is None:
            return None
        return self.total - (self.available + self.evictable + self.protected + self.session_held + self.uncached)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["unaccounted"] = self.unaccounted
        return d


POOL_STATES = ("available", "evictable", "protected", "session_held", "uncached")
"""The pool's states in SGLang's words and its leak check's order: they add up to capacity."""
HASH = "hash64"
NodeOrBlock = Annotated[int, HASH]
"""What left a tree, or differs in it: a node's id, or on a KV-event stream a block's hash, 64 bits
unsigned (the wire takes it up to 2**64-1, where a count stops at 2**63-1)."""
Cause = Literal["evicted", "closed", "flushed", "evict_action", "unknown"]
"""Why something left the tree (``gpu_backend.history``): the pool needed room, a session's close,
a flush, an evict someone asked for."""
CAUSES: tuple[str, ...] = get_args(Cause)
ServedOp = Literal["begin", "finish", "abort", "close", "register", "evict", "flush"]
"""The engine's ops a history keeps (``ServedEntry``): radixtop's trace ops, a replay's input."""


@dataclass(frozen=True)
class Stats(_View):
    """Cache totals, in SGLang's leak-check words: available + evictable + protected +
    session_held + uncached = capacity, in tokens and in bytes.

    ``protected``: locked tree nodes (SGLang's ``protected_size``); ``session_held``: slots that
    sessions hold outside the tree (SGLang 0.5.23's streaming sessions); ``uncached``: the slots
    running requests own beyond their cached prefix. None where the target cannot tell them
    apart; ``unevictable_tokens`` is their sum (None only where the target cannot tell it either).
    """

    target: str
    capacity_tokens: int
    available_tokens: int
    evictable_tokens: int
    protected_tokens: int | None
    """None: the target cannot tell locked nodes from running requests' slots (see ``unevictable_tokens``)."""
    session_held_tokens: int | None
    uncached_tokens: int | None
    unevictable_tokens: int | None
    """protected + session_held + uncached: what no eviction can free now. None: the target
    cannot tell (a tree kept from KV events, which carry no locks), never 0 for unknown."""
    total_tokens: int
    """Tokens held by the tree (evictable + locked nodes)."""
    bytes_per_token: int
    node_count: int | None
    """None: this target cannot tell (a tree it cannot read); never 0 for unknown."""
    open_sessions: int | None
    """None: this target has no sessions, or cannot see them."""
    closed_sessions: int | None
    prompt_tokens: int
    """Counter: prompt tokens of every request begun (a hit rate over a window is the ratio of
    the increments of cached_tokens and prompt_tokens)."""
    cached_tokens: int
    """Counter: prompt tokens served from the cache."""
    evicted_tokens: int
    closes: int
    freed_by_close_tokens: int
    version: int
    geometry: Geometry
    tier_tokens: dict[str, int] | None = None
    """Tokens each storage tier holds (``TIERS``; GPU is the device pool above); None: the target
    cannot tell, or keeps only the device tier."""
    buckets: tuple[Bucket, ...] | None = None
    """The pool by SGLang's leak-check buckets, one row per component; None: the target keeps no
    such accounting (the figures above still add up to capacity)."""

    def tokens_of(self, state: str) -> int | None:
        """The tokens in ``state`` (``capacity``, ``total``, ``unevictable`` or one of
        ``POOL_STATES``); None where the target cannot tell."""
        return getattr(self, f"{state}_tokens")

    def bytes_of(self, state: str) -> int | None:
        tokens = self.tokens_of(state)
        return None if tokens is None else tokens * self.bytes_per_token

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_tokens * self.bytes_per_token

    @property
    def available_bytes(self) -> int:
        return self.available_tokens * self.bytes_per_token

    @property
    def evictable_bytes(self) -> int:
        return self.evictable_tokens * self.bytes_per_token

    @property
    def unevictable_bytes(self) -> int | None:
        return self.bytes_of("unevictable")

    @property
    def total_bytes(self) -> int:
        return self.total_tokens * self.bytes_per_token

    @property
    def free_tokens(self) -> int:
        """``available_tokens``: the name before 0.2 (kept for one release)."""
        return self.available_tokens

    @property
    def free_bytes(self) -> int:
        """``available_bytes``: the name before 0.2 (kept for one release)."""
        return self.available_bytes

    @property
    def running_tokens(self) -> int:
        """Before 0.2 (kept for one release): the unevictable tokens less ``protected`` (0 where
        unknown, as it read then)."""
        return (self.unevictable_tokens or 0) - (self.protected_tokens or 0)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for state in ("capacity", *POOL_STATES, "unevictable", "total"):
            d[f"{state}_bytes"] = self.bytes_of(state)
        # wire version 1's keys, for clients of before 0.2, until 0.3 (http.wire.WIRE_VERSION)
        d["free_tokens"], d["free_bytes"], d["running_tokens"] = self.free_tokens, self.free_bytes, self.running_tokens
        return d


@dataclass(frozen=True)
class NodeView(_View):
    """One node as a row of the tree (what a page of children returns)."""

    id: NodeOrBlock
    """Its id; in the tree at a past moment of a KV-event stream, its block's (``then_children``)."""
    parent_id: NodeOrBlock | None
    depth: int
    tokens: int
    first_tokens: tuple[int, ...]
    text: str | None
    lock_ref: int | None
    """None: the target cannot tell (a tree kept from KV events, which carry no locks); never 0 for unknown."""
    hit_count: int | None
    access_age_s: float
    created_age_s: float
    bytes: int
    subtree_tokens: int
    subtree_bytes: int
    num_children: int
    holders: tuple[str, ...] | None
    """The sessions that hold the node; None: the target cannot tell (KV events without session ids)."""
    tiers: tuple[str, ...] | None = None
    """The storage tiers that hold the node's KV (``TIERS``: GPU, host, disk, external); None:
    the target cannot tell."""
    left_at: float | None = None
    """In the tree at a past moment (``CacheAdapter.then_children``): when this node left since
    (None: it is in the tree now)."""
    left_cause: Literal["evicted", "closed", "flushed", "evict_action", "unknown"] | None = None
    """Why it left: an eviction under pressure, a session's close, a flush, an operator's evict."""
    left_by: str | None = None
    """The session whose close freed it, or who asked for the flush or the evict."""


@dataclass(frozen=True)
class NodeDetail(_View):
    node: NodeView
    token_ids: tuple[int, ...]
    """A page of the node's token ids (``token_offset`` .. + len)."""
    token_offset: int
    path_tokens: int
    """Tokens from the root through this node."""
    sessions_beneath: int | None
    """Distinct sessions that hold this node or something below it (None: the target cannot tell)."""
    text: str | None = None
    """The page's token ids as text, where the target has a tokenizer (None: ids only)."""
    group: str | None = None
    """The KV-cache group whose blocks the node is, for a hybrid model ("KV group 1
    (sliding_window)", from vLLM's events); None: the model has one, or the target does not say."""
    lora: str | None = None
    """The LoRA adapter whose requests stored the node's blocks (vLLM's ``lora_name``); None: the base
    model, or the target does not say."""


@dataclass(frozen=True)
class ChildrenPage(_View):
    parent_id: NodeOrBlock
    offset: int
    limit: int
    total: int
    order: str
    children: tuple[NodeView, ...]


@dataclass(frozen=True)
class SubtreeRow(_View):
    node: NodeView
    level: int
    """Levels below the subtree's top (0 for the top itself)."""
    more: int
    """The node's children not among the rows (past ``limit``, under ``min_bytes``, below
    ``depth``, or past the rows' cap)."""


@dataclass(frozen=True)
class SubtreeView(_View):
    """A node and its largest descendants, ``depth`` levels deep, at most ``limit`` children
    each, read at one moment (one hold of the owner where the target has one): every row is of
    the same tree, so no child is larger than its parent and none has vanished in between."""

    node_id: int
    depth: int
    limit: int
    order: str
    min_bytes: int
    rows: tuple[SubtreeRow, ...]
    """Depth first: each row's children follow it, in ``order``."""
    capped: bool
    """The rows stopped at MAX_SUBTREE_ROWS; what was left is counted in ``more``."""


MAX_SUBTREE_ROWS = 2000
"""The most rows one subtree read returns (its hold of the owner grows with them)."""


@dataclass(frozen=True)
class PathsView(_View):
    """The paths from the root to a set of nodes, read at one moment where they are small (in one
    hold of the owner where the target has one: every path a face asks for); a read of more than
    a chunk's nodes yields to the owner between chunks, and a node changed meanwhile may end a
    path short. Every node on them once, the root first and each parent before its children, so
    a face can open the tree down to them or draw them as a tree of their own."""

    node_ids: tuple[int, ...]
    """The nodes asked for, as asked."""
    nodes: tuple[NodeView, ...]
    missing: tuple[int, ...]
    """The nodes asked for that are not in the tree (evicted, freed, or never there)."""
    capped: bool
    """The nodes stopped at MAX_PATH_NODES: a path past them is left out."""


MAX_PATHS = 1024
"""Nodes one ``paths`` read may ask for."""
MAX_PATH_NODES = 100_000
"""Nodes one ``paths`` read answers with at most (paths as deep as a long chain's)."""


@dataclass(frozen=True)
class ChainView(_View):
    """A run of single children below ``node_id``: its only child, that one's only child, and
    so on, top first. It ends with a node that has no child or several, or at the limit."""

    node_id: int
    nodes: tuple[NodeView, ...]
    truncated: bool
    """Stopped at the limit while the run went on."""


@dataclass(frozen=True)
class SessionView(_View):
    id: str
    state: Literal["open", "closed"]
    tagged_nodes: int
    exclusive_bytes: int
    """What closing it would free right now (the dry run of close)."""
    shared_bytes: int
    """On its paths but also held by other sessions or locked: a close keeps it."""
    fair_share_bytes: int
    """Each node's bytes split evenly among the sessions beneath it."""
    locked_tokens: int | None
    """Tokens on the session's paths that running requests lock; None: the target tells no locks
    (a tree kept from KV events)."""
    last_activity_age_s: float | None


@dataclass(frozen=True)
class SessionsPage(_View):
    offset: int
    limit: int
    total: int
    order: str
    sessions: tuple[SessionView, ...]
    figures_age_s: float = 0.0
    """How old the memory figures are: a large cache's attribution is reused a while, then made
    again in slices between the engine's steps while the last one is served."""
    refreshing: bool = False
    """A new attribution is being made now."""
    contains: str = ""
    """The filter the page is of: sessions whose id contains it (any case), or whose state it is."""
    reverse: bool = False
    """The order read from its other end."""
    all_sessions: int | None = None
    """Sessions before the filter (``total`` counts those that match it)."""
    figures_current: bool = False
    """The cache has not changed since the figures were made: they are exact now, however old."""


@dataclass(frozen=True)
class SessionDetail(_View):
    session: SessionView
    node_ids: tuple[int, ...]
    """The nodes it tagged and still holds."""


@dataclass(frozen=True)
class MatchView(_View):
    """A read-only longest-prefix lookup (nothing split, no access time touched)."""

    query_tokens: int
    matched_tokens: int
    node_id: int
    """The deepest node fully matched (the root when nothing is)."""
    partial_node_id: int | None
    partial_tokens: int
    """Tokens matched inside ``partial_node_id`` beyond ``node_id`` (a match ending mid-node)."""
    matched_bytes: int


@dataclass(frozen=True)
class LostView(_View):
    """Tokens ``[start, end)`` of a prompt, past its cached ones, that were cached before: the
    node that held them last, and when and why it left the tree (``gpu_backend.history``)."""

    start: int
    end: int
    cause: Cause
    """``evicted``: the pool needed room; ``closed``: a session's close freed it; ``flushed``;
    ``evict_action``: someone asked for an evict (``who``); ``unknown``: the target does not say
    (SGLang's KV events: an eviction for room or a session's close)."""
    at: float
    """When it left (seconds since the epoch)."""
    node_id: NodeOrBlock
    session_id: str | None
    """The session whose close freed it (``closed``)."""
    holders: tuple[str, ...]
    """The sessions that held it when it left."""
    protected_tokens: int | None
    """For ``evicted``: the pool's tokens locked by running requests then (None: not known)."""
    capacity_tokens: int | None
    who: str = ""


@dataclass(frozen=True)
class WhyView(_View):
    """Why a prompt missed: how much of it is cached now, where it leaves the cached path, and which
    of its tokens past that were cached before, and when and why they left."""

    query_tokens: int
    cached_tokens: int
    diverges_at: int
    """The token position where the prompt leaves the cached path (its cached tokens)."""
    node_id: int
    """The deepest node it matches whole (the root when none): the node it would have continued."""
    partial_node_id: int | None
    partial_tokens: int
    lost: tuple[LostView, ...]
    history_since: float
    """Every removal since this moment (seconds since the epoch) is kept; what left before it is
    not known."""
    lost_unit: Literal["node", "block"] = "node"
    """What a lost run's ``node_id`` names: a node of the tree, or (a KV-event stream's tree) a
    block, by its hash."""


@dataclass(frozen=True)
class ServedView(_View):
    """One request of a session: when it began, its prompt's tokens, and its hit."""

    at: float
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class LossView(_View):
    """Nodes a session held that left the tree together (one eviction, one close, one flush, one
    evict asked for): how many, their tokens, when and why."""

    at: float
    """When the first of them left (seconds since the epoch)."""
    cause: Cause
    nodes: int
    tokens: int
    node_id: NodeOrBlock
    """The first of them."""
    session_id: str | None
    """The session whose close freed them (``closed``): this one or another it shared them with."""
    protected_tokens: int | None
    capacity_tokens: int | None
    who: str = ""


@dataclass(frozen=True)
class SessionWhyView(_View):
    """A session's story in the cache's history: its requests' hits over time, and the nodes it
    held (its requests ended there) that left the tree, when and why."""

    session_id: str
    requests: tuple[ServedView, ...] | None
    """Its latest requests (at most ``MAX_SERVED_SHOWN``), oldest first; None where the target does
    not tell its requests' hits (radixtop's copy beside SGLang: the scheduler's records have none)."""
    requests_kept: int | None
    """All of its requests kept (the figures below are theirs)."""
    prompt_tokens: int | None
    cached_tokens: int | None
    requests_since: float | None
    """Every request since this moment is kept."""
    lost: tuple[LossView, ...]
    """Its latest losses (at most ``MAX_LOSSES_SHOWN``), oldest first."""
    lost_tokens: dict[str, int]
    """Tokens of all its losses kept, by cause."""
    history_since: float
    lost_unit: Literal["node", "block"] = "node"
    """What a loss's ``node_id`` names (``WhyView.lost_unit``)."""


MAX_SERVED_SHOWN = 200
MAX_LOSSES_SHOWN = 200


@dataclass(frozen=True)
class GhostView(_View):
    """A node that left the tree, as the history keeps it (the journal's ``removed``)."""

    seq: int
    """Its number in the journal (the first removal of the history is 1)."""
    at: float
    cause: Cause
    node_id: NodeOrBlock
    parent_id: NodeOrBlock | None
    """None: it hung below the root."""
    tokens: tuple[int, ...]
    session_id: str | None
    holders: tuple[str, ...]
    protected_tokens: int | None
    capacity_tokens: int | None
    who: str = ""


@dataclass(frozen=True)
class ServedEntry(_View):
    """An op of the engine's, as the history keeps it (the journal's ``served``): a request's
    ``begin`` (its session, its prompt's tokens and its hit), ``finish`` or ``abort``; a session's
    ``close`` or ``register``; an ``evict`` (``asked_tokens``) or ``flush`` someone asked for. With
    its token ids (a begin's prompt, a finish's output) while the history keeps them: a recording
    of them replays the server's own traffic (``radixtop replay --format recording``)."""

    seq: int
    at: float
    session_id: str | None
    prompt_tokens: int
    cached_tokens: int
    op: ServedOp = "begin"
    request_id: str | None = None
    tokens: tuple[int, ...] | None = None
    """None: none (an op without) or no longer kept (the history's bounds)."""
    asked_tokens: int = 0


@dataclass(frozen=True)
class HistoryPage(_View):
    """The history's journal from a reader's place (``CacheAdapter.history``; ``radixtop record``)."""

    epoch: str
    """The history's name: another one (the target restarted) numbers from 1 again."""
    removed: tuple[GhostView, ...]
    removed_first: int
    """The number of the first in ``removed`` (the next to come where it is empty): past the
    reader's place + 1, those between were dropped by the bounds before it read them."""
    removed_count: int
    """Removals numbered so far: the reader is through when its place reaches it."""
    served: tuple[ServedEntry, ...] | None
    """None where the target does not tell its requests."""
    served_first: int
    served_count: int
    history_since: float


@dataclass(frozen=True)
class BranchView(_View):
    """A part of the tree that differs between a past moment and now: a node and the nodes below it
    that differ with it (all left since, or all stored since)."""

    node_id: NodeOrBlock
    """Its top node (a block's hash on a KV-event stream: ``ThenView.unit``)."""
    parent_id: NodeOrBlock | None
    """What it hangs below (None: the root); a node that is in the tree both then and now."""
    nodes: int
    tokens: int
    first_at: float
    """When the first of it left (or was stored)."""
    last_at: float
    causes: dict[str, int]
    """Its tokens by why they left (empty for what was stored since)."""
    holders: tuple[str, ...]
    """The sessions that held any of it when it left (the first ``MAX_BRANCH_HOLDERS``)."""


@dataclass(frozen=True)
class SessionThenView(_View):
    """A session at a past moment (``ThenView.sessions``), from the history's ops up to it (its
    requests since the ops reach back to) and the nodes that left since."""

    session_id: str
    state: Literal["open", "closed"]
    """Closed then: its last op by then was its close."""
    requests: int
    """Its requests begun by then (since ``ThenView.sessions_since``)."""
    prompt_tokens: int
    cached_tokens: int
    last_at: float
    """Its last op by then."""
    last_prompt_tokens: int
    """Its last request's by then (0: none)."""
    last_cached_tokens: int
    lost_since_tokens: int
    """Tokens that left since that it held when they left (or its own close freed)."""


@dataclass(frozen=True)
class SessionMemoryThen(_View):
    """A session's memory at a past moment (``ThenView.memory``), as the sessions table tells it
    now: exact, from each move of its figures the history kept since (the ledger's marks)."""

    session_id: str
    tagged_nodes: int
    exclusive_tokens: int
    """What its close would have freed then."""
    shared_tokens: int
    """On its paths then, and held by others too or locked."""
    tagged_nodes_now: int
    exclusive_tokens_now: int
    shared_tokens_now: int


@dataclass(frozen=True)
class ThenView(_View):
    """The tree at a past moment, told from the tree now: what left since and what was stored since
    (``radixtop then``, the dashboard's timeline). Tokens are exact; a node split since shows as
    the nodes it is now."""

    at: float
    tokens_then: int
    tokens_now: int
    left_tokens: int
    """In the tree then, and not now (left since)."""
    left_nodes: int
    left_by_cause: dict[str, int]
    left: tuple[BranchView, ...]
    """The largest branches that left (``MAX_BRANCHES_SHOWN``), the largest first."""
    left_branches: int
    stored_tokens: int
    """In the tree now, and not then (stored since)."""
    stored_nodes: int
    stored: tuple[BranchView, ...]
    stored_branches: int
    history_since: float
    """The earliest moment a ``then`` can reach (every change since it is kept)."""
    unit: Literal["node", "block"] = "node"
    sessions: tuple[SessionThenView, ...] | None = None
    """The sessions active by then (an op of theirs since ``sessions_since``), the most recently
    active first (``MAX_SESSIONS_THEN``); None where the target does not tell its requests."""
    sessions_active: int | None = None
    """How many there are."""
    sessions_open: int | None = None
    """Of them, open then."""
    sessions_since: float | None = None
    """The moment since which the ops are kept (a session's requests before it are not counted)."""
    memory: tuple[SessionMemoryThen, ...] | None = None
    """The sessions that held memory then, the most exclusive first (``MAX_SESSIONS_THEN``); None
    where it is not known: the target keeps no sessions' figures, or not back to then
    (``memory_since``)."""
    memory_sessions: int | None = None
    """How many held anything then."""
    memory_since: float | None = None
    """The moment since which the sessions' figures are kept (None: not kept at all)."""
    bytes_per_token: int | None = None
    """The KV pool's (None: not known here)."""


MAX_BRANCHES_SHOWN = 50
MOMENT_TICKS_A_SECOND = 1000


def moment_end(at: float) -> float:
    """The end of the millisecond ``at`` falls in: the instant a past moment is told as of (its
    tree, its sessions and their memory: ``ThenView``). The same as the history's own
    (``gpu_backend.history.moment_end``, below the contract: it cannot import this; a test checks
    they agree), here for the faces that read answers, which load no backend."""
    return (math.floor(at * MOMENT_TICKS_A_SECOND) + 1) / MOMENT_TICKS_A_SECOND


MAX_SESSIONS_THEN = 50
MAX_BRANCH_HOLDERS = 20


MAX_HISTORY_PAGE = 2000
"""Removals (and requests) a page of the journal holds at most."""
MAX_HISTORY_PAGE_TOKENS = 1 << 18
"""Tokens of removed nodes a page holds at most (past them, the page ends early; one node always)."""


@dataclass(frozen=True)
class Changes(_View):
    since: int
    version: int
    resync: bool
    """Re-read everything: the journal no longer reaches back to ``since``, or more changed
    since then than a list of ids is worth (a target may cap it)."""
    added: tuple[int, ...] = ()
    changed: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()


@dataclass(frozen=True)
class KeptNodeView(_View):
    node_id: int
    tokens: int
    reason: str
    """root, locked, has_children, shared, or deref (the deref policy keeps everything)."""


@dataclass(frozen=True)
class ClosePlanView(_View):
    session_id: str
    policy: str
    state: Literal["open", "closed", "unknown"]
    freed_node_ids: tuple[int, ...]
    freed_tokens: int
    freed_bytes: int
    released_holds: int
    kept: tuple[KeptNodeView, ...] = ()


@dataclass(frozen=True)
class CloseResultView(_View):
    session_id: str
    policy: str
    already_closed: bool
    freed_node_ids: tuple[int, ...]
    freed_tokens: int
    freed_bytes: int
    released_holds: int


@dataclass(frozen=True)
class EvictResultView(_View):
    requested_tokens: int
    evicted_tokens: int
    evicted_nodes: int | None
    """None where the target cannot count them (SGLang's Rust tree core counts tokens only)."""
    evicted_bytes: int


@dataclass(frozen=True)
class FlushResultView(_View):
    freed_tokens: int
    freed_nodes: int | None
    """None where the target cannot count them (the Rust tree core, SGLang's plain HTTP routes)."""
    freed_bytes: int
    flushed: bool
    """False when it was refused because requests are running (as SGLang's flush_cache does)."""
    message: str = ""


TREE_FINDING_KINDS = ("buckets", "leaked_lock", "starved_admission", "tombstone_tags", "idle_session")
"""What the doctor checks of a radix cache whose owner radixtop reads, most serious first (see
``adapters.doctor``)."""
FINDING_KINDS = TREE_FINDING_KINDS + ("usage_gauge",)
"""Every kind of finding: the above, and vLLM's usage gauge against its tree (``adapters.vllm``)."""


@dataclass(frozen=True)
class Finding(_View):
    """One thing the doctor found: what it is, what it means, and the action that fixes it."""

    kind: str
    """One of FINDING_KINDS."""
    summary: str
    """One line, with its figures."""
    meaning: str
    action: str
    """What fixes it: a close or an evict (with what it frees now), or, for a bug of the cache
    itself, "report it" with the exact figures to report (in ``figures``)."""
    tokens: int
    """Tokens it concerns: unaccounted, pinned by leaked locks, held by the session, ..."""
    bytes: int
    node_ids: tuple[int, ...] = ()
    session_id: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    """The exact figures (ints and strings), by the cache's own names."""


@dataclass(frozen=True)
class Diagnosis(_View):
    """What ``CacheAdapter.diagnose`` found; no findings: healthy, as far as the checks that ran see."""

    target: str
    findings: tuple[Finding, ...]
    checked: tuple[str, ...]
    """The kinds checked (FINDING_KINDS order)."""
    skipped: dict[str, str]
    """Kinds not checked, and why (this target cannot tell)."""
    idle_after_s: float
    """A session idle this long that still holds memory is a finding."""
    nodes_walked: int | None = None
    """Nodes the lock and tombstone walk visited (None: no walk)."""
    took_s: float = 0.0
    notes: tuple[str, ...] = ()
    """What the checks read and what it means, where it is no finding (vLLM: its usage gauge
    against the tree, and why they differ)."""

    @property
    def healthy(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["healthy"] = self.healthy
        return d


@dataclass(frozen=True)
class AuditEntry(_View):
    time: float
    client: str
    action: str
    target: str
    allowed: bool
    plan: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


EXPORT_COLUMNS = ("id", "parent", "tokens", "lock_ref", "hit_count")
UNKNOWN = -1
"""An export column's value where the target cannot tell (``lock_ref`` and ``hit_count`` of a
tree kept from KV events): the JSON rows say null."""


@dataclass(frozen=True)
class ExportColumns:
    """The whole tree as columns (parents before children): one int64 column per name in
    ``EXPORT_COLUMNS`` (any sequence of ints: ``array('q')`` in process) and the holders of the
    nodes that have any. The compact form of an export: no object per node."""

    version: int
    bytes_per_token: int
    columns: dict[str, Any]
    holders: dict[int, tuple[str, ...]]

    @property
    def node_count(self) -> int:
        return len(self.columns["id"])
