"""``why`` beside SGLang 0.5.16's real ``RadixCache`` (issue 29): the history is kept in radixtop's
copy of the tree (``mirror.MirrorCache``), from the probe's change records; nothing of it in the
scheduler. Checked as on the bundled engine (``tests/backend/test_history.py``): after every op
SGLang's own tree says how many tokens of each query were cached (a read-only walk of it); ``why``
over the copy must name each token lost since, with the op and the cause that removed it."""

from __future__ import annotations

import json

import pytest

from radixtop.adapters.owned.attribution import attribute
from radixtop.adapters.owned.records import CAUSE
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.history import CLOSED, EVICT_ACTION, EVICTED, FLUSHED
from tests.backend.test_history import Oracle, SessionLosses
from tests.backend.test_history_then import check_walks, sglang_nodes
from tests.on_sglang.ref.replay_sglang import _parse, import_sglang
from tests.on_sglang.test_mirror16 import recorded, wire
from tests.support.trace_gen import generate_trace

pytestmark = [pytest.mark.sglang]


@pytest.fixture(scope="module")
def sgl():
    return import_sglang()


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", range(4))
def test_why_beside_sglang_names_the_op_and_cause_that_removed_each_lost_token(sgl, seed, size):
    lines = generate_trace(seed, n_ops=200, max_in_flight=4, vocab=60, abort_weight=3)
    lines = [line for line in lines if json.loads(line)["op"] != "register"]  # (no path of 0.5.16's)
    queries = sorted({tuple(d["input"]) + tuple(d.get("output") or ()) for d in map(json.loads, lines)
                      if "input" in d} | {tuple(d["input"]) for d in map(json.loads, lines) if "input" in d})
    replayer, cache, inproc, recorder, mirror = recorded(sgl, lines, size)
    oracle = Oracle(queries, lambda q: inproc.match(q).matched_tokens, mirror, recorder)
    mirror.apply(wire(recorder.snapshot()))
    beside = SGLangInProcessAdapter(mirror, model="tiny")
    step = oracle.step

    for line_no, op in _parse(lines):
        if op["op"] == "evict":  # as the probe runs an evict asked for: its removals told as such
            def evict(line_no=line_no, op=op) -> None:
                recorder.records.append((CAUSE, EVICT_ACTION, "radixtop's evict"))
                replayer.apply(line_no, op)
                recorder.records.append((CAUSE, "", ""))
            step(evict, (EVICT_ACTION, None))
        else:
            step(lambda line_no=line_no, op=op: replayer.apply(line_no, op),
                 (CLOSED, op["session"]) if op["op"] == "close" else (EVICTED, None))
    assert oracle.check(beside) or size == "large"
    step(cache.reset, (FLUSHED, None))  # SGLang's flush: the whole tree at once
    oracle.check(beside)
    assert all(c == 0 for c in oracle.cached[-1])


@pytest.mark.parametrize("seed", range(3))
def test_why_for_a_session_beside_sglang_gives_each_loss_of_what_it_held_with_its_cause(sgl, seed):
    """A session's losses over the copy, against SGLang's own tree op by op (``SessionLosses``:
    the nodes that left it that the session held, SGLang's own ``session_ids``); its requests'
    hits, from the probe's ``OP`` record of each request SGLang gives back finished (not an
    aborted one), are the hits SGLang's cache gave them (``req.cached_tokens``), in the order
    they finished."""
    lines, replayer, cache, inproc, mirror, oracle, beside = copied(sgl, seed)
    mirror.history.tells_requests()  # (as the process beside does where the probe says it tells them)
    losses = SessionLosses()
    running: dict[str, tuple[str | None, list[int], int]] = {}
    served: dict[str, list[tuple[int, int]]] = {}
    told: list[tuple] = []
    for line_no, op in _parse(lines):
        before = sglang_nodes(cache)
        result: dict = {}
        oracle.step(lambda line_no=line_no, op=op: result.update(replayer.apply(line_no, op)), None)
        if op["op"] in ("begin", "request"):
            running[op.get("id", "")] = (op.get("session"), op["input"], result["hit"])
        if op["op"] in ("finish", "request") and op.get("id", "") in running:
            sid, prompt, hit = running.pop(op.get("id", ""))
            told += [("begin", sid, len(prompt), hit, prompt), ("finish", sid, 0, 0, op["output"])]
            if sid is not None:
                served.setdefault(sid, []).append((len(prompt), hit))
        if op["op"] == "close":
            told.append(("close", op["session"], 0, 0, []))
        losses.step(oracle.clock, before, sglang_nodes(cache), lambda q: inproc.match(q).matched_tokens,
                    *((CLOSED, op["session"]) if op["op"] == "close" else (EVICTED, None)))
    assert any(losses.lost.values()), "nothing any session held was lost: the test proves nothing"
    assert any(hit for hits in served.values() for _, hit in hits), "no hit: the test proves nothing"
    for sid in sorted(set(losses.lost) | set(served)):
        v = beside.why_session(sid)
        assert [(r.prompt_tokens, r.cached_tokens) for r in v.requests] == served.get(sid, []), sid
        assert v.requests_kept == len(served.get(sid, [])) and v.cached_tokens == sum(h for _, h in served.get(sid, []))
        losses.check(v, sid)
    # each request as the journal beside keeps it (its begin with its prompt and hit, its finish with
    # its output, at its end), and each session's close, in SGLang's order
    ops = [(e[4], e[1], e[2], e[3], list(e[6] or ())) for e in mirror.history.requests_after(0, 10**6)[0]]
    assert ops == told and any(step[0] == "close" for step in told)


@pytest.mark.parametrize("seed", range(3))
def test_the_tree_then_beside_sglang_is_its_tree_now_less_what_was_stored_since_plus_what_left(sgl, seed):
    """``then`` over the copy at every past moment, against SGLang's own tree walked after each op
    (``test_history_then.check_then``): the copy's history keeps the probe's stores, splits and
    removals."""
    lines, replayer, cache, inproc, mirror, oracle, beside = copied(sgl, seed)
    mirror.history.since = mirror.history.stores_since = 0  # (the snapshot's gap, on the test's clock)
    walks = [sglang_nodes(cache)]
    for line_no, op in _parse(lines):
        oracle.step(lambda line_no=line_no, op=op: replayer.apply(line_no, op), None)
        walks.append(sglang_nodes(cache))
    tree = beside.tree
    check_walks(mirror.history, walks, lambda: tree.evictable_size() + tree.protected_size(), beside.then, every=9,
                browse=beside)


def copied(sgl, seed: int, size: str = "small"):
    """A generated trace (no ``register``: no path of 0.5.16's) on SGLang's real cache, recorded,
    and radixtop's copy of it beside (its history's clock the oracle's op index)."""
    lines = generate_trace(seed, n_ops=200, max_in_flight=4, vocab=60, abort_weight=3)
    lines = [line for line in lines if json.loads(line)["op"] != "register"]
    replayer, cache, inproc, recorder, mirror = recorded(sgl, lines, size)
    oracle = Oracle([], lambda q: 0, mirror, recorder)
    mirror.apply(wire(recorder.snapshot()))
    return lines, replayer, cache, inproc, mirror, oracle, SGLangInProcessAdapter(mirror, model="tiny")


@pytest.mark.parametrize("seed", range(3))
def test_the_sessions_memory_then_beside_sglang_is_what_sglangs_own_tree_gave_then(sgl, seed):
    """The sessions' memory at every past moment over the copy (``then``'s ``memory``), against
    the from-scratch attribution of SGLang's own tree and session marks (its mixin's
    ``_session_leaves``) after each op: tagged nodes, exclusive and shared bytes; SGLang's flush
    (a reset) at the end drops them all at once."""
    lines, replayer, cache, inproc, mirror, oracle, beside = copied(sgl, seed, "large")
    mirror.history.since = mirror.history.stores_since = 0

    def memory() -> dict[str, tuple[int, int, int]]:
        want = attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids,
                         set(cache._session_leaves), {}, 1, True)
        return {sid: row[2:5] for sid, row in want.sessions.items() if any(row[2:5])}

    then = [memory()]
    for line_no, op in _parse(lines):
        oracle.step(lambda line_no=line_no, op=op: replayer.apply(line_no, op), None)
        then.append(memory())
    oracle.step(cache.reset, None)
    then.append(memory())
    assert mirror.history.marks_since == 0 and then[-1] == {}
    moved = 0
    for k in range(0, len(then), 7):
        v = beside.then(float(k))
        got = {x.session_id: (x.tagged_nodes, x.exclusive_tokens, x.shared_tokens) for x in v.memory}
        assert v.memory_sessions == len(then[k]) and got == {sid: then[k][sid] for sid in got}, k
        assert all(x.exclusive_tokens_now == x.shared_tokens_now == 0 for x in v.memory)
        moved += bool(then[k])
    assert moved > 5 and any(e for k in range(len(then)) for _, e, _ in then[k].values())


def test_the_records_of_an_op_beside_sglang_are_told_at_one_instant(sgl):
    """The copy's clock moves on while it applies an op's records (each read of it a third of a
    millisecond later here): the op's marks and its changes are stamped at one instant, so a
    moment is the tree and the sessions' memory after one op, never the memory after an op beside
    the tree before it."""
    lines, replayer, cache, inproc, mirror, oracle, beside = copied(sgl, 1, "large")
    clock = [1000.0]

    def moving() -> float:
        clock[0] += 0.00035
        return clock[0]

    def memory() -> dict[str, tuple[int, int, int]]:
        want = attribute(cache.root_node, cache._session_leaves, cache._closed_session_ids,
                         set(cache._session_leaves), {}, 1, True)
        return {sid: row[2:5] for sid, row in want.sessions.items() if any(row[2:5])}

    mirror.history.clock = moving
    mirror.history.since = mirror.history.stores_since = mirror.history.marks_since = 0
    states, start = [(cache.evictable_size() + cache.protected_size(), memory())], clock[0]
    for line_no, op in _parse(lines):
        replayer.apply(line_no, op)
        mirror.apply(wire(oracle.recorder.take()))
        states.append((cache.evictable_size() + cache.protected_size(), memory()))
    mirror.history.clock = lambda: clock[0]
    told, moment, steps = 0, start, 0
    while moment < clock[0]:
        v = beside.then(moment)
        got = {x.session_id: (x.tagged_nodes, x.exclusive_tokens, x.shared_tokens) for x in v.memory}
        later = [j for j in range(told, len(states)) if states[j][0] == v.tokens_then and states[j][1] == got]
        assert later, (moment, v.tokens_then, got, states[told])
        told, moment, steps = later[0], moment + 0.0004, steps + 1
    assert told > len(states) // 2 and steps > 100 and len({st[0] for st in states}) > 20


def test_why_beside_sglang_never_names_a_removal_of_another_namespace(sgl):
    """SGLang keeps a LoRA's or a cache salt's prompts apart (``RadixKey.extra_key``: other nodes
    below the root, never shared). A prompt the default namespace never held, whose tokens another
    namespace held and lost, is a miss with nothing lost, not "evicted at T"; the same prompt
    cached and evicted in the default namespace names its eviction."""
    from tests.support.trace_gen import capacity_for

    lines = generate_trace(0, n_ops=20, max_in_flight=2, vocab=60)
    replayer, cache, inproc, recorder, mirror = recorded(sgl, lines, "large")
    mirror.apply(wire(recorder.snapshot()))
    beside = SGLangInProcessAdapter(mirror, model="tiny")
    prompt = [7, 8, 9, 10, 11, 12]
    for key in ("lora-a", None):
        replayer.begin(f"r-{key}", prompt, None, extra_key=key)
        replayer.finish(f"r-{key}", [13])
        replayer.evict(capacity_for(lines, "large"))  # (all of it: nothing runs)
        mirror.apply(wire(recorder.take()))
        answer = beside.why(prompt)
        assert answer.cached_tokens == 0, key
        if key == "lora-a":
            assert answer.lost == (), "a removal of lora-a's named for the default namespace's prompt"
        else:
            assert [(x.start, x.end, x.cause) for x in answer.lost] == [(0, len(prompt), EVICTED)]
