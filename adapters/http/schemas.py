"""Request and response schemas of the admin API (pydantic, for validation and OpenAPI).

They describe the JSON that ``adapters.http.wire`` produces from the view types; they are not the
internal types. The server answers with the wire dicts directly; tests validate those answers
against these models so the published schema cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----- requests -----


class EvictIn(Schema):
    tokens: StrictInt = Field(ge=0, le=2**63 - 1, description="Tokens to evict (LRU leaves first).")


# ----- errors -----


class ErrorDetail(Schema):
    code: str = Field(description="Stable, machine-readable: unknown_node, read_only, ...")
    message: str


class ErrorOut(Schema):
    error: ErrorDetail


# ----- reads -----


class CapabilitiesOut(Schema):
    tree: bool
    sessions: bool
    close: bool
    evict: bool
    flush: bool
    changes: bool
    read_only: bool
    reason: str


class GeometryOut(Schema):
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    bytes_per_token: int


class BucketOut(Schema):
    component: str = Field(description="SGLang's pool name: full, swa, mamba")
    total: int
    available: int
    evictable: int
    protected: int
    session_held: int
    uncached: int | None = Field(description="null: the target cannot tell")
    unaccounted: int | None = Field(description="total less every bucket: 0 when they add up, else a leak")


class StatsOut(Schema):
    """available + evictable + protected + session_held + uncached = capacity (SGLang's leak-check
    words); ``unevictable`` is the last three together, known even where they are not told apart."""

    target: str
    capacity_tokens: int
    available_tokens: int
    evictable_tokens: int
    protected_tokens: int | None = Field(description="locked tree nodes (SGLang's protected_size); null: the "
                                                     "target cannot tell them from running requests' slots")
    session_held_tokens: int | None = Field(description="slots sessions hold outside the tree; null: unknown")
    uncached_tokens: int | None = Field(description="running requests' slots beyond their cached prefix; "
                                                    "null: unknown")
    unevictable_tokens: int | None = Field(description="protected + session_held + uncached; null: the target "
                                                       "cannot tell (KV events carry no locks)")
    total_tokens: int
    bytes_per_token: int
    node_count: int | None = Field(description="null: the target cannot tell")
    open_sessions: int | None = Field(description="null: the target has no sessions, or cannot see them")
    closed_sessions: int | None
    prompt_tokens: int
    cached_tokens: int
    evicted_tokens: int
    closes: int
    freed_by_close_tokens: int
    version: int
    geometry: GeometryOut
    tier_tokens: dict[str, int] | None = Field(default=None, description="tokens per storage tier; null: unknown")
    buckets: list[BucketOut] | None = Field(default=None, description="SGLang's leak-check buckets per component; "
                                                                        "null: the target keeps none")
    capacity_bytes: int
    available_bytes: int
    evictable_bytes: int
    protected_bytes: int | None
    session_held_bytes: int | None
    uncached_bytes: int | None
    unevictable_bytes: int | None
    total_bytes: int
    free_tokens: int = Field(deprecated=True, description="available_tokens (wire version 1; until 0.3)")
    free_bytes: int = Field(deprecated=True, description="available_bytes (wire version 1; until 0.3)")
    running_tokens: int = Field(deprecated=True, description="unevictable less protected: session_held + uncached "
                                "where told apart, every unevictable token where not (wire version 1; until 0.3)")


class NodeOut(Schema):
    id: int
    parent_id: int | None
    depth: int
    tokens: int
    first_tokens: list[int]
    text: str | None
    lock_ref: int | None
    hit_count: int | None
    access_age_s: float
    created_age_s: float
    bytes: int
    subtree_tokens: int
    subtree_bytes: int
    num_children: int
    holders: list[str] | None
    tiers: list[str] | None = Field(default=None, description="storage tiers holding the node: GPU, host, disk, "
                                                                "external; null: the target cannot tell")
    left_at: float | None = Field(default=None, description="In the tree at a past moment (GET /v1/then/children): "
                                                             "when the node left since; null: it is in the tree now")
    left_cause: Literal["evicted", "closed", "flushed", "evict_action", "unknown"] | None = Field(
        default=None, description="Why it left: an eviction under pressure, a session's close, a flush, an evict")
    left_by: str | None = Field(default=None, description="The session whose close freed it, or who asked for the "
                                                          "flush or the evict")


class NodeDetailOut(Schema):
    node: NodeOut
    token_ids: list[int]
    token_offset: int
    path_tokens: int
    sessions_beneath: int | None
    text: str | None = None
    group: str | None = Field(default=None, description="A hybrid model's KV-cache group of the node (vLLM)")
    lora: str | None = Field(default=None, description="The LoRA adapter whose requests stored the node (vLLM)")


class ChildrenPageOut(Schema):
    parent_id: int
    offset: int
    limit: int
    total: int
    order: str
    children: list[NodeOut]


class SubtreeRowOut(Schema):
    node: NodeOut
    level: int
    more: int


class SubtreeOut(Schema):
    node_id: int
    depth: int
    limit: int
    order: str
    min_bytes: int
    rows: list[SubtreeRowOut]
    capped: bool


class SessionOut(Schema):
    id: str
    state: Literal["open", "closed"]
    tagged_nodes: int
    exclusive_bytes: int
    shared_bytes: int
    fair_share_bytes: int
    locked_tokens: int | None = Field(description="null: the target tells no locks (KV events)")
    last_activity_age_s: float | None


class SessionsPageOut(Schema):
    offset: int
    limit: int
    total: int
    order: str
    sessions: list[SessionOut]
    figures_age_s: float = 0.0
    refreshing: bool = False
    contains: str = ""
    reverse: bool = False
    all_sessions: int | None = None
    figures_current: bool = False


class EncodeOut(Schema):
    tokens: list[int]


class SessionDetailOut(Schema):
    session: SessionOut
    node_ids: list[int]


class MatchOut(Schema):
    query_tokens: int
    matched_tokens: int
    node_id: int
    partial_node_id: int | None
    partial_tokens: int
    matched_bytes: int


class LostOut(Schema):
    start: int
    end: int
    cause: Literal["evicted", "closed", "flushed", "evict_action", "unknown"]
    at: float
    node_id: int
    session_id: str | None
    holders: list[str]
    protected_tokens: int | None
    capacity_tokens: int | None
    who: str


class WhyOut(Schema):
    query_tokens: int
    cached_tokens: int
    diverges_at: int
    node_id: int
    partial_node_id: int | None
    partial_tokens: int
    lost: list[LostOut]
    history_since: float
    lost_unit: Literal["node", "block"] = Field("node", description="What a lost run's node_id names: a node "
                                                "of the tree, or a block by its hash (a KV-event stream)")


class ServedOut(Schema):
    at: float
    prompt_tokens: int
    cached_tokens: int


class LossOut(Schema):
    at: float
    cause: Literal["evicted", "closed", "flushed", "evict_action", "unknown"]
    nodes: int
    tokens: int
    node_id: int
    session_id: str | None
    protected_tokens: int | None
    capacity_tokens: int | None
    who: str


class SessionWhyOut(Schema):
    session_id: str
    requests: list[ServedOut] | None = Field(description="Its latest requests, oldest first; null where the "
                                                          "target does not tell its requests' hits")
    requests_kept: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    requests_since: float | None
    lost: list[LossOut] = Field(description="The nodes it held that left the tree, a loss each group that "
                                            "left together, oldest first")
    lost_tokens: dict[str, int] = Field(description="Tokens of all its losses kept, by cause")
    history_since: float
    lost_unit: Literal["node", "block"] = Field("node", description="What a loss's node_id names: a node, or a "
                                                "block by its hash (a KV-event stream)")


class GhostOut(Schema):
    seq: int
    at: float
    cause: Literal["evicted", "closed", "flushed", "evict_action", "unknown"]
    node_id: int
    parent_id: int | None
    tokens: list[int]
    session_id: str | None
    holders: list[str]
    protected_tokens: int | None
    capacity_tokens: int | None
    who: str


class ServedEntryOut(Schema):
    seq: int
    at: float
    session_id: str | None
    prompt_tokens: int = Field(description="A begin's: its prompt's tokens")
    cached_tokens: int = Field(description="A begin's: its prompt's tokens served from the cache")
    op: Literal["begin", "finish", "abort", "close", "register", "evict", "flush"] = "begin"
    request_id: str | None = None
    tokens: list[int] | None = Field(None, description="A begin's prompt, a finish's output (null: none, or no "
                                                       "longer kept)")
    asked_tokens: int = Field(0, description="An evict's")


class HistoryPageOut(Schema):
    epoch: str = Field(description="The history's name: another one (the target restarted) numbers from 1 again")
    removed: list[GhostOut]
    removed_first: int = Field(description="The number of the first in removed (the next to come where empty); "
                                           "past after + 1, those between were dropped by the history's bounds")
    removed_count: int
    served: list[ServedEntryOut] | None
    served_first: int
    served_count: int
    history_since: float


class BranchOut(Schema):
    node_id: int
    parent_id: int | None = Field(description="What it hangs below (null: the root), in the tree then and now")
    nodes: int
    tokens: int
    first_at: float
    last_at: float
    causes: dict[str, int] = Field(description="Its tokens by why they left (empty for what was stored since)")
    holders: list[str]


class SessionThenOut(Schema):
    session_id: str
    state: Literal["open", "closed"]
    requests: int
    prompt_tokens: int
    cached_tokens: int
    last_at: float
    last_prompt_tokens: int
    last_cached_tokens: int
    lost_since_tokens: int = Field(description="Tokens it held that left since")


class SessionMemoryThenOut(Schema):
    session_id: str
    tagged_nodes: int
    exclusive_tokens: int = Field(description="What its close would have freed then")
    shared_tokens: int = Field(description="On its paths then, and held by others too or locked")
    tagged_nodes_now: int
    exclusive_tokens_now: int
    shared_tokens_now: int


class ThenOut(Schema):
    at: float
    tokens_then: int
    tokens_now: int
    left_tokens: int = Field(description="In the tree then, not now")
    left_nodes: int
    left_by_cause: dict[str, int]
    left: list[BranchOut] = Field(description="The largest branches that left since, the largest first")
    left_branches: int
    stored_tokens: int = Field(description="In the tree now, not then")
    stored_nodes: int
    stored: list[BranchOut]
    stored_branches: int
    history_since: float = Field(description="The earliest moment a then can reach")
    unit: Literal["node", "block"] = Field("node", description="What node_id names: a node, or a block by its hash")
    sessions: list[SessionThenOut] | None = Field(None, description="The sessions active by then, the most recently "
                                                              "active first (null: the target tells no requests)")
    sessions_active: int | None = None
    sessions_open: int | None = None
    sessions_since: float | None = Field(None, description="Since when the ops are kept")
    memory: list[SessionMemoryThenOut] | None = Field(
        None, description="The sessions that held memory then, the most exclusive first (null: not known, the "
                          "target keeps no sessions' figures or not back to then)")
    memory_sessions: int | None = Field(None, description="How many held anything then")
    memory_since: float | None = Field(None, description="Since when the sessions' figures are kept (null: not kept)")
    bytes_per_token: int | None = Field(None, description="The KV pool's (null: not known here)")


class ChangesOut(Schema):
    since: int
    version: int
    resync: bool
    added: list[int]
    changed: list[int]
    removed: list[int]


class ReadResultOut(Schema):
    ok: Any = Field(None, description="The read's answer, as its own route sends it.")
    error: ErrorDetail | None = Field(None, description="Or the error the read met ...")
    status: int | None = Field(None, description="... and the HTTP status its own route would have answered.")


class ReadOut(Schema):
    results: list[ReadResultOut] = Field(description="One per read, in the order asked.")


class HealthOut(Schema):
    status: Literal["ok"]
    target: str
    version: int
    read_only: bool


# ----- actions -----


class KeptNodeOut(Schema):
    node_id: int
    tokens: int
    reason: str


class ClosePlanOut(Schema):
    session_id: str
    policy: str
    state: Literal["open", "closed", "unknown"]
    freed_node_ids: list[int]
    freed_tokens: int
    freed_bytes: int
    released_holds: int
    kept: list[KeptNodeOut]


class CloseResultOut(Schema):
    session_id: str
    policy: str
    already_closed: bool
    freed_node_ids: list[int]
    freed_tokens: int
    freed_bytes: int
    released_holds: int


class CloseOut(Schema):
    plan: ClosePlanOut | None
    """None where the target cannot preview a close (SGLang's plain HTTP surface)."""
    result: CloseResultOut


class EvictOut(Schema):
    requested_tokens: int
    evicted_tokens: int
    evicted_nodes: int | None
    """null: the target cannot count them (SGLang's Rust tree core)."""
    evicted_bytes: int


class FlushOut(Schema):
    freed_tokens: int
    freed_nodes: int | None
    """null: the target cannot count them (the Rust tree core, SGLang's plain HTTP routes)."""
    freed_bytes: int
    flushed: bool
    message: str


class AuditEntryOut(Schema):
    time: float
    client: str
    action: str
    target: str
    allowed: bool
    plan: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None
    extra: dict[str, Any]


class AuditPageOut(Schema):
    offset: int
    limit: int
    entries: list[AuditEntryOut]


class FindingOut(Schema):
    kind: Literal["buckets", "leaked_lock", "starved_admission", "tombstone_tags", "idle_session", "usage_gauge"]
    summary: str = Field(description="One line, with its figures")
    meaning: str
    action: str = Field(description="What fixes it: a close or evict and what it frees now, or a bug to report")
    tokens: int
    bytes: int
    node_ids: list[int]
    session_id: str | None
    figures: dict[str, Any] = Field(description="The exact figures, by the cache's own names")


class DiagnosisOut(Schema):
    target: str
    findings: list[FindingOut]
    checked: list[str] = Field(description="The kinds checked")
    skipped: dict[str, str] = Field(description="Kinds not checked, and why")
    idle_after_s: float
    nodes_walked: int | None = Field(description="null: no walk of the tree (it cannot be read)")
    took_s: float
    notes: list[str] = Field(default_factory=list, description="What the checks read, where it is no finding")
    healthy: bool = Field(description="No findings")


class ChainOut(Schema):
    node_id: int
    nodes: list[NodeOut]
    truncated: bool


class PathsOut(Schema):
    """The paths from the root to a set of nodes, read at one moment."""

    node_ids: list[int] = Field(description="the nodes asked for, as asked")
    nodes: list[NodeOut] = Field(description="every node on their paths once: the root first, parents before children")
    missing: list[int] = Field(description="the nodes asked for that are not in the tree")
    capped: bool = Field(description="the nodes stopped at the most one read answers")
