"""``why`` beside SGLang 0.5.23's ``UnifiedRadixCache`` on its Python tree core (issue 29): the
history kept in radixtop's copy (``mirror_unified.MirrorUnifiedCache``) from the probe's records.
The unified tree frees nodes by eviction only (a close dereferences): SGLang's own, for room, or an
evict radixtop's probe runs (told so: ``records.CAUSE``), or its flush (the whole tree at once).
Checked as on the bundled engine (``tests/backend/test_history.py``): after every op SGLang's own
tree says how many tokens of each query were cached; ``why`` must name each token lost since with
the op and the cause that removed it."""

from __future__ import annotations

import random

import pytest

from radixtop.adapters.owned.records import CAUSE
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.sglang.mirror_unified import MirrorUnifiedCache
from radixtop.adapters.sglang.records import recorder_for
from radixtop.gpu_backend.history import EVICT_ACTION, EVICTED, FLUSHED
from tests.backend.test_history import Oracle
from tests.on_sglang.ref import drive23
from tests.on_sglang23.test_mirror23 import wire

pytestmark = [pytest.mark.sglang]


@pytest.mark.parametrize("seed", range(4))
def test_why_beside_the_unified_tree_names_the_op_and_cause_that_removed_each_lost_token(seed):
    rng = random.Random(seed)
    cache, pools = drive23.build_unified_cache23(600, 1, tree_core_backend="python", enable_session_radix_cache=True)
    prompts = [[rng.randrange(2, 40) for _ in range(rng.randint(4, 20))] for _ in range(6)]
    inproc = SGLangInProcessAdapter(cache, model="tiny")
    recorder = recorder_for(cache)
    mirror = MirrorUnifiedCache(page_size=1, sessions=True)
    mirror.apply(wire(recorder.snapshot()))
    beside = SGLangInProcessAdapter(mirror, model="tiny")
    plan: list[tuple] = []  # (the ops drawn first: every query is known from the first op on)
    for _ in range(200):
        roll = rng.random()
        tokens = rng.choice(prompts)[: rng.randint(1, 20)] + [rng.randrange(2, 60) for _ in range(rng.randint(1, 12))]
        plan.append((roll, tokens, f"s{rng.randrange(5)}", rng.randint(1, 60),
                     [rng.randrange(2, 60) for _ in range(3)], rng.random()))
    queries = sorted({tuple(p[1]) for p in plan})
    oracle = Oracle(queries, lambda q: inproc.match(q).matched_tokens, mirror, recorder)
    step = oracle.step
    running: list = []

    def evict_asked(n: int) -> None:  # as the probe runs an evict asked for
        recorder.records.append((CAUSE, EVICT_ACTION, "radixtop's evict"))
        drive23.evict(cache, n)
        recorder.records.append((CAUSE, "", ""))

    def begin(tokens, sid) -> None:
        try:
            running.append(drive23.begin_request(cache, pools, tokens, session_id=sid))
        except RuntimeError:
            pass

    for roll, tokens, sid, n, output, pick in plan:
        if roll < 0.5 or not running:
            step(lambda tokens=tokens, sid=sid: begin(tokens, sid), (EVICTED, None))
        elif roll < 0.85:
            req = running.pop(int(pick * len(running)))
            step(lambda req=req, output=output: drive23.finish_request(cache, pools, req, output), (EVICTED, None))
        elif roll < 0.93:
            step(lambda n=n: evict_asked(n), (EVICT_ACTION, None))
        else:
            step(lambda sid=sid: drive23.close_session(cache, sid), (EVICTED, None))
    for req in running:
        step(lambda req=req: drive23.finish_request(cache, pools, req, [7]), (EVICTED, None))
    step(cache.reset, (FLUSHED, None))  # SGLang's flush: the whole tree at once
    assert oracle.check(beside)
    assert all(c == 0 for c in oracle.cached[-1])
    assert {c[0] for c in oracle.causes[1:]} >= {EVICTED, EVICT_ACTION, FLUSHED}


@pytest.mark.parametrize("seed", range(3))
def test_the_tree_then_beside_the_unified_tree_is_its_tree_now_less_what_was_stored_since_plus_what_left(seed):
    """``then`` over the copy at every past moment, against SGLang's own unified tree walked after
    each op (``test_history_then.check_then``)."""
    from tests.backend.test_history_then import check_walks, sglang_nodes

    cache, pools, mirror, oracle, beside = copied(400)
    walks = [sglang_nodes(cache)]
    driven(random.Random(seed), cache, pools, oracle, 220, lambda: walks.append(sglang_nodes(cache)))
    tree = beside.tree
    check_walks(mirror.history, walks, lambda: tree.evictable_size() + tree.protected_size(), beside.then, every=9,
                browse=beside)


@pytest.mark.parametrize("seed", range(2))
def test_a_sessions_hits_beside_the_unified_tree_are_the_requests_sglang_gave_back_finished(seed):
    """Each request SGLang gives back finished (``on_release``) is an ``OP`` record of the probe's;
    beside, a session's story lists its requests' hits as SGLang's ``Req.cached_tokens`` gave them,
    in the order they ended: an aborted one too (``FINISH_ABORT``: it was served its hit; a
    retracted one, not finished, comes back and is told once it ends)."""
    rng = random.Random(seed)
    cache, pools = drive23.build_unified_cache23(400, 1, tree_core_backend="python", enable_session_radix_cache=True)
    recorder = recorder_for(cache)
    mirror = MirrorUnifiedCache(page_size=1, sessions=True)
    mirror.history.tells_requests()  # (as the process beside does where the probe says it tells them)
    mirror.apply(wire(recorder.snapshot()))
    beside = SGLangInProcessAdapter(mirror, model="tiny")
    stories = {f"s{k}": [100 + k] for k in range(3)}
    served: dict[str, list[tuple[int, int]]] = {}
    running: list = []
    for _ in range(60):
        sid = rng.choice(sorted(stories))
        if rng.random() < 0.6 or not running:
            try:
                running.append((sid, drive23.begin_request(cache, pools, stories[sid], session_id=sid)))
            except RuntimeError:
                pass
        else:
            sid, req = running.pop(rng.randrange(len(running)))
            abort = rng.random() < 0.2
            output = [rng.randrange(2, 60) for _ in range(3)]
            drive23.finish_request(cache, pools, req, output, abort=abort)
            served.setdefault(sid, []).append((len(req.origin_input_ids), req.cached_tokens))
            if not abort:
                stories[sid] = list(req.origin_input_ids) + output[:-1] + [rng.randrange(2, 60)]
        mirror.apply(wire(recorder.take()))
    assert any(hit for hits in served.values() for _, hit in hits), "no hit: the test proves nothing"
    for sid in stories:
        v = beside.why_session(sid)
        assert [(r.prompt_tokens, r.cached_tokens) for r in v.requests] == served.get(sid, []), sid


@pytest.mark.parametrize("seed", range(2))
def test_the_sessions_memory_then_beside_the_unified_tree_is_what_sglangs_own_tree_gave_then(seed):
    """The sessions' memory at every past moment over the copy, against the from-scratch
    attribution of SGLang's own unified tree (its full component's session marks; the deref
    policy: a close frees nothing, exclusive stays 0) after each op: requests, evictions, closes."""
    from radixtop.adapters.owned.attribution import attribute
    from radixtop.adapters.sglang.trees import tree_for

    cache, pools, mirror, oracle, beside = copied(600)
    own = tree_for(cache)

    def memory() -> dict[str, tuple[int, int, int]]:
        leaves = own.session_leaves()
        want = attribute(own.root, leaves, own.closed(), set(leaves), {}, 1, False, lock_ref=own.lock_ref)
        return {sid: row[2:5] for sid, row in want.sessions.items() if any(row[2:5])}

    then = [memory()]
    driven(random.Random(seed), cache, pools, oracle, 200, lambda: then.append(memory()), closes=True)
    assert mirror.history.marks_since == 0
    for k in range(0, len(then), 7):
        v = beside.then(float(k))
        got = {x.session_id: (x.tagged_nodes, x.exclusive_tokens, x.shared_tokens) for x in v.memory}
        assert v.memory_sessions == len(then[k]) and got == {sid: then[k][sid] for sid in got}, k
    assert len({tuple(sorted(m.items())) for m in then}) > 20, "the sessions' memory hardly moved: it proves nothing"


def copied(capacity: int):
    """SGLang 0.5.23's unified tree (the Python core, sessions on) and radixtop's copy of it beside
    (its history's clock the oracle's op index, every journal from 0)."""
    cache, pools = drive23.build_unified_cache23(capacity, 1, tree_core_backend="python", enable_session_radix_cache=True)
    recorder = recorder_for(cache)
    mirror = MirrorUnifiedCache(page_size=1, sessions=True)
    mirror.apply(wire(recorder.snapshot()))
    oracle = Oracle([], lambda q: 0, mirror, recorder)
    beside = SGLangInProcessAdapter(mirror, model="tiny")
    mirror.history.since = mirror.history.stores_since = 0  # (the snapshot's gap, on the test's clock)
    return cache, pools, mirror, oracle, beside


def driven(rng: random.Random, cache, pools, oracle, steps: int, after, closes: bool = False) -> None:
    """``steps`` ops on the cache, each an oracle's step, ``after()`` each: requests of five
    sessions over a few shared prompts begun and finished, evictions, and (``closes``) a session's
    close where none of its requests runs."""
    prompts = [[rng.randrange(2, 40) for _ in range(rng.randint(4, 20))] for _ in range(6)]
    running: list = []
    for _ in range(steps):
        roll = rng.random()
        sid = f"s{rng.randrange(5)}"
        tokens = rng.choice(prompts)[: rng.randint(1, 20)] + [rng.randrange(2, 60) for _ in range(rng.randint(1, 12))]
        if roll < 0.45 or not running:
            def begin(tokens=tokens, sid=sid) -> None:
                try:
                    running.append(drive23.begin_request(cache, pools, tokens, session_id=sid))
                except RuntimeError:
                    pass
            oracle.step(begin, None)
        elif roll < 0.85:
            req = running.pop(rng.randrange(len(running)))
            oracle.step(lambda req=req: drive23.finish_request(cache, pools, req, [rng.randrange(2, 60)]), None)
        elif closes and roll < 0.93 and not any(r.session_id == sid for r in running):
            oracle.step(lambda sid=sid: drive23.close_session(cache, sid), None)
        else:
            oracle.step(lambda: drive23.evict(cache, rng.randint(1, 60)), None)
        after()
