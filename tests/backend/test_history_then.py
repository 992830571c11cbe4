"""The tree at a past moment (``then``, issue 29's time travel), told from the tree now and the
history's changes since, against an independent side: the tree's own walk at each moment, kept as
it was (every cached token prefix then, and every node id)."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.owned.attribution import attribute
from radixtop.adapters.owned.why import then_pass, then_view
from radixtop.adapters.text import memory_then_lines, when
from radixtop.gpu_backend.history import BEGIN, ROOT, STORE_CHUNK, CacheHistory, tree_then
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.owner.slices import run_to_end
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.traces.ops import Replayer, read_trace
from tests.backend.test_history import bundled, tree_nodes
from tests.support.trace_gen import capacity_for, generate_trace


def prefixes(nodes) -> set[tuple[int, ...]]:
    """Every cached token prefix of a tree (``tree_nodes``): a radix tree holds each once."""
    out = set()
    for path, own, _ in nodes.values():
        out.update(path[:n] for n in range(len(path) - own + 1, len(path) + 1))
    return out


def tokens(nodes) -> int:
    return sum(own for _, own, _ in nodes.values())


def run(seed: int, size: str, flush_every: int):
    """The trace on a scheduler whose history's clock is the op's index; after each op, the tree's
    own walk (``tree_nodes``)."""
    lines = generate_trace(seed, n_ops=240, max_in_flight=4, vocab=60, abort_weight=2)
    s = Scheduler(get_geometry("tiny"), capacity_for(lines, size), device="cpu", write_kv=False)
    clock = [0]
    h = s.cache.history
    h.clock = lambda: clock[0]
    h.since = h.stores_since = 0
    replayer, rng = Replayer(s), random.Random(seed)
    walks = [tree_nodes(s.cache.root_node)]
    for op in read_trace(lines):
        clock[0] += 1
        if flush_every and rng.randrange(flush_every) == 0:
            s.flush()
        replayer.apply(op)
        walks.append(tree_nodes(s.cache.root_node))
    return s, walks


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size,flush_every", [("small", 0), ("large", 0), ("small", 30)])
def test_the_tree_then_is_the_tree_now_less_what_was_stored_since_plus_what_left_since(seed, size, flush_every):
    """At every past moment: the nodes of the tree now that were there then, with the nodes that
    left since, hold exactly the token prefixes the tree held then; every node then that is gone
    now left since; and the answer's figures are those of the walks."""
    s, walks = run(seed, size, flush_every)
    adapter = bundled(s)
    check_walks(s.cache.history, walks, s.cache.total_size, adapter.then, every=7)
    assert adapter.then(len(walks) - 1).tokens_then == len(prefixes(walks[-1]))


def test_a_moment_before_the_historys_reach_or_to_come_is_refused_in_one_line():
    h = CacheHistory(clock=lambda: 100.0)
    h.since = h.stores_since = 50.0
    for at in (49.0, time.time() + 3600, float("nan")):
        with pytest.raises(BadRequest) as e:
            run_to_end(then_pass(h, at, lambda: 0))
        assert "\n" not in str(e.value)
    assert run_to_end(then_pass(h, 50.0, lambda: 0))[2] == 0
    assert run_to_end(then_pass(h, None, lambda: 0))[4] == 50.0  # (none asked: as far back as it reaches)


def test_the_changes_are_read_a_few_chunks_a_slice_and_what_comes_between_two_is_read_too():
    """Each slice copies at most ``CHUNKS_A_SLICE`` chunks of the changes; stores told between two
    slices are read in a later one, and the answer's figures agree with its last slice's."""
    from radixtop.adapters.owned.why import CHUNKS_A_SLICE

    t = [0.0]
    h = CacheHistory(clock=lambda: t[0], most_age_s=1e9)
    h.since = h.stores_since = 0.0
    total = (2 * CHUNKS_A_SLICE + 1) * STORE_CHUNK
    for i in range(1, total):
        t[0] = float(i)
        h.stored(i, ROOT, 1)
    live = [total - 1]
    story = then_pass(h, 0.5, lambda: live[0])
    next(story)  # (the first slice: 4 chunks of the 9)
    for i in range(total, total + 10):  # (the 9th chunk filled, a 10th begun)
        t[0] = float(i)
        h.stored(i, ROOT, 1)
        live[0] += 1
    slices = 1
    try:
        while True:
            slices += 1
            next(story)
    except StopIteration as done:
        ghosts, changes, tokens_now, *_ = done.value
    diff = tree_then(changes, ghosts)
    assert slices == 3 and len(diff.new) == live[0] == tokens_now


def test_the_changes_are_bounded_whole_chunks_at_a_time_and_say_how_far_back_they_reach():
    import radixtop.gpu_backend.history as history

    t = [0.0]
    h = CacheHistory(clock=lambda: t[0], most_age_s=1e9)
    h.since = h.stores_since = 0.0
    old = history.MOST_STORES
    history.MOST_STORES = 4 * STORE_CHUNK
    try:
        for i in range(1, 10 * STORE_CHUNK):
            t[0] = float(i)
            h.stored(i, ROOT, 1)
    finally:
        history.MOST_STORES = old
    assert len(h._stores) <= 4
    assert h.then_reaches_back_to() >= 6 * STORE_CHUNK - 1
    with pytest.raises(BadRequest):
        run_to_end(then_pass(h, 10.0, lambda: 0))
    read = run_to_end(then_pass(h, h.then_reaches_back_to(), lambda: 0))
    assert len(tree_then(read[1], read[0]).new) == 10 * STORE_CHUNK - 1 - int(h.then_reaches_back_to())


def check_walks(h: CacheHistory, walks, tokens_now_of, then_of, every: int, browse=None, browse_tokens=None,
                **how) -> None:
    """``check_then`` at every ``every``-th moment of ``walks`` (the tree's walk after each op, the
    history's clock the op's index), against the last; and where ``browse`` is an adapter, its tree
    then browsed node by node (``test_then_tree.check_browse``)."""
    from tests.backend.test_then_tree import check_browse

    now = walks[-1]
    assert any(walks[k].keys() - now.keys() for k in range(len(walks))), "nothing left: the test proves nothing"
    for k in [*range(0, len(walks), every), len(walks) - 2]:  # (and the last moment but one: most there then is here now)
        check_then(h, k, walks[k], now, tokens_now_of, then_of, **how)
        if browse is not None:
            check_browse(h, k, walks[k], now.keys(), browse.then_children,
                         browse_tokens or (lambda i: list(browse.node(i, 0, 10_000).token_ids)),
                         lives=how.get("lives", False))


def sglang_nodes(cache):
    """``tree_nodes`` of SGLang's own tree (its keys' token ids)."""
    return tree_nodes(cache.root_node, lambda node: list(node.key.token_ids))


def check_then(h: CacheHistory, k: float, walk_then, now, tokens_now_of, then_of, units=prefixes,
               lives: bool = False) -> None:
    """The history's changes since ``k`` against the tree's walks then and now (``tree_nodes``):
    the nodes now that were there then, with the nodes that left since, hold exactly the token
    prefixes the tree held then (``units``: a block tree's blocks, whole); every node then, gone
    now, left since; the answer's figures. ``lives``: an id may come again (a block's hash),
    so one that left since may be in the tree now again, as another life."""
    ghosts, changes, tokens_now, *_ = run_to_end(then_pass(h, k, tokens_now_of))
    diff = tree_then(changes, ghosts)
    left = {g.node_id: g for g in diff.left}
    assert len(left) == len(diff.left), "a node left twice since then"
    first_leaving: dict = {}
    for g in ghosts:
        first_leaving.setdefault(g.node_id, g)
    assert all(first_leaving[g.node_id] is g for g in diff.left), "a node's later leaving taken for its life then"
    assert walk_then.keys() - now.keys() <= left.keys(), k  # (each node then, gone now, left since)
    if lives:
        assert diff.new.keys() <= now.keys()
        assert left.keys() & now.keys() <= diff.new.keys()  # (in the tree again: a life since)
    else:
        assert not left.keys() & now.keys()
        assert diff.new.keys() <= now.keys() - walk_then.keys()

    def path(node_id: int) -> tuple[int, ...]:
        if node_id == ROOT:
            return ()
        if node_id in now:
            return now[node_id][0]
        g = left[node_id]
        return path(g.parent_id) + tuple(int(t) for t in memoryview(g.tokens).cast("q"))

    then = {i: v for i, v in now.items() if i not in diff.new}
    assert not then.keys() & left.keys()
    then.update({i: (path(i), g.length, frozenset()) for i, g in left.items()})
    assert units(then) == units(walk_then), k
    v = then_of(k)
    assert (v.tokens_then, v.tokens_now) == (tokens(walk_then), tokens(now)), k
    assert tokens_now == v.tokens_now
    assert v.left_tokens == sum(g.length for g in left.values()) and v.left_nodes == len(left)
    assert v.stored_tokens == sum(now[i][1] for i in diff.new) and v.stored_nodes == len(diff.new)
    assert sum(v.left_by_cause.values()) == v.left_tokens
    assert sum(b.tokens for b in v.left) <= v.left_tokens and len(v.left) == min(50, v.left_branches)
    if v.left_branches <= 50:
        assert sum(b.tokens for b in v.left) == v.left_tokens
        assert sum(b.nodes for b in v.left) == v.left_nodes
    if v.stored_branches <= 50:
        assert sum(b.tokens for b in v.stored) == v.stored_tokens
    for b in v.left:  # (a branch hangs below a node there then and now, or the root)
        assert b.parent_id is None or (b.parent_id in now and b.parent_id not in diff.new)
        assert sum(b.causes.values()) == b.tokens
    for b in v.stored:
        assert b.parent_id is None or b.parent_id in now


@pytest.mark.parametrize("seed", range(4))
def test_the_sessions_then_are_their_requests_and_closes_up_to_the_moment(seed):
    """``then``'s sessions at every past moment, against the trace's own ops up to it: each
    session with an op by then, its requests begun by then with their prompts and hits (the
    scheduler's answers), its last request, closed or open then; what each held that left since
    is what the removals since name it in; the most recently active first."""
    lines = generate_trace(seed, n_ops=200, max_in_flight=4, vocab=60, abort_weight=2)
    s, clock, h = clocked(lines, "small")
    h.served_since = 0
    replayer, seen = Replayer(s), []
    for op in read_trace(lines):
        clock[0] += 1
        seen.append((clock[0], op, replayer.apply(op)))
    adapter = bundled(s)
    for k in range(0, clock[0] + 1, 9):
        expect: dict[str, dict] = {}
        session_of: dict[str, str | None] = {}  # (a request's finish or abort is its session's op too)
        for at, op, result in seen:
            if op.op == "begin":
                session_of[op.fields["id"]] = op.fields.get("session")
            sid = session_of.get(op.fields["id"]) if op.op in ("finish", "abort") else op.fields.get("session")
            if at > k or sid is None:
                continue
            e = expect.setdefault(sid, {"closed": False, "requests": 0, "prompt": 0, "cached": 0, "last": (0, 0)})
            e["at"] = at
            if op.op == "close":
                e["closed"] = True
            elif op.op in ("begin", "request"):
                e["closed"] = False
                e["requests"] += 1
                e["prompt"] += len(op.fields["input"])
                e["cached"] += result["hit"]
                e["last"] = (len(op.fields["input"]), result["hit"])
            elif op.op == "register":
                e["closed"] = False
        v = adapter.then(float(k))
        assert v.sessions_active == len(expect) and v.sessions_since == 0, k
        assert v.sessions_open == sum(1 for e in expect.values() if not e["closed"]), k
        got = {x.session_id: x for x in v.sessions}
        assert len(got) == min(len(expect), 50)
        assert [x.last_at for x in v.sessions] == sorted((x.last_at for x in v.sessions), reverse=True)
        left = [g for g in h.ghosts() if g.at > k]
        for sid, x in got.items():
            e = expect[sid]
            assert (x.state, x.requests, x.prompt_tokens, x.cached_tokens, x.last_at) == (
                "closed" if e["closed"] else "open", e["requests"], e["prompt"], e["cached"], e["at"]), (k, sid)
            assert (x.last_prompt_tokens, x.last_cached_tokens) == e["last"], (k, sid)
            assert x.lost_since_tokens == sum(g.length for g in left if sid in g.holders or
                                              (g.cause == "closed" and g.session_id == sid)), (k, sid)
    assert any(x.lost_since_tokens for k in range(0, clock[0], 9) for x in adapter.then(float(k)).sessions or ()), \
        "nothing any session held left: the test proves nothing"


def clocked(lines, size: str) -> tuple[Scheduler, list[int], CacheHistory]:
    """A scheduler for a generated trace whose history's clock is the test's (``clock[0]``: the
    op's index), every journal reaching back to 0."""
    s = Scheduler(get_geometry("tiny"), capacity_for(lines, size), device="cpu", write_kv=False)
    clock = [0]
    h = s.cache.history
    h.clock = lambda: clock[0]
    h.since = h.stores_since = h.marks_since = 0
    return s, clock, h


def oracle_memory(s: Scheduler) -> dict[str, tuple[int, int, int]]:
    """Each session holding anything, from scratch (``attribute``, the ledger's own oracle): its
    tagged nodes, exclusive tokens and shared tokens."""
    cache = s.cache
    want = attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids, s.session_activity,
                     s.session_activity, 1, cache.close_policy != "deref")
    return {sid: (row[2], row[3], row[4]) for sid, row in want.sessions.items() if row[2] or row[3] or row[4]}


def memory_of(v) -> dict[str, tuple[int, int, int]]:
    return {x.session_id: (x.tagged_nodes, x.exclusive_tokens, x.shared_tokens) for x in v.memory}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("flush_every", [0, 25])
def test_the_sessions_memory_then_is_what_a_from_scratch_attribution_gave_then(seed, flush_every):
    """At every past moment, each session's memory then (tagged nodes, exclusive and shared
    tokens) is what the from-scratch attribution of the tree gave at that moment: from each move
    of a session's figures the history kept (its marks) and the figures now. Evictions, closes,
    aborts and flushes (a reset) on a tight pool move them; the most exclusive first; its now
    is the attribution now."""
    lines = generate_trace(seed, n_ops=220, max_in_flight=4, vocab=60, abort_weight=2)
    s, clock, h = clocked(lines, "small")
    replayer, rng = Replayer(s), random.Random(seed)
    then = [oracle_memory(s)]
    for op in read_trace(lines):
        clock[0] += 1
        if flush_every and rng.randrange(flush_every) == 0:
            s.flush()
        replayer.apply(op)
        then.append(oracle_memory(s))
    adapter = bundled(s)
    now = then[-1]
    moved = 0
    for k in range(0, len(then), 5):
        v = adapter.then(float(k))
        assert v.memory_since == 0 and v.memory_sessions == len(then[k]), k
        assert v.bytes_per_token == s.geometry.bytes_per_token > 0
        assert len(v.memory) == min(len(then[k]), 50)
        assert memory_of(v) == {sid: then[k][sid] for sid in memory_of(v)}, k
        assert [(-x.exclusive_tokens, -x.exclusive_tokens - x.shared_tokens) for x in v.memory] == sorted(
            (-x.exclusive_tokens, -x.exclusive_tokens - x.shared_tokens) for x in v.memory)
        for x in v.memory:
            assert (x.tagged_nodes_now, x.exclusive_tokens_now, x.shared_tokens_now) == now.get(x.session_id, (0, 0, 0))
        moved += then[k] != now
        lines = memory_then_lines(v, float(k), shown=3)
        if v.memory:
            top = v.memory[0]
            assert lines[0] == f"sessions' memory then: {len(then[k])} held some; the most exclusive (then -> now):"
            assert lines[1].startswith(f"  {top.session_id}: exclusive {top.exclusive_tokens:,} tok")
            assert len(lines) == 1 + min(3, len(v.memory)) + (len(then[k]) > 3)
        else:
            assert lines == ["sessions' memory then: no session held any"]
    assert moved > 3, "the sessions' memory never moved: the test proves nothing"
    assert any(then[k] and any(e for _, e, _ in then[k].values()) for k in range(len(then)))


def test_the_sessions_memory_then_is_read_in_slices_and_moves_between_them_are_read_too():
    """Each of the ledger's maps is copied in its own slice, and the marks to the journal's end
    in the last: requests that move the figures between two slices leave the answer exact."""
    lines = generate_trace(3, n_ops=300, max_in_flight=4, vocab=60, abort_weight=2)
    s, clock, h = clocked(lines, "small")
    replayer, ops = Replayer(s), list(read_trace(lines))
    then = [oracle_memory(s)]
    for op in ops[:150]:
        clock[0] += 1
        replayer.apply(op)
        then.append(oracle_memory(s))
    rest = iter(ops[150:])
    for k in (40, 100, 150):
        story = then_pass(h, float(k), s.cache.total_size, s.cache.ledger, s.orders.bpt)
        try:
            while True:
                next(story)
                for op in itertools.islice(rest, 3):  # (between two slices: requests go on)
                    clock[0] += 1
                    replayer.apply(op)
        except StopIteration as done:
            read = done.value
        assert memory_of(then_view(read)) == then[k], k
    assert oracle_memory(s) != then[150]


def test_the_sessions_memory_then_is_not_known_before_the_marks_reach_and_says_so():
    """Marks dropped by the bounds: a moment before the oldest kept has no sessions' memory (null,
    with the moment they reach back to), never figures of 0; the tree's answer stands. A target
    that keeps no sessions' figures says so."""
    lines = generate_trace(1, n_ops=200, max_in_flight=4, vocab=60)
    s, clock, h = clocked(lines, "small")
    h.mark_chunk, h.most_marks = 8, 32
    replayer = Replayer(s)
    for op in read_trace(lines):
        clock[0] += 1
        replayer.apply(op)
    assert len(h._marks) <= 4 and h.marked_count > 40 and h.marks_since > 0
    v = bundled(s).then(h.marks_since - 1)
    assert v.memory is None and v.memory_sessions is None and v.memory_since == h.marks_since
    assert memory_then_lines(v, clock[0]) == [
        f"sessions' memory then: not known (the sessions' figures are kept since {when(h.marks_since, clock[0])})"]
    assert bundled(s).then(h.marks_since).memory is not None
    h.marks_since = None  # (a target that keeps none)
    v = bundled(s).then(float(clock[0]))
    assert v.memory is None and v.memory_since is None
    assert memory_then_lines(v, clock[0]) == [
        "sessions' memory then: not known here (the target keeps no sessions' figures)"]


def served_one_at_a_time() -> tuple[Scheduler, list[int], CacheHistory]:
    """A generated trace of one request at a time on a large pool, served (none running after)."""
    lines = generate_trace(2, n_ops=120, max_in_flight=1, vocab=60)
    s, clock, h = clocked(lines, "large")
    replayer = Replayer(s)
    for op in read_trace(lines):
        clock[0] += 1
        replayer.apply(op)
    return s, clock, h


def test_a_reset_of_the_tree_keeps_the_sessions_memory_before_it():
    """A reset (a copy's tree coming again whole, SGLang's flush) drops every session's figures
    at once: a moment before it still has them, one after it has none."""
    s, clock, h = served_one_at_a_time()
    before = oracle_memory(s)
    assert not s.running and any(e for _, e, _ in before.values())
    clock[0] += 1
    s.cache.reset()
    assert oracle_memory(s) == {}
    adapter = bundled(s)
    assert memory_of(adapter.then(float(clock[0] - 1))) == before
    assert adapter.then(float(clock[0])).memory == ()


def test_the_sessions_memory_is_known_as_far_back_as_the_bundled_engines_history_reaches():
    """The bundled engine's ledger is as old as its tree: the earliest moment the timeline shows
    (the history's reach) has the sessions' memory (none held any then), not "not known"."""
    s = Scheduler(get_geometry("tiny"), 4096, device="cpu", write_kv=False)
    time.sleep(0.002)  # (a moment is told as of the end of its millisecond: the request in a later one)
    s.begin("r1", list(range(1, 40)), "a")
    s.finish("r1", [7, 8])
    v = bundled(s).then(None)
    assert v.memory == () and v.memory_since == s.cache.history.then_reaches_back_to()
    assert [x.session_id for x in bundled(s).then(time.time()).memory] == ["a"]


def test_marks_or_changes_dropped_by_the_bounds_while_a_moment_is_read_are_said_not_answered_wrong(monkeypatch):
    """The journals' bounds drop the oldest while a ``then`` is read in slices (the owner goes on
    between them): where what they dropped is after the moment asked, the sessions' memory is not
    known (null) and the tree is refused in one line, never figures that skip them."""
    import radixtop.adapters.owned.why as why
    import radixtop.gpu_backend.history as history

    lines = generate_trace(1, n_ops=400, max_in_flight=4, vocab=60)
    for dropped in ("marks", "stores"):
        s, clock, h = clocked(lines, "small")
        if dropped == "marks":
            h.mark_chunk, h.most_marks = 8, 32
        else:
            monkeypatch.setattr(history, "STORE_CHUNK", 8)
            monkeypatch.setattr(why, "STORE_CHUNK", 8)
            monkeypatch.setattr(history, "MOST_STORES", 32)
        replayer, ops = Replayer(s), iter(read_trace(lines))
        for op in itertools.islice(ops, 150):
            clock[0] += 1
            replayer.apply(op)
        reach = h.marks_since if dropped == "marks" else h.then_reaches_back_to()
        at = float(int(reach) + 1)
        story = then_pass(h, at, s.cache.total_size, s.cache.ledger, 1)
        next(story)
        for op in ops:  # (the owner goes on: the oldest chunks drop, past the moment)
            clock[0] += 1
            replayer.apply(op)
            if (h.marks_since if dropped == "marks" else h.then_reaches_back_to()) > at + 5:
                break
        if dropped == "marks":
            read = run_to_end(story)
            assert then_view(read).memory is None, "marks dropped after the moment, answered without them"
        else:
            with pytest.raises(BadRequest) as refused:
                run_to_end(story)
            assert "dropped" in str(refused.value) and "\n" not in str(refused.value)
        monkeypatch.undo()


def test_a_moment_inside_a_millisecond_is_told_as_that_milliseconds_end():
    """A session is marked once a millisecond (``MARK_TICKS_A_SECOND``): several ops a
    millisecond, a moment inside one is told as of the end of the millisecond it falls in, the
    whole of it (the tree then, its children pages and the sessions' memory: the tree and the
    attribution after its last op), never a mix of two instants (a tree still empty beside a
    session that held some)."""
    lines = generate_trace(3, n_ops=200, max_in_flight=4, vocab=60, abort_weight=2)
    s, clock, h = clocked(lines, "small")
    step = 0.0002  # (five ops a millisecond)
    clock[0] = 1000.0
    replayer, then, at = Replayer(s), [oracle_memory(s)], [clock[0]]
    cached = [s.cache.total_size()]
    for op in read_trace(lines):
        clock[0] += step
        replayer.apply(op)
        then.append(oracle_memory(s))
        cached.append(s.cache.total_size())
        at.append(clock[0])
    adapter = bundled(s)
    for k in range(len(then)):
        moment = at[k] + step / 2
        end = max(j for j in range(len(then)) if math.floor(at[j] * 1000) <= math.floor(moment * 1000))
        v = adapter.then(moment)
        assert memory_of(v) == then[end], k
        assert v.tokens_then == cached[end], k
        assert v.at == moment
        page = adapter.then_children(moment, 0, 0, 1000)
        assert sum(c.subtree_tokens for c in page.children) == cached[end], k
    assert len(set(cached)) > 20 and any(cached[j] != cached[j + 1] for j in range(0, len(cached) - 1, 5))
    # (the faces' own moment_end, which the HTTP client checks answers with, is the history's)
    from radixtop.adapters.model import moment_end as faces_moment_end
    from radixtop.gpu_backend.history import moment_end

    rng = random.Random(3)
    for at in [1000.0, 1000.001, 1000.0009999, time.time(), *(rng.uniform(0, 2e9) for _ in range(2000))]:
        assert faces_moment_end(at) == moment_end(at) > at


def test_an_op_is_one_instant_though_the_clock_moves_while_it_runs():
    """The clock moves on while an op runs (each read of it a third of a millisecond later here):
    the op's marks of the sessions' figures and its changes to the tree are stamped at one
    instant, so a moment is never the sessions' memory after an op beside the tree before it
    (a mark read in one millisecond, a change stamped in the next)."""
    lines = generate_trace(11, n_ops=200, max_in_flight=4, vocab=60, abort_weight=2)
    s, clock, h = clocked(lines, "small")
    clock[0] = 1000.0
    reads = [0]

    def moving() -> float:
        reads[0] += 1
        clock[0] += 0.00035
        return clock[0]

    h.clock = moving
    replayer, states, starts = Replayer(s), [(s.cache.total_size(), oracle_memory(s))], [clock[0]]
    for op in read_trace(lines):
        replayer.apply(op)
        states.append((s.cache.total_size(), oracle_memory(s)))
        starts.append(clock[0])
    assert reads[0] > len(states) // 2 and len({st[0] for st in states}) > 20, "the test proves nothing"
    h.clock = lambda: clock[0]
    adapter = bundled(s)
    told, steps = 0, 0
    moment = starts[0]
    while moment < starts[-1]:
        v = adapter.then(moment)
        pair = (v.tokens_then, memory_of(v))
        later = [j for j in range(told, len(states)) if states[j][0] == pair[0] and states[j][1] == pair[1]]
        assert later, (moment, pair, states[told])  # (one instant: the tree and the memory after one op)
        told = later[0]
        moment += 0.0004
        steps += 1
    assert told > len(states) // 2 and steps > 100


def test_the_sessions_figures_now_are_of_one_tree_when_a_reset_comes_between_slices():
    """A reset (a flush of SGLang's, a copy's tree made again) between the slices that copy the
    ledger's maps: the figures now are all read again, of the tree after it."""
    s, clock, h = served_one_at_a_time()
    story = then_pass(h, float(clock[0]), s.cache.total_size, s.cache.ledger, 1)
    next(story)
    next(story)  # (the tags copied)
    clock[0] += 1
    s.cache.reset()
    v = then_view(run_to_end(story))
    assert v.memory and all((x.tagged_nodes_now, x.exclusive_tokens_now, x.shared_tokens_now) == (0, 0, 0)
                            for x in v.memory)


def test_a_clock_that_goes_back_keeps_the_journals_in_order_and_each_moment_one_instant():
    """The history's clock steps back (a wall clock set back; a stream's batches from engines
    whose clocks differ): what it tells meanwhile is stamped at the latest moment it told already,
    so its journals stay in order and a moment is still the tree and the sessions' memory after
    every op told by then, never a search over stamps out of order."""
    lines = generate_trace(5, n_ops=240, max_in_flight=4, vocab=60, abort_weight=2)
    s, clock, h = clocked(lines, "small")
    replayer, cached, memory, stamps = Replayer(s), [s.cache.total_size()], [oracle_memory(s)], [0.0]
    for k, op in enumerate(read_trace(lines), 1):
        clock[0] = float(k if k < 120 else k - 60)  # (back 60 s at the 120th op)
        replayer.apply(op)
        cached.append(s.cache.total_size())
        memory.append(oracle_memory(s))
        stamps.append(max(stamps[-1], clock[0]))
    assert list(h._stores[0].at) == sorted(h._stores[0].at) and len(h._stores[0].at) > 100
    assert [g.at for g in h.ghosts()] == sorted(g.at for g in h.ghosts())
    adapter = bundled(s)
    for t in range(0, int(stamps[-1]) + 1, 3):
        last = max(j for j in range(len(stamps)) if stamps[j] <= t)
        v = adapter.then(float(t))
        assert (v.tokens_then, memory_of(v)) == (cached[last], memory[last]), t
    assert len({cached[j] for j in range(100, 200)}) > 10, "the tree never moved around the step: the test proves nothing"


def test_after_the_clock_goes_back_a_gap_and_a_late_start_are_never_before_what_was_told():
    """The clock set back, then a gap (a copy's tree sent whole again: what left meanwhile is not
    known): the history reaches back to no earlier than the latest moment it told, so a moment
    between is refused, never answered from a journal that misses what left. The same for the
    ops and the sessions' figures told from a moment on."""
    t = [1000.0]
    h = CacheHistory(clock=lambda: t[0])
    t[0] = 1010.0
    h.stored(1, ROOT, 4)
    t[0] = 1060.0
    h.stored(2, ROOT, 4)
    t[0] = 1005.0  # (set back 55 s; node 2 left unseen, the tree comes again whole)
    h.gap()
    h.tells_requests()
    h.tells_figures()
    assert h.then_reaches_back_to() >= 1060.0 and h.served_since >= 1060.0 and h.marks_since >= 1060.0
    with pytest.raises(BadRequest):
        run_to_end(then_pass(h, 1030.0, lambda: 4))


def test_an_op_told_far_ahead_of_the_clock_does_not_move_the_historys_clock():
    """An op whose moment (an engine's, read from its frame) is a day ahead: told at most a second
    ahead of the history's clock, so that the changes after it are stamped as they came and the
    age bound drops nothing for it."""
    t = [1000.0]
    h = CacheHistory(clock=lambda: t[0])
    h.tells_requests()
    h.did(BEGIN, "s", "r", [1, 2], 2, 0, at=1000.0 + 86400)
    t[0] = 1001.0
    h.stored(1, ROOT, 4)
    assert h._stores[0].at[-1] == 1001.0 and h.requests_after(0, 10)[0][0][0] <= 1001.0


def test_a_session_active_later_in_the_moments_millisecond_is_told_as_active_at_it():
    """A moment is told as of the end of its millisecond: a session's last op may come a fraction
    of a millisecond after the moment asked. Its line says it was active 0s before, not -0s."""
    from radixtop.adapters.model import SessionThenView
    from radixtop.adapters.text import sessions_then_lines

    class View:
        at, sessions_since, sessions_active, sessions_open = 1000.0004, 990.0, 1, 1
        sessions = [SessionThenView("s1", "open", 1, 10, 4, 1000.0007, 10, 4, 0)]

    (_, line) = sessions_then_lines(View(), 1001.0)
    assert "last active 0s before" in line and "-" not in line.split("before")[0], line
