"""The bundled cache's flight recorder (issue 29, ``gpu_backend.history``) and ``why`` over it.

The answers are checked against an independent computation over the same ops: after every op,
the tree's own read-only lookup says how many tokens of each query were cached then; a token of a
query past what is cached now was lost at the op after the last one that left it cached, for
that op's cause (a request's room, a session's close, a flush, an evict asked). ``why`` must name
exactly those tokens, each with that moment and cause."""

from __future__ import annotations

import json
import random

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.gpu_backend.history import CLOSED, EVICT_ACTION, EVICTED, FLUSHED, GHOST_BYTES, CacheHistory
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.owner.slices import run_to_end
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.traces.ops import Replayer, read_trace
from tests.support.trace_gen import capacity_for, generate_trace


def cause_of(op, flushed: bool) -> tuple[str, str | None]:
    if flushed:
        return FLUSHED, None
    if op.op == "close":
        return CLOSED, op.fields["session"]
    if op.op == "evict":
        return EVICT_ACTION, None
    return EVICTED, None


def replayed(seed: int, size: str, flush_every: int = 0):
    """The trace's ops on a scheduler whose history's clock is the op's index; the tokens each
    query had cached after each op (the oracle), and each op's cause."""
    lines = generate_trace(seed, n_ops=220, max_in_flight=4, vocab=60, abort_weight=2)
    ops = list(read_trace(lines))
    queries = []
    for line in lines:
        d = json.loads(line)
        if "input" in d:
            queries.append(tuple(d["input"]) + tuple(d.get("output") or ()))
            queries.append(tuple(d["input"]))
    queries = sorted(set(queries))
    s = Scheduler(get_geometry("tiny"), capacity_for(lines, size), device="cpu", write_kv=False)
    clock = [0]
    s.cache.history.clock = lambda: clock[0]
    s.cache.history.since = 0
    replayer = Replayer(s)
    rng = random.Random(seed)
    cached: list[list[int]] = [[0] * len(queries)]  # after op k (k = 0: before any)
    causes: list[tuple[str, str | None] | None] = [None]
    for op in ops:
        for flush in ([True] if flush_every and rng.randrange(flush_every) == 0 else []) + [False]:
            clock[0] += 1  # (a flush is a step of its own, before the op)
            if flush:
                s.flush()
            else:
                replayer.apply(op)
            causes.append(cause_of(op, flush))
            cached.append([s.cache.lookup(q).prefix_len for q in queries])
    return s, queries, cached, causes


class Oracle:
    """The independent side, beside SGLang's caches: each op a step of the copy's history clock;
    after it, each query's cached tokens as SGLang's own tree says (``cached_of``) and the op's
    cause."""

    def __init__(self, queries, cached_of, mirror, recorder) -> None:
        from tests.on_sglang.test_mirror16 import wire

        self.queries, self.cached_of, self.wire = queries, cached_of, wire
        self.mirror, self.recorder = mirror, recorder
        self.clock = 0
        mirror.history.clock = lambda: self.clock
        self.cached: list[list[int]] = [[0] * len(queries)]
        self.causes: list = [None]

    def step(self, apply, cause) -> None:
        self.clock += 1
        apply()
        self.mirror.apply(self.wire(self.recorder.take()))
        self.causes.append(cause)
        self.cached.append([self.cached_of(list(q)) for q in self.queries])

    def check(self, beside) -> int:
        """``why`` over the copy for every query, against the oracle; how many runs were lost."""
        lost = 0
        for i, q in enumerate(self.queries):
            w = beside.why(list(q))
            assert w.cached_tokens == self.cached[-1][i]
            assert answered(w) == expected(i, q, self.cached, self.causes), (i, q)
            lost += len(w.lost)
        return lost


def expected(i_query: int, query, cached, causes) -> dict[int, tuple[int, str, str | None]]:
    """Each token past what is cached now that was cached before: the op it left at, its cause."""
    now = cached[-1][i_query]
    out = {}
    for pos in range(now, len(query)):
        last = max((k for k in range(len(cached)) if cached[k][i_query] > pos), default=None)
        if last is not None:
            left = last + 1
            out[pos] = (left, *causes[left])
    return out


def answered(w) -> dict[int, tuple[int, str, str | None]]:
    out = {}
    for lost in w.lost:
        for pos in range(lost.start, lost.end):
            out[pos] = (lost.at, lost.cause, lost.session_id if lost.cause == CLOSED else None)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("size,flush_every", [("small", 0), ("large", 0), ("small", 25)])
def test_why_names_the_op_and_cause_that_removed_each_lost_token(seed, size, flush_every):
    s, queries, cached, causes = replayed(seed, size, flush_every)
    adapter = BundledAdapter.__new__(BundledAdapter)  # (its read on this thread: no engine loop)
    adapter.name, adapter.tokenizer = "bundled", None
    adapter._call = lambda fn, *a, **k: fn(s)
    lost_any = 0
    for i, q in enumerate(queries):
        w = BundledAdapter.why(adapter, list(q))
        assert w.cached_tokens == w.diverges_at == cached[-1][i] == s.cache.lookup(q).prefix_len
        assert answered(w) == expected(i, q, cached, causes), (i, q)
        lost_any += len(w.lost)
        for lost in w.lost:
            if lost.cause == EVICTED:
                assert lost.capacity_tokens == s.pool.allocator.size and lost.protected_tokens is not None
    if size == "small":
        assert lost_any, "the trace lost nothing: the test proves nothing"
    kinds = {c[0] for c in causes[1:] if c}
    assert EVICTED in kinds


def test_the_history_is_bounded_by_tokens_and_by_age_and_says_how_far_back_it_reaches():
    now = [100.0]
    h = CacheHistory(most_bytes=10 * 8 + 2 * GHOST_BYTES, most_age_s=50, clock=lambda: now[0])
    h.removed(1, 0, [1, 2, 3, 4])
    now[0] = 110
    h.removed(2, 0, [5, 6, 7, 8])
    assert h.tokens == 8 and h.reaches_back_to() == 100
    now[0] = 120
    h.removed(3, 0, [9, 9, 9])  # 3 nodes, 11 tokens: over, the oldest goes
    assert [g.node_id for g in h.ghosts()] == [2, 3] and h.tokens == 7 and h.bytes == 7 * 8 + 2 * GHOST_BYTES
    assert h.reaches_back_to() == 100  # (every removal after the one dropped)
    now[0] = 165  # the one of 110 is past 50 s
    h.removed(4, 3, [1])
    assert [g.node_id for g in h.ghosts()] == [3, 4] and h.reaches_back_to() == 110
    assert h.explain([5, 6, 7, 8], [(0, 0)], 0) == []  # gone from the history: not known
    found = h.explain([9, 9, 9, 1], [(0, 0)], 0)  # node 4 hangs below node 3: found through it
    assert [(x.start, x.end, x.ghost.node_id, x.ghost.at) for x in found] == [(0, 3, 3, 120), (3, 4, 4, 165)]
    with pytest.raises(ValueError):
        CacheHistory(most_bytes=-1)


def test_a_ghost_hangs_below_a_node_split_since_and_one_cached_again_under_a_new_id():
    h = CacheHistory(clock=lambda: 1.0)
    with h.cause(CLOSED, session_id="s1"):
        h.removed(7, 3, [5, 6, 7])  # below node 3 (path [1, 2, 3, 4])
    # node 3 split since: its id stays at its path's end; the query walks the live path to it
    (lost,) = h.explain([1, 2, 3, 4, 5, 6, 9], [(0, 0), (9, 2), (3, 4)], 4)
    assert (lost.start, lost.end, lost.ghost.cause, lost.ghost.session_id) == (4, 6, CLOSED, "s1")
    # cached again partly, under a new node: only the rest is lost
    (lost,) = h.explain([1, 2, 3, 4, 5, 6, 7], [(0, 0), (9, 2), (3, 4)], 5)
    assert (lost.start, lost.end) == (5, 7)
    with pytest.raises(ValueError):
        with h.cause("vanished"):
            pass


def test_a_flush_too_big_for_the_history_keeps_the_prefixes_not_the_leaves():
    """SGLang's flush drops its whole tree at once: radixtop's copy tells each node gone, the
    deepest first, so that past the history's bound it is the leaves that go, and a prompt's
    start is still explained (told root first, the bound would drop the root's child first and
    leave every ghost below it unreachable)."""
    from array import array

    from radixtop.adapters.owned.records import ADD, RESET
    from radixtop.adapters.sglang.mirror import MirrorCache

    mirror = MirrorCache()
    mirror.history = CacheHistory(most_bytes=2 * (3 * 8 + GHOST_BYTES), clock=lambda: 5.0)
    mirror.apply([(RESET, 100, False)] + [  # a chain of 4 nodes of 3 tokens below the root 100
        (ADD, i, 100 if i == 1 else i - 1, array("q", [i] * 3).tobytes(), None, 1.0, 1.0, 0, 0) for i in range(1, 5)])
    mirror.apply([(RESET, 200, False)])  # SGLang's flush
    found = mirror.history.explain([1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4], [(200, 0)], 0)
    assert [(x.start, x.end, x.ghost.cause) for x in found] == [(0, 3, FLUSHED), (3, 6, FLUSHED)]


def test_why_on_mooncakes_conversations_names_the_eviction_or_close_behind_each_miss():
    """Mooncake's conversation trace (the excerpt in tests/data/) on a tight pool, with each
    conversation closed after its last turn: every request that hits less of its prompt than was
    cached of it at some moment before is asked ``why`` as it arrives, and each missing token must
    be named with the op that removed it and that op's cause, as the independent side computes it
    (the tree's own lookup of every prompt after every op)."""
    from radixtop.gpu_backend.traces.formats import load_trace, timed_ops
    from radixtop.gpu_backend.traces.ops import TraceError
    from tests.support import REPO

    trace = load_trace(REPO / "tests" / "data" / "mooncake_conversation_excerpt.jsonl", "mooncake")
    ops = [t.op for t in timed_ops(trace, 8)]
    prompts = sorted({tuple(op.fields["input"]) for op in ops if op.op in ("begin", "request")})
    s = Scheduler(get_geometry("tiny"), 6144, device="cpu", write_kv=False)
    clock = [0]
    s.cache.history.clock = lambda: clock[0]
    s.cache.history.since = 0
    adapter = BundledAdapter.__new__(BundledAdapter)
    adapter.name = "bundled"
    adapter._call = lambda fn, *a, **k: fn(s)
    replayer = Replayer(s)
    cached: list[list[int]] = [[0] * len(prompts)]
    causes: list = [None]
    asked, named = 0, set()
    for op in ops:
        if op.op in ("begin", "request"):
            i = prompts.index(tuple(op.fields["input"]))
            hit, before = cached[-1][i], max(c[i] for c in cached)
            assert s.cache.lookup(op.fields["input"]).prefix_len == hit
            if hit < before:
                w = BundledAdapter.why(adapter, op.fields["input"])
                assert w.cached_tokens == w.diverges_at == hit
                want = expected(i, prompts[i], cached, causes)
                assert set(range(hit, before)) <= set(want)  # (the oracle's own sense)
                assert answered(w) == want, (op.line_no, hit, before)
                asked += 1
                named |= {lost.cause for lost in w.lost}
        clock[0] += 1
        try:
            replayer.apply(op)
        except TraceError:  # the one prompt too large for the pool: refused, nothing changed
            assert op.line_no == 12
        causes.append(cause_of(op, False))
        cached.append([s.cache.lookup(q).prefix_len for q in prompts])
    print(f"mooncake: {asked} requests asked why, causes named: {sorted(named)}")
    assert asked >= 3 and named == {EVICTED, CLOSED}, (asked, named)


def tree_nodes(root, tokens=lambda node: list(node.key)) -> dict[int, tuple[tuple[int, ...], int, frozenset[str]]]:
    """Every node of a tree now (the bundled one, or SGLang's with ``tokens`` its key's ids): its
    path's tokens from the root, its own tokens' count and the sessions that hold it."""
    out, stack = {}, [(root, ())]
    while stack:
        node, path = stack.pop()
        if node is not root:
            own = tokens(node)
            path = path + tuple(own)
            out[node.id] = (path, len(own), frozenset(getattr(node, "session_ids", None) or ()))
        stack.extend((child, path) for child in node.children.values())
    return out


def bundled(s: Scheduler) -> BundledAdapter:
    """The bundled adapter over ``s`` with its calls run here, at once (no engine thread)."""
    adapter = BundledAdapter.__new__(BundledAdapter)
    adapter.name, adapter.tokenizer = "bundled", None
    adapter._call = lambda fn, *a, **k: fn(s)
    adapter._call_pass = lambda make: run_to_end(make(s))
    return adapter


class SessionLosses:
    """The independent side of each session's losses: op by op, the nodes in the tree before it and
    not after it that the session held before it (or that its own close freed), with the tokens of
    each no longer cached after it (a split may leave a node's head, under a new id), by the op's
    cause."""

    def __init__(self) -> None:
        self.lost: dict[str, list[tuple[int, str, int, int]]] = {}  # (at, cause, nodes, tokens)

    def step(self, at: int, before, after, cached_of, cause: str, closer: str | None) -> None:
        per: dict[str, list[int]] = {}
        for node_id in before.keys() - after.keys():
            path, length, holders = before[node_id]
            tokens = len(path) - max(len(path) - length, cached_of(list(path)))
            for sid in holders | ({closer} if closer else set()):
                per.setdefault(sid, [0, 0])
                per[sid][0] += 1
                per[sid][1] += tokens
        for sid, (nodes, tokens) in per.items():
            self.lost.setdefault(sid, []).append((at, cause, nodes, tokens))

    def check(self, v, sid: str) -> None:
        assert [(x.at, x.cause, x.nodes, x.tokens) for x in v.lost] == self.lost.get(sid, []), sid
        by_cause: dict[str, int] = {}
        for _, cause, _, tokens in self.lost.get(sid, []):
            by_cause[cause] = by_cause.get(cause, 0) + tokens
        assert v.lost_tokens == by_cause, sid


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size,flush_every", [("small", 0), ("small", 25)])
def test_why_for_a_session_gives_its_hits_and_each_loss_of_what_it_held_with_its_cause(seed, size, flush_every):
    """A session's story against the independent side: its requests are the trace's begins of it,
    with the hits the scheduler answered; its losses are, op by op, the nodes that were in the tree
    before the op and not after it that it held before the op (or that its own close freed), by
    the op's cause."""
    lines = generate_trace(seed, n_ops=220, max_in_flight=4, vocab=60, abort_weight=2)
    s = Scheduler(get_geometry("tiny"), capacity_for(lines, size), device="cpu", write_kv=False)
    clock = [0]
    h = s.cache.history
    h.clock = lambda: clock[0]
    h.since = h.served_since = 0
    adapter = bundled(s)
    adapter.session = lambda sid: None
    replayer, rng = Replayer(s), random.Random(seed)
    served: dict[str, list[tuple[int, int, int]]] = {}
    losses = SessionLosses()
    for op in read_trace(lines):
        for flush in ([True] if flush_every and rng.randrange(flush_every) == 0 else []) + [False]:
            clock[0] += 1
            before = tree_nodes(s.cache.root_node)
            if flush:
                s.flush()
            else:
                result = replayer.apply(op)
                if op.op in ("begin", "request") and op.fields.get("session"):
                    served.setdefault(op.fields["session"], []).append((clock[0], len(op.fields["input"]), result["hit"]))
            losses.step(clock[0], before, tree_nodes(s.cache.root_node), lambda q: s.cache.lookup(q).prefix_len,
                        *cause_of(op, flush))
    sessions = set(served) | set(losses.lost)
    assert any(losses.lost.values()), "nothing any session held was lost: the test proves nothing"
    for sid in sorted(sessions):
        v = BundledAdapter.why_session(adapter, sid)
        assert [(r.at, r.prompt_tokens, r.cached_tokens) for r in v.requests] == served.get(sid, []), sid
        assert v.requests_kept == len(served.get(sid, []))
        losses.check(v, sid)


def test_a_sessions_story_is_copied_in_slices_and_a_removal_between_two_is_read_once():
    """``session_story`` copies the history a slice at a time (each one hold of the owner thread);
    what the tree removes between two slices is read too, and what the bounds drop meanwhile is
    gone: every removal read once, in order."""
    from radixtop.adapters.owned.why import STORY_SLICE, session_story

    h = CacheHistory(most_bytes=(2 * STORY_SLICE + 10) * (8 + GHOST_BYTES), clock=lambda: 1.0)
    h.tells_requests()
    for i in range(2 * STORY_SLICE + 5):
        h.removed(i + 1, 0, [i + 1])
        h.served(f"s{i % 3}", 10, 5)
    story = session_story(h)
    next(story)  # one slice copied
    for i in range(2 * STORY_SLICE + 5, 2 * STORY_SLICE + 25):  # 20 more: the oldest 15 dropped
        h.removed(i + 1, 0, [i + 1])
    slices = 2
    try:
        while True:
            next(story)
            slices += 1
    except StopIteration as done:
        ghosts, requests, _, _ = done.value
    ids = [g.node_id for g in ghosts]
    assert ids == sorted(set(ids)) and ids[-1] == 2 * STORY_SLICE + 25 and ids[0] == 1  # (read before the drop)
    assert set(range(STORY_SLICE + 1, 2 * STORY_SLICE + 26)) <= set(ids)
    assert len(requests) == 2 * STORY_SLICE + 5 and slices >= 4


def test_the_ops_keep_their_tokens_within_their_bound_and_stay_without_them_past_it(monkeypatch):
    """The engine's ops (``did``) keep a begin's prompt and a finish's output while their tokens fit
    ``MOST_SERVED_TOKENS``; past it the oldest lose their tokens (not their place: a session's hits
    over time stay) and ``tokens_since`` says from when each op has them; the count bound drops
    whole ops, their tokens with them."""
    from array import array

    import radixtop.gpu_backend.history as history

    monkeypatch.setattr(history, "MOST_SERVED_TOKENS", 10)
    monkeypatch.setattr(history, "MOST_SERVED", 5)
    clock = [0.0]
    h = CacheHistory(clock=lambda: clock[0])
    h.tells_requests()
    for i in range(3):
        clock[0] += 1
        h.served("s", 4, i, f"r{i}", array("q", [i] * 4))
    clock[0] += 1
    h.did("close", "s")
    ops, first = h.requests_after(0, 10)
    assert first == 1 and [(op[4], op[5], None if op[6] is None else list(op[6])) for op in ops] == [
        ("begin", "r0", None), ("begin", "r1", [1] * 4), ("begin", "r2", [2] * 4), ("close", None, None)]
    assert h.served_tokens == 8 and h.tokens_since == 1.0
    clock[0] += 1
    h.did("finish", "s", "r2", array("q", [9] * 3))  # 11 tokens: r1's go
    clock[0] += 1
    h.did("evict", asked_tokens=7)  # 6 ops: r0's begin goes whole
    ops, first = h.requests_after(0, 10)
    assert first == 2 and [(op[4], None if op[6] is None else len(op[6]), op[7]) for op in ops] == [
        ("begin", None, 0), ("begin", 4, 0), ("close", None, 0), ("finish", 3, 0), ("evict", None, 7)]
    assert h.served_tokens == 7 and h.tokens_since == 2.0 and h.served_since == 1.0
    for _ in range(3):  # the count bound drops r1's and r2's begins (r2's with its tokens) and the close
        clock[0] += 1
        h.did("register", "t")
    assert h.served_tokens == 3 and len(h._tokened) == 1 and h._tokened[0][4] == "finish"


@pytest.mark.parametrize("seed", range(3))
def test_a_journal_reads_any_of_its_items_as_a_deque_would_across_its_drops(seed, monkeypatch):
    """The removals' and the ops' journals (``_Kept``: a list and its oldest's index, so that a
    read from the middle costs what it copies, not a walk to it) give what a deque given the same
    appends and drops gives: its length, each item by index, any slice, its items in order, its
    numbered reads (``_tail``); across the moves down of what is kept (``KEPT_COMPACT``)."""
    from collections import deque

    import radixtop.gpu_backend.history as history

    monkeypatch.setattr(history, "KEPT_COMPACT", 8)
    rng = random.Random(seed)
    kept, model, count, moved = history._Kept(), deque(), 0, 0
    for _ in range(3000):
        if model and rng.random() < 0.45:
            assert kept.popleft() == model.popleft()
            moved += kept._head == 0
        else:
            count += 1
            kept.append(count)
            model.append(count)
        assert len(kept) == len(model) and bool(kept) == bool(model)
        if model:
            i = rng.randrange(len(model))
            assert kept[i] == model[i] and kept[-1] == model[-1] and kept[0] == model[0]
            j = rng.randrange(i, len(model) + 1)
            assert kept.slice(i, j) == list(model)[i:j]
            after, limit = rng.randrange(count + 2), rng.randrange(1, 40)
            first = count - len(model) + 1
            start = max(after + 1, first) - first
            want = list(model)[start:start + limit]
            assert history._tail(kept, count, after, limit) == (want, first + start if want else count + 1)
        with pytest.raises(IndexError):
            kept[len(model)]
    assert list(kept) == list(model) and moved > 10, "the kept items never moved down: the test proves nothing"
    while model:
        assert kept.popleft() == model.popleft()
    with pytest.raises(IndexError):
        kept.popleft()
