"""The soak's parts: a shared ledger, client workers over the admin API, and owner-thread checks."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from radixtop.adapters.errors import AdapterError, UnknownNode, UnknownSession
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.wire import (
    close_plan_from_dict,
    close_result_from_dict,
    evict_result_from_dict,
    flush_result_from_dict,
)
from radixtop.adapters.model import CHILD_ORDERS, ROOT_ID, SESSION_ORDERS, ClosePlanView
from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.sessions import CLOSED_SESSION_TOMBSTONE_LIMIT
from tests.support.engines import check_invariants

SESSION_KEYS: dict[str, Callable[[Any], Any]] = {
    "exclusive_bytes": lambda v: (-v.exclusive_bytes, v.id),
    "shared_bytes": lambda v: (-v.shared_bytes, v.id),
    "id": lambda v: v.id,
}
FLUSH_EVERY_S = 5.0
"""At most one flush in this many seconds, whichever actor sends it."""


class Ledger:
    """What every client did and saw, shared by the workers (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.failures: list[str] = []
        self.journal: list[dict[str, Any]] = []
        """Every action sent, as the audit log should hold it."""

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def fail(self, message: str) -> None:
        with self._lock:
            self.failures.append(message)

    def count_error(self, key: str) -> None:
        with self._lock:
            self.errors[key] += 1

    def error(self, op: str, exc: AdapterError, allowed: tuple[type[AdapterError], ...]) -> None:
        """A typed error from a read: one of ``allowed`` (a 404 the race explains), or a failure."""
        self.count_error(f"{exc.http_status} {exc.code}")
        if type(exc) not in allowed or exc.http_status >= 500:
            self.fail(f"{op}: {exc.http_status} {exc.code}: {exc}")

    def log_action(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.journal.append(entry)


class ActionGate:
    """Tells whether an action ran with nothing else changing the tree: no other mutating
    action in flight from start to answer, and no engine step completed meanwhile.

    The engine increments ``steps`` right after each step and runs commands only between steps,
    so an unchanged count across the whole request means no step ran between its commands.
    ``exclusive()`` holds the other actors' mutating actions back while one thread acts alone."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._cond = threading.Condition()
        self._in_flight = 0
        self._started = 0
        self._holder: threading.Thread | None = None

    def begin(self) -> tuple[int, bool, int]:
        me = threading.current_thread()
        with self._cond:
            while self._holder is not None and self._holder is not me:
                self._cond.wait()
            self._in_flight += 1
            self._started += 1
            return self._started, self._in_flight == 1, self.engine.steps

    def end(self, ticket: tuple[int, bool, int]) -> bool:
        seq, alone, steps = ticket
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()
            return alone and self._started == seq and self.engine.steps == steps

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No other thread's mutating action in flight or starting until the block ends."""
        with self._cond:
            while self._holder is not None:
                self._cond.wait()
            self._holder = threading.current_thread()
            while self._in_flight:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._holder = None
                self._cond.notify_all()


def check_stats(d: dict[str, Any], capacity: int) -> list[str]:
    """Problems with one stats answer (the wire dict): the pool must reconcile exactly."""
    bpt = d["bytes_per_token"]
    problems = []
    if d["capacity_tokens"] != capacity:
        problems.append(f"capacity {d['capacity_tokens']} != {capacity}")
    states = ("available", "evictable", "protected", "session_held", "uncached")  # SGLang's leak-check words
    if sum(d[f"{name}_tokens"] for name in states) != d["capacity_tokens"]:
        problems.append("available + evictable + protected + session_held + uncached != capacity (tokens)")
    if sum(d[f"{name}_bytes"] for name in states) != d["capacity_bytes"]:
        problems.append("available + evictable + protected + session_held + uncached != capacity (bytes)")
    for name in ("capacity", *states, "unevictable", "total"):
        if d[f"{name}_bytes"] != d[f"{name}_tokens"] * bpt:
            problems.append(f"{name}_bytes != {name}_tokens x bytes_per_token")
        if d[f"{name}_tokens"] < 0:
            problems.append(f"{name}_tokens < 0")
    if d["unevictable_tokens"] != d["protected_tokens"] + d["session_held_tokens"] + d["uncached_tokens"]:
        problems.append("unevictable != protected + session_held + uncached")
    if d["total_tokens"] != d["evictable_tokens"] + d["protected_tokens"]:
        problems.append("total != evictable + protected")
    return [f"stats v{d['version']}: {p}: {json.dumps(d)}" for p in problems]


def pool_census(s: Scheduler) -> int:
    """On the owner thread: the cache's invariants, every slot of the pool exactly once (free,
    in the tree, or a running request's own), and each cached slot still holding the K/V of its
    token (a slot reused while the tree holds it would not). Returns the tree's node count."""
    check_invariants(s)
    allocator, cache = s.pool.allocator, s.cache
    assert allocator.page_size == 1, "the census counts slots as pages"
    nodes = list(cache.iter_nodes())
    free = allocator.free_slots()
    tree = [n.value for n in nodes]
    own = [r.slots[r.cache_protected_len:] for r in s.running.values()]
    every = np.sort(np.concatenate([free, *tree, *own]).astype(np.int64))
    assert np.array_equal(every, np.arange(1, allocator.size + 1)), (
        f"slots are not each held exactly once: {every.size} held of {allocator.size}, "
        f"{every.size - np.unique(every).size} twice")
    kv = s.pool.kv
    for n in nodes:
        k = kv.k_buffer[0][np.asarray(n.value, dtype=np.int64)][:, 0, 0]
        assert np.array_equal(k.numpy(), np.asarray(n.key, dtype=np.float32)), f"node {n.id}'s K/V overwritten"
    for r in s.running.values():
        k = kv.k_buffer[0][np.asarray(r.slots[: len(r.input_ids)], dtype=np.int64)][:, 0, 0]
        assert np.array_equal(k.numpy(), np.asarray(r.input_ids, dtype=np.float32)), f"{r.rid}'s K/V overwritten"
    return len(nodes)


class Worker(threading.Thread):
    """A client thread with its own connection and random stream; any exception is a failure."""

    def __init__(self, name: str, url: str, token: str, ledger: Ledger, stop: threading.Event,
                 seed: int, capacity: int):
        super().__init__(name=name, daemon=True)
        self.url, self.token, self.ledger, self.stop, self.capacity = url, token, ledger, stop, capacity
        self.rng = random.Random(seed)
        self.adapter = RadixtopClient(url, token, timeout=60.0)
        # Raw HTTP beside the adapter, for answers the adapter would digest (stats as sent; a
        # close's plan next to its result).
        self.http = httpx.Client(base_url=url, timeout=60.0, headers={"Authorization": f"Bearer {token}"})

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
        except Exception as exc:  # a worker that dies must say why, not shrink the soak
            self.ledger.fail(f"{self.name} died: {type(exc).__name__}: {exc}")
        finally:
            self.adapter.release()
            self.http.close()

    def step(self) -> None:
        raise NotImplementedError

    def read(self, op: str, fn: Callable[[], Any], *allowed: type[AdapterError]) -> Any:
        try:
            answer = fn()
        except AdapterError as exc:
            self.ledger.error(op, exc, allowed)
            return None
        self.ledger.count("reads")
        self.ledger.count(f"read:{op}")
        return answer

    def check_stats(self) -> None:
        st = self.read("stats", self.adapter.stats)
        if st is not None:
            self.ledger.count("stats_checked")
            for problem in check_stats(st.to_dict(), self.capacity):
                self.ledger.fail(problem)


class TreeReader(Worker):
    """Walks the tree: a page of children at each level down to a random depth, then the node
    (a page of its token ids) and its chain. Ids read a moment ago may be gone: 404 is allowed."""

    def step(self) -> None:
        rng, a = self.rng, self.adapter
        node_id = ROOT_ID
        for _ in range(rng.randint(1, 8)):
            order, limit = rng.choice(CHILD_ORDERS), rng.randint(1, 40)
            page = self.read("children", lambda: a.children(node_id, 0, limit, order), UnknownNode)
            if page is None or not page.children:
                break
            if page.total > limit:  # a later page too
                offset = rng.randrange(page.total)
                page = self.read("children", lambda: a.children(node_id, offset, limit, order), UnknownNode)
                if page is None or not page.children:
                    break
            self.check_page(page, node_id)
            node_id = rng.choice(page.children).id
        detail = self.read("node", lambda: a.node(node_id, rng.randrange(8), rng.randint(1, 64)), UnknownNode)
        if detail is not None and detail.node.id != node_id:
            self.ledger.fail(f"node {node_id} answered for node {detail.node.id}")
        chain = self.read("chain", lambda: a.chain(node_id, rng.randint(1, 50)), UnknownNode)
        if chain is not None:
            parents = [node_id] + [n.id for n in chain.nodes]
            if [n.parent_id for n in chain.nodes] != parents[: len(chain.nodes)]:
                self.ledger.fail(f"chain of {node_id}: parent links broken: {chain}")
        if rng.random() < 0.2:
            self.check_stats()

    def check_page(self, page, parent_id: int) -> None:
        """One answer is one consistent view: its rows agree with each other and the parent."""
        kids = page.children
        depths = {c.depth for c in kids}
        if len(kids) > page.limit or page.offset + len(kids) > page.total or len(depths) > 1:
            self.ledger.fail(f"children of {parent_id}: bad page {page}")
        for c in kids:
            if c.parent_id != parent_id or c.subtree_tokens < c.tokens or c.tokens < 1:
                self.ledger.fail(f"children of {parent_id}: bad row {c}")


class SessionReader(Worker):
    """Pages sessions in every order, reads sessions by id (real ones, and ids that never
    existed: 404), follows ``changes(since)`` and checks stats."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.since = 0
        self.unknown = 0

    def step(self) -> None:
        rng, a = self.rng, self.adapter
        order = rng.choice(SESSION_ORDERS)
        page = self.read("sessions", lambda: a.sessions(order, rng.randrange(40), rng.randint(1, 100)))
        if page is not None:
            key = SESSION_KEYS.get(order)
            if len(page.sessions) > page.limit or (key and list(page.sessions) != sorted(page.sessions, key=key)):
                self.ledger.fail(f"sessions page in {order} order is not ordered: {page}")
            for view in rng.sample(page.sessions, min(3, len(page.sessions))):
                detail = self.read("session", lambda: a.session(view.id), UnknownSession)
                if detail is not None and detail.session.id != view.id:
                    self.ledger.fail(f"session {view.id} answered for {detail.session.id}")
        self.unknown += 1
        sid = f"soak-never-{self.name}-{self.unknown}"
        if self.read("session", lambda: a.session(sid), UnknownSession) is not None:
            self.ledger.fail(f"session {sid} never existed, yet it was answered")
        since = self.since if rng.random() < 0.8 else rng.randrange(self.since + 1)
        delta = self.read("changes", lambda: a.changes(since))
        if delta is not None:
            parts = [set(delta.added), set(delta.changed), set(delta.removed)]
            if delta.version < since or sum(map(len, parts)) != len(set().union(*parts)):
                self.ledger.fail(f"changes since {since}: {delta}")
            self.since = delta.version
        self.check_stats()


class StatsSampler(Worker):
    """Raw stats answers (the bytes as the server wrote them) as often as it can, and now and
    then the whole-pool census on the engine's owner thread."""

    def __init__(self, *args: Any, engine: Engine, census_every_s: float = 0.25, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.engine, self.census_every_s = engine, census_every_s
        self.next_census = 0.0

    def step(self) -> None:
        try:
            response = self.http.get("/v1/stats")
        except httpx.HTTPError as exc:
            self.ledger.fail(f"stats: {type(exc).__name__}: {exc}")
            return
        self.ledger.count("reads")
        if response.status_code != 200:
            self.ledger.fail(f"stats: HTTP {response.status_code}: {response.text[:200]}")
            return
        self.ledger.count("stats_checked")
        for problem in check_stats(response.json(), self.capacity):
            self.ledger.fail(problem)
        if time.monotonic() >= self.next_census:
            self.next_census = time.monotonic() + self.census_every_s
            try:
                self.engine.call(pool_census, timeout=60.0)
            except AssertionError as exc:
                self.ledger.fail(f"owner-thread census: {exc}")
                self.stop.set()  # the first broken invariant is the one worth reading
            self.ledger.count("owner_checks")
        time.sleep(0.002)


class Actor(Worker):
    """Closes sessions (real ids from the sessions pages, ids it closed already, ids that never
    existed), dry-runs closes, evicts and, now and then, flushes; every answer is checked."""

    def __init__(self, *args: Any, gate: ActionGate, last_flush: list[float], engine: Engine,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.gate, self.last_flush, self.engine = gate, last_flush, engine
        self.real: list[str] = []
        self.closed: deque[str] = deque(maxlen=64)
        self.unknown = 0

    def step(self) -> None:
        rng = self.rng
        if not self.real or rng.random() < 0.3:
            order = "exclusive_bytes" if rng.random() < 0.8 else "last_activity"
            page = self.read("sessions", lambda: self.adapter.sessions(order, 0, 30))
            if page is not None:  # those whose close frees something first
                self.real = [v.id for v in page.sessions if v.state == "open"]
                self.closed.extend(v.id for v in page.sessions if v.state == "closed")
        roll = rng.random()
        if roll < 0.02 and time.monotonic() - self.last_flush[0] > FLUSH_EVERY_S:
            self.last_flush[0] = time.monotonic()
            self.flush()
        elif roll < 0.12:
            self.evict(rng.randint(1, self.capacity // 8))
        elif roll < 0.32 and self.real:
            self.close(rng.choice(self.real), "real", dry_run=True)
        elif roll < 0.40 and self.closed:
            self.close(rng.choice(self.closed), "closed", dry_run=rng.random() < 0.3)
        elif roll < 0.46 or not self.real:
            self.unknown += 1
            self.close(f"soak-unknown-{self.name}-{self.unknown}", "unknown", dry_run=rng.random() < 0.3)
        else:
            sid = self.real.pop(0 if rng.random() < 0.7 else rng.randrange(len(self.real)))
            self.close(sid, "real", dry_run=False)
        time.sleep(rng.uniform(0.0, 0.01))

    def probe(self) -> None:
        """Alone (the other actors held back, the workload just paused), so nothing changes:
        each session's exclusive bytes on a fresh sessions page equal its dry run; then close
        the one that frees the most, and its result must equal its plan."""
        with self.gate.exclusive():
            self.engine.call(lambda s: None, timeout=60.0)  # a step under way has ended: no more
            self.evict(0)  # an action: the next sessions page is attributed afresh
            page = self.read("sessions", lambda: self.adapter.sessions("exclusive_bytes", 0, 10))
            freeing = None
            for view in page.sessions if page is not None else ():
                plan = self.close(view.id, "real", dry_run=True) if view.state == "open" else None
                if plan is None:
                    continue
                self.ledger.count("exclusive_checked")
                if plan.freed_bytes != view.exclusive_bytes:
                    self.ledger.fail(f"session {view.id}: exclusive_bytes {view.exclusive_bytes} != "
                                     f"its dry run {plan}")
                if freeing is None and plan.freed_node_ids:
                    freeing = view.id
            if freeing is not None:
                self.ledger.count("probes")
                self.close(freeing, "real", dry_run=False)

    def post(self, path: str, **kwargs: Any) -> httpx.Response | None:
        try:
            return self.http.post(path, **kwargs)
        except httpx.HTTPError as exc:
            self.ledger.fail(f"POST {path}: {type(exc).__name__}: {exc}")
            return None

    def refused(self, response: httpx.Response, entry: dict[str, Any], expected: str | None) -> None:
        """An error answer: it must be ``expected`` (a typed 404), never a 5xx or anything else."""
        try:
            body = response.json()
            code = body["error"]["code"]
        except (ValueError, TypeError, KeyError):
            body, code = response.text[:300], None
        self.ledger.count_error(f"{response.status_code} {code}")
        self.ledger.log_action({**entry, "allowed": False, "error": code})
        if expected is None or (response.status_code, code) != (404, expected):
            self.ledger.fail(f"{entry['action']} {entry['target']}: HTTP {response.status_code}: {body}")

    def close(self, sid: str, kind: str, dry_run: bool) -> ClosePlanView | None:
        """Close ``sid`` (or dry-run it: then the plan is returned) and check the answer."""
        path = f"/v1/sessions/{quote(sid, safe='')}/close"
        entry = {"action": "close_dry_run" if dry_run else "close", "target": f"session:{sid}"}
        ticket = None if dry_run else self.gate.begin()
        closes_before = self.engine.scheduler.closes
        try:
            response = self.post(path, params={"dry_run": "true"} if dry_run else None)
        finally:
            quiet = self.gate.end(ticket) if ticket is not None else False
        if response is None:
            return
        tombstones_kept = closes_before + 1 < CLOSED_SESSION_TOMBSTONE_LIMIT  # none forgotten yet
        if response.status_code != 200:
            # Unknown ids are always 404; a real id too once the engine has forgotten it (one
            # that holds nothing, runs nothing and is not tombstoned); a closed one never is.
            self.refused(response, entry, None if kind == "closed" and tombstones_kept else "unknown_session")
            self.ledger.count(f"{entry['action']}_refused_{kind}")
            return
        if kind == "unknown":
            self.ledger.fail(f"close of {sid}, which never existed, answered {response.text[:300]}")
            return
        body = response.json()
        if dry_run:
            self.ledger.log_action({**entry, "allowed": True, "plan": body, "result": None})
            self.ledger.count("dry_runs")
            plan = close_plan_from_dict(body)
            self.check_plan(plan, sid)
            if kind == "closed" and tombstones_kept and (plan.state != "closed" or plan.freed_node_ids):
                self.ledger.fail(f"dry run of closed {sid}: {plan}")
            return plan
        self.ledger.log_action({**entry, "allowed": True, "plan": body["plan"], "result": body["result"]})
        plan, result = close_plan_from_dict(body["plan"]), close_result_from_dict(body["result"])
        self.check_plan(plan, sid)
        self.check_result(plan, result, sid, kind, quiet, tombstones_kept)
        return None

    def check_plan(self, plan, sid: str) -> None:
        bpt = self.bytes_per_token()
        ids = plan.freed_node_ids
        kept = {k.node_id for k in plan.kept}
        if (plan.session_id != sid or plan.state not in ("open", "closed") or plan.freed_bytes != plan.freed_tokens * bpt
                or len(set(ids)) != len(ids) or kept & set(ids) or (plan.freed_tokens == 0) != (not ids)):
            self.ledger.fail(f"plan of {sid}: {plan}")

    def check_result(self, plan, result, sid: str, kind: str, quiet: bool, tombstones_kept: bool) -> None:
        """What holds for every close, and plan == result for every one: the close route plans
        and closes in one owner-thread step (``close_session_planned``), so nothing can run in
        between. ``quiet`` counts the closes during which nothing else ran at all."""
        bpt = self.bytes_per_token()
        ids = result.freed_node_ids
        if (result.session_id != sid or result.freed_bytes != result.freed_tokens * bpt
                or len(set(ids)) != len(ids) or (result.freed_tokens == 0) != (not ids)
                or (result.already_closed and (ids or result.released_holds))):
            self.ledger.fail(f"close of {sid}: inconsistent result {result}")
        if tombstones_kept and plan.state == "closed" and not result.already_closed:
            self.ledger.fail(f"close of {sid}: planned as closed, then not already closed: {result}")
        same = (plan.freed_node_ids, plan.freed_tokens, plan.freed_bytes, plan.released_holds,
                plan.state == "closed") == (ids, result.freed_tokens, result.freed_bytes,
                                             result.released_holds, result.already_closed)
        if quiet:
            self.ledger.count("quiet_closes")
            if ids:
                self.ledger.count("quiet_closes_freeing")
        if not same:
            self.ledger.count("closes_plan_differs")
            self.ledger.fail(f"close of {sid}: plan {plan} != result {result} (planned in the same step)")
        self.ledger.count("tokens_freed_by_close", result.freed_tokens)
        if result.already_closed:
            self.ledger.count("closes_already_closed")
        elif ids:
            self.ledger.count("closes_freeing")
        else:
            self.ledger.count("closes_freeing_nothing")
        self.closed.append(sid)
        if ids:  # node ids are never reused: a freed one is gone for good
            gone = self.rng.choice(ids)
            try:
                self.adapter.node(gone)
                self.ledger.fail(f"close of {sid} freed node {gone}, yet the node still answers")
            except UnknownNode:
                self.ledger.count("freed_nodes_gone")
            except AdapterError as exc:
                self.ledger.error("node", exc, (UnknownNode,))

    def evict(self, num_tokens: int) -> None:
        entry = {"action": "evict", "target": "cache", "extra": {"requested_tokens": num_tokens}}
        ticket = self.gate.begin()
        try:
            response = self.post("/v1/evict", json={"tokens": num_tokens})
        finally:
            self.gate.end(ticket)
        if response is None:
            return
        if response.status_code != 200:
            self.refused(response, entry, None)
            return
        self.ledger.log_action({**entry, "allowed": True, "result": response.json()})
        r = evict_result_from_dict(response.json())
        if (r.requested_tokens != num_tokens or r.evicted_bytes != r.evicted_tokens * self.bytes_per_token()
                or (r.evicted_tokens == 0) != (r.evicted_nodes == 0)):
            self.ledger.fail(f"evict {num_tokens}: {r}")
        self.ledger.count("evicts")
        self.ledger.count("tokens_freed_by_evict", r.evicted_tokens)

    def flush(self) -> None:
        entry = {"action": "flush", "target": "cache"}
        ticket = self.gate.begin()
        try:
            response = self.post("/v1/flush")
        finally:
            self.gate.end(ticket)
        if response is None:
            return
        if response.status_code != 200:
            self.refused(response, entry, None)
            return
        self.ledger.log_action({**entry, "allowed": True, "result": response.json()})
        r = flush_result_from_dict(response.json())
        if not r.flushed or r.freed_bytes != r.freed_tokens * self.bytes_per_token():
            self.ledger.fail(f"flush: {r}")
        self.ledger.count("flushes")
        self.ledger.count("tokens_freed_by_flush", r.freed_tokens)

    def bytes_per_token(self) -> int:
        return self.engine.scheduler.geometry.bytes_per_token


def audit_mismatches(entries: list[Any], journal: list[dict[str, Any]]) -> list[str]:
    """The audit journal against what the clients sent: one entry per action, each saying what
    the client was told (refused ones by their error code)."""

    def key(action: str, target: str, allowed: bool, plan: Any, result: Any, error: str | None,
            extra: dict[str, Any]) -> str:
        if not allowed:
            plan = result = None  # a refusal's answer is its error; what was planned is not sent
        return json.dumps([action, target, allowed, plan, result, error, extra], sort_keys=True)

    audited = Counter(key(e.action, e.target, e.allowed, e.plan, e.result,
                          e.error.split(":", 1)[0] if e.error else None, e.extra) for e in entries)
    sent = Counter(key(j["action"], j["target"], j["allowed"], j.get("plan"), j.get("result"),
                       j.get("error"), j.get("extra", {})) for j in journal)
    problems = []
    if len(entries) != len(journal):
        problems.append(f"{len(entries)} audit entries for {len(journal)} actions")
    for k in (audited - sent) + (sent - audited):
        problems.append(f"audited {audited[k]}x, sent {sent[k]}x: {k[:300]}")
    return problems
