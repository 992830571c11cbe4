"""The leak doctor: checks of a radix cache that find memory nobody can use, and say what frees it.

Pure functions over any radix tree whose nodes have ``parent``, ``children`` and ``key`` (the
bundled ``TreeNode`` and SGLang's alike); each adapter gives ``diagnose_pass`` what its cache
keeps (a ``DoctorInputs``) and runs it on the cache's owner thread in slices. The checks:

* ``buckets``: SGLang's own leak check (``available + evictable + protected + session_held +
  uncached == total``) fails for a component: slots nobody accounts for.
* ``leaked_lock``: a node's ``lock_ref`` is higher than the locks the running requests hold on it
  (each request locks the path from its ``last_node`` to the root): a lock never released pins
  its path, which no evict or close can free.
* ``starved_admission``: requests wait while what could be had (available + evictable) is less
  than the first one needs: protected memory starves admission.
* ``tombstone_tags``: a closed session (in the cache's tombstones) still tags nodes.
* ``idle_session``: an open session unused for ``idle_after_s`` still holds memory; a close would
  free what ``plan_close`` says.
* ``usage_gauge`` (vLLM, ``adapters.vllm``): its usage gauge says blocks are held while no request
  runs (leaked), or the tree caches more blocks than the pool has (removals the stream lost).

A walk of a large tree yields between chunks; what it finds is checked again in one last chunk
(a lock a request took or released meanwhile is not reported), so a finding is of one moment.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixtop.adapters.errors import AdapterError, BadRequest
from radixtop.adapters.model import TREE_FINDING_KINDS, ClosePlanView, Diagnosis, Finding
from radixtop.adapters.text import age

IDLE_AFTER_S = 600.0
"""A session unused this long that still holds memory is a finding (``--idle-after``)."""
WALK_CHUNK = 2048
"""Nodes the walk visits per chunk (chunks run within the owner's slices, ``gpu_backend.owner.slices``)."""
MAX_PER_KIND = 20
"""Findings of one kind listed one by one; the rest are summed in one more."""


def check_idle_after(idle_after_s: float) -> float:
    if not isinstance(idle_after_s, (int, float)) or not math.isfinite(idle_after_s) or idle_after_s < 0:
        raise BadRequest(f"idle_after_s must be a number of seconds >= 0, got {idle_after_s!r}")
    return float(idle_after_s)


@dataclass(frozen=True)
class Pool:
    """The pool's figures now, in tokens (SGLang's names; ``unevictable``: protected +
    session_held + uncached, what the queue cannot have)."""

    capacity: int
    available: int
    evictable: int
    unevictable: int


@dataclass(frozen=True)
class AdmissionQueue:
    """The requests waiting for slots: how many, and what the first of them needs."""

    waiting: int
    head_id: str
    head_need: int
    """Slots the first waiting request needs beyond its cached prefix."""


@dataclass
class DoctorInputs:
    """What an adapter's cache keeps, each read on the owner thread; None: this target cannot
    tell (the check is skipped, with ``skipped[kind]`` saying why)."""

    target: str
    bytes_per_token: int
    bug_owner: str
    """Whose bug a leak is ("SGLang 0.5.16", "radixtop's bundled engine"): named in the actions."""
    pool: Callable[[], Pool]
    root: Any = None
    lock_ref: Callable[[Any], int] = lambda n: n.lock_ref
    holders: Callable[[Any], Collection[str] | None] = lambda n: getattr(n, "session_ids", None)
    node_id: Callable[[Any], int] = lambda n: n.id
    attached: Callable[[Any], bool] = lambda n: True
    buckets: Callable[[], Any] | None = None
    lock_holders: Callable[[], Iterable[Any] | None] | None = None
    """The ``last_node`` of every request (or other holder) that holds a lock now."""
    closed: Callable[[], Collection[str]] | None = None
    idle_sessions: Callable[[float], Generator[None, None, list[tuple[str, float]]]] | None = None
    """Open sessions that hold memory and were last used more than the given seconds ago:
    (id, seconds idle), as a pass."""
    plan: Callable[[str], ClosePlanView] | None = None
    admission: Callable[[], AdmissionQueue | None] | None = None
    skipped: dict[str, str] = field(default_factory=dict)


def diagnose_pass(inputs: DoctorInputs, idle_after_s: float = IDLE_AFTER_S) -> Generator[None, None, Diagnosis]:
    """Every check the inputs allow, on the owner thread, yielding between slices of the walk."""
    started = time.perf_counter()
    skipped = dict(inputs.skipped)
    findings: dict[str, list[Finding]] = {kind: [] for kind in TREE_FINDING_KINDS}
    bpt = inputs.bytes_per_token

    buckets = inputs.buckets() if inputs.buckets is not None else None
    if buckets is None:
        skipped.setdefault("buckets", "this target keeps no per-component accounting of its pool")
    else:
        findings["buckets"] = bucket_findings(buckets, bpt, inputs.bug_owner)

    holders = inputs.lock_holders() if inputs.lock_holders is not None else None
    if inputs.root is None:
        skipped.setdefault("leaked_lock", "this target's tree has no nodes Python can read")
        skipped.setdefault("tombstone_tags", "this target's tree has no nodes Python can read")
    elif holders is None:
        skipped.setdefault("leaked_lock", "radixtop cannot see this target's running requests")
    if inputs.closed is None:
        skipped.setdefault("tombstone_tags", "this target keeps no closed-session tombstones")
    walked = None
    leaked_tokens = 0
    if inputs.root is not None and ("leaked_lock" not in skipped or "tombstone_tags" not in skipped):
        expected = expected_locks(holders or (), inputs.root)
        closed = inputs.closed() if "tombstone_tags" not in skipped and inputs.closed is not None else ()
        walk = yield from walk_pass(inputs, expected, closed, "leaked_lock" not in skipped)
        walked = walk.walked
        yield  # the owner's turn; the checks below re-read what they report, in one chunk
        if "leaked_lock" not in skipped:
            now_holders = inputs.lock_holders() if inputs.lock_holders is not None else None
            findings["leaked_lock"], leaked_tokens = leaked_lock_findings(
                walk.lock_candidates, inputs, expected_locks(now_holders or (), inputs.root))
        if "tombstone_tags" not in skipped:
            findings["tombstone_tags"] = tombstone_findings(walk.tombstone_tags, inputs, set(inputs.closed()))

    idle_free = 0
    if inputs.idle_sessions is None or inputs.plan is None:
        skipped.setdefault("idle_session", "this target has no sessions, or cannot tell when one was last used")
    else:
        idle = yield from inputs.idle_sessions(idle_after_s)
        findings["idle_session"], idle_free = yield from idle_findings(idle, inputs)

    admission = inputs.admission() if inputs.admission is not None else None
    if inputs.admission is None:
        skipped.setdefault("starved_admission", "radixtop cannot see this target's waiting requests")
    elif admission is not None:
        starved = starvation_finding(admission, inputs.pool(), leaked_tokens, idle_free, bpt, inputs.bug_owner)
        findings["starved_admission"] = [starved] if starved is not None else []

    checked = tuple(k for k in TREE_FINDING_KINDS if k not in skipped)
    return Diagnosis(inputs.target, tuple(f for k in TREE_FINDING_KINDS for f in findings[k]), checked,
                     {k: skipped[k] for k in TREE_FINDING_KINDS if k in skipped}, idle_after_s, walked,
                     time.perf_counter() - started)


# ----- buckets -----


def bucket_findings(buckets: Iterable[Any], bpt: int, bug_owner: str) -> list[Finding]:
    out = []
    for b in buckets:
        missing = b.unaccounted
        if not missing:  # 0: SGLang's check passes; None: the target cannot tell
            continue
        figures = {"component": b.component, "total": b.total, "available": b.available, "evictable": b.evictable,
                   "protected": b.protected, "session_held": b.session_held, "uncached": b.uncached,
                   "unaccounted": missing}
        said = (f"{missing} tokens unaccounted" if missing > 0 else f"{-missing} tokens counted twice")
        out.append(Finding(
            "buckets",
            f"[{b.component}] the pool's buckets do not add up: {said} (total={b.total}, available={b.available}, "
            f"evictable={b.evictable}, protected={b.protected}, session_held={b.session_held}, uncached={b.uncached})",
            "available + evictable + protected + session_held + uncached should equal the pool's total, as "
            "the cache's own leak check requires; "
            + ("slots that no bucket explains were allocated and never freed or cached: they are lost until "
               "the server restarts" if missing > 0 else "some slots are counted in two buckets"),
            f"This is {bug_owner}'s bug: report it with these figures (the same line its log writes as "
            f"'pool memory leak detected!'). Neither evict nor close reaches these slots.",
            abs(missing), abs(missing) * bpt, figures=figures))
    return out


# ----- the walk: locks and tombstones -----


def expected_locks(last_nodes: Iterable[Any], root: Any) -> dict[Any, int]:
    """How many locks the holders hold on each node: each holds its ``last_node``'s path to the
    root (``inc_lock_ref``)."""
    counts: dict[Any, int] = {}
    for node in last_nodes:
        while node is not None and node is not root:
            counts[node] = counts.get(node, 0) + 1
            node = node.parent
    return counts


@dataclass
class Walk:
    walked: int = 0
    lock_candidates: list[Any] = field(default_factory=list)
    tombstone_tags: dict[str, list[Any]] = field(default_factory=dict)


def walk_pass(inputs: DoctorInputs, expected: Mapping[Any, int], closed: Collection[str],
               locks: bool, chunk: int = WALK_CHUNK) -> Generator[None, None, Walk]:
    """Every node below the root, ``chunk`` at a time: those locked more than ``expected`` says
    (candidates: checked again at the end) and those a closed session still tags."""
    walk = Walk()
    lock_ref, holders = inputs.lock_ref, inputs.holders
    stack = list(inputs.root.children.values())
    while stack:
        for _ in range(min(chunk, len(stack))):
            node = stack.pop()
            walk.walked += 1
            if locks and lock_ref(node) > expected.get(node, 0):
                walk.lock_candidates.append(node)
            if closed:
                held = holders(node)
                if held:
                    for sid in held:
                        if sid in closed:
                            walk.tombstone_tags.setdefault(sid, []).append(node)
            if node.children:
                stack.extend(node.children.values())
        if stack:
            yield
    return walk


def leaked_lock_findings(candidates: list[Any], inputs: DoctorInputs,
                         expected: Mapping[Any, int]) -> tuple[list[Finding], int]:
    """One finding per node where a leaked lock was taken (its path holds more locks than the
    running requests' below it), and the tokens that only leaked locks pin."""
    lock_ref, bpt = inputs.lock_ref, inputs.bytes_per_token
    excess = {}
    for node in candidates:
        if inputs.attached(node):
            extra = lock_ref(node) - expected.get(node, 0)
            if extra > 0:
                excess[node] = extra
    below: dict[Any, int] = {}
    for node, extra in excess.items():
        if node.parent in excess:
            below[node.parent] = below.get(node.parent, 0) + extra
    only_leaked = {n for n in excess if expected.get(n, 0) == 0}
    pinned_total = sum(len(n.key) for n in only_leaked)
    origins = sorted(((n, excess[n] - below.get(n, 0)) for n in excess if excess[n] > below.get(n, 0)),
                     key=lambda pair: inputs.node_id(pair[0]))
    out = []
    for node, leaks in origins:
        path, pinned, depth, up = [], 0, 0, node
        while up is not None and up is not inputs.root:
            path.append(up)
            depth += 1
            if up in only_leaked:
                pinned += len(up.key)
            up = up.parent
        node_id = inputs.node_id(node)
        held = expected.get(node, 0)
        figures = {"node_id": node_id, "lock_ref": lock_ref(node), "held_by_requests": held, "leaked_locks": leaks,
                   "path_nodes": depth, "path_tokens": sum(len(n.key) for n in path), "pinned_tokens": pinned,
                   "pinned_tokens_all_leaks": pinned_total}
        out.append(Finding(
            "leaked_lock",
            f"node #{node_id}: lock_ref {lock_ref(node)}, but the running requests hold {held} lock(s) on it: "
            f"{leaks} leaked; " + (f"{pinned} tokens on its path cannot be evicted" if pinned else
                                   "running requests lock its path too: it pins nothing more until they finish"),
            "A request locked this node's path (inc_lock_ref) and never released it (dec_lock_ref). Eviction "
            "skips locked nodes, so the path stays in the pool, protected, until the server restarts; "
            "the evictable and available figures stay low even with nothing running.",
            f"This is {inputs.bug_owner}'s bug: report it with these figures. Neither evict nor close "
            "frees a locked node; a restart does.",
            pinned, pinned * bpt, tuple(inputs.node_id(n) for n in path), figures=figures))
    return _capped(out, "leaked_lock", "more nodes with leaked locks"), pinned_total


def tombstone_findings(tags: dict[str, list[Any]], inputs: DoctorInputs, closed: Collection[str]) -> list[Finding]:
    """Closed sessions that still tag nodes (checked again now), with what closing again frees."""
    bpt, out = inputs.bytes_per_token, []
    for sid in sorted(tags):
        if sid not in closed:  # reopened since the walk
            continue
        nodes = [n for n in tags[sid] if inputs.attached(n) and sid in (inputs.holders(n) or ())]
        if not nodes:
            continue
        tokens = sum(len(n.key) for n in nodes)
        freed = _plan_freed(inputs, sid)
        again = (f"{close_command(sid)} (again) frees {freed} tokens now, then report it" if freed
                 else "a close again frees nothing now (its index no longer lists these nodes, or they are "
                      "shared or locked): evict frees them as ordinary LRU entries once nothing locks them; report it")
        out.append(Finding(
            "tombstone_tags",
            f"closed session {sid!r} still tags {len(nodes)} node(s), {tokens} tokens",
            "The session was closed (its id is among the cache's tombstones), yet these nodes still name it as "
            "a holder: a request tagged them after the close, or the close missed them. They count as held: "
            "another session's close keeps a node it shares with them, and the closed session shows memory.",
            f"{again}: it is {inputs.bug_owner}'s bug (figures below).",
            tokens, tokens * bpt, tuple(sorted(inputs.node_id(n) for n in nodes)), sid,
            {"session_id": sid, "tagged_nodes": len(nodes), "tagged_tokens": tokens, "close_frees_tokens": freed}))
    return _capped(out, "tombstone_tags", "more closed sessions that still tag nodes")


def close_command(session_id: str) -> str:
    """The command that closes ``session_id``, safe to paste into a shell: the id quoted and after
    ``--`` (on SGLang, ids come from the API's users: ``$(...)``, backquotes or ``s3 --yes``
    would run a command or skip the confirmation)."""
    return f"radixtop close -- {shlex.quote(session_id)}"


def _plan_freed(inputs: DoctorInputs, session_id: str) -> int:
    if inputs.plan is None:
        return 0
    try:
        return inputs.plan(session_id).freed_tokens
    except AdapterError:
        return 0


# ----- sessions -----


def idle_findings(idle: list[tuple[str, float]], inputs: DoctorInputs,
                  chunk: int = 64) -> Generator[None, None, tuple[list[Finding], int]]:
    """Idle sessions that hold memory, largest close first, each with its exact plan."""
    bpt, rows = inputs.bytes_per_token, []
    for k, (sid, idle_s) in enumerate(idle):
        try:
            plan = inputs.plan(sid)  # type: ignore[misc]
        except AdapterError:
            continue
        if plan.freed_tokens or (plan.policy == "deref" and plan.released_holds):
            rows.append((sid, idle_s, plan))
        if k % chunk == chunk - 1:
            yield
    rows.sort(key=lambda r: (-r[2].freed_tokens, r[0]))
    out = []
    for sid, idle_s, plan in rows:
        kept = sum(k.tokens for k in plan.kept)
        if plan.policy == "deref":
            action = (f"{close_command(sid)}: drops its {plan.released_holds} hold(s) now; eviction frees the "
                      "memory later (this cache's close only dereferences)")
        else:
            nodes = len(plan.freed_node_ids)
            action = f"{close_command(sid)}: frees {plan.freed_tokens} tokens ({nodes} node{'s' * (nodes != 1)}) now"
            if kept:
                action += f"; {kept} tokens it shares or that are locked stay"
        out.append(Finding(
            "idle_session",
            f"session {sid!r} unused for {age(idle_s)} still holds memory: a close frees {plan.freed_tokens} tokens now",
            "Nothing has used the session for longer than the idle threshold, yet its KV stays cached until the "
            "session is closed (or, where it is evictable, LRU pressure evicts it first).",
            action, plan.freed_tokens, plan.freed_bytes or plan.freed_tokens * bpt, plan.freed_node_ids, sid,
            {"session_id": sid, "idle_s": round(idle_s, 1), "close_frees_tokens": plan.freed_tokens,
             "kept_tokens": kept, "released_holds": plan.released_holds, "policy": plan.policy}))
    return _capped(out, "idle_session", "more idle sessions"), sum(r[2].freed_tokens for r in rows)


# ----- admission -----


def starvation_finding(admission: AdmissionQueue, pool: Pool, leaked_tokens: int, idle_free: int, bpt: int,
                       bug_owner: str) -> Finding | None:
    """Requests wait while available + evictable is less than the first one needs."""
    can_have = pool.available + pool.evictable
    if admission.waiting <= 0 or can_have >= admission.head_need:
        return None
    share = pool.unevictable / pool.capacity if pool.capacity else 0.0
    figures = {"waiting": admission.waiting, "head_request": admission.head_id, "head_need_tokens": admission.head_need,
               "available": pool.available, "evictable": pool.evictable, "unevictable": pool.unevictable,
               "capacity": pool.capacity, "unevictable_share": round(share, 4), "leaked_lock_tokens": leaked_tokens}
    if admission.head_need > pool.capacity:
        action = (f"The first request needs more than the whole pool ({pool.capacity} tokens): it can never run; "
                  "abort it or give the server more KV memory.")
    elif leaked_tokens:
        action = (f"{leaked_tokens} of the unevictable tokens are pinned by leaked locks (see leaked_lock): "
                  f"{bug_owner}'s bug, which only a restart frees; report it with these figures.")
    else:
        action = ("No lock is leaked: running requests hold the unevictable memory, and the queue moves as they "
                  "finish. If it persists, run fewer requests at once (SGLang: --max-running-requests) or "
                  "shorter contexts.")
    if idle_free and admission.head_need <= pool.capacity:
        action += f" Closing the idle sessions listed frees {idle_free} tokens now."
    return Finding(
        "starved_admission",
        f"{admission.waiting} request(s) wait: the first ({admission.head_id}) needs {admission.head_need} tokens, "
        f"but only {can_have} can be had (available {pool.available} + evictable {pool.evictable}); "
        f"{pool.unevictable} tokens ({share:.0%} of capacity) are unevictable (locked, held or running)",
        "Admission needs available or evictable slots; unevictable memory (locked nodes, session-held and "
        "running requests' own slots) cannot be evicted, so the queue "
        "stalls while the server still answers its health check.",
        action, admission.head_need - can_have, (admission.head_need - can_have) * bpt, figures=figures)


def _capped(findings: list[Finding], kind: str, more: str) -> list[Finding]:
    if len(findings) <= MAX_PER_KIND:
        return findings
    rest = findings[MAX_PER_KIND - 1:]
    tokens = sum(f.tokens for f in rest)
    summary = Finding(kind, f"and {len(rest)} {more}, {tokens} tokens", rest[0].meaning,
                      "the same actions as above, one each (radixtop doctor --json lists them all)",
                      tokens, sum(f.bytes for f in rest), figures={"count": len(rest), "tokens": tokens})
    return [*findings[: MAX_PER_KIND - 1], summary]
