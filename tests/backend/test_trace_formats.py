"""Public traces (Mooncake, kv-cache-tester) read, turned into ops, replayed with figures and played
in real time; on small real excerpts (tests/data/README.md) and on hand-made lines."""

from __future__ import annotations

import json
import time

import pytest

from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.kv_geometry import get_geometry
from radixtop.gpu_backend.scheduler import Scheduler
from radixtop.gpu_backend.traces.compare import compare, parse_capacity, replay_figures
from radixtop.gpu_backend.traces.formats import (
    TraceFormatError,
    load_trace,
    read_kv_cache_tester,
    read_mooncake,
    timed_ops,
)
from radixtop.gpu_backend.traces.ops import TraceError, read_trace
from radixtop.gpu_backend.traces.playback import MAX_OPS_PER_STEP, TracePlayback
from tests.support import REPO

DATA = REPO / "tests" / "data"
MOONCAKE = DATA / "mooncake_conversation_excerpt.jsonl"
TESTER = DATA / "kv_cache_tester"
ORIGINAL_LINES = [*range(1, 21), 22, 25, 63, 67, 134, 219, 221, 281, 290, 324, 430, 458, 796, 854, 1008, 1288, 1325]
"""The excerpt's lines, as line numbers of the full conversation_trace.jsonl."""
TINY = get_geometry("tiny")


def _sub_agents_shared_blocks() -> int:
    """How many leading hash ids the first requests of trace_0291's two sub-agents share."""
    entries = json.loads((TESTER / "trace_0291.json").read_text())["requests"]
    a, b = (e["requests"][0]["hash_ids"] for e in entries if e.get("type") == "subagent")
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


SUB_AGENTS_SHARED_BLOCKS = _sub_agents_shared_blocks()


def mooncake_line(t: int, hash_ids: list[int], n_in: int | None = None, n_out: int = 4) -> str:
    n_in = len(hash_ids) * 512 if n_in is None else n_in
    return json.dumps({"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": hash_ids})


def sessions_by_line(trace) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for line, req in zip(ORIGINAL_LINES, trace.requests):
        groups.setdefault(req.session, []).append(line)
    return groups


# ----- Mooncake -----


def test_mooncake_excerpt_sessions_are_the_conversations_that_extend_each_other():
    trace = load_trace(MOONCAKE, "mooncake")
    assert len(trace.requests) == 37 and trace.block_size == 512
    multi = sorted(lines for lines in sessions_by_line(trace).values() if len(lines) > 1)
    assert multi == [[22, 219, 458], [25, 221, 854, 1288], [63, 290, 796, 1008, 1325], [67, 134, 281]]
    assert trace.sessions == 37 - 2 - 3 - 4 - 2
    # Lines 324 and 430 share 30 and 22 leading blocks with lines 8 and 7 but do not extend them.
    groups = sessions_by_line(trace)
    assert [324] in groups.values() and [430] in groups.values()
    assert trace.requests[ORIGINAL_LINES.index(1288)].t == pytest.approx(json.loads(
        MOONCAKE.read_text().splitlines()[ORIGINAL_LINES.index(1288)])["timestamp"] / 1000)


@pytest.mark.parametrize(
    ("second", "continues"),
    [
        ([0, 1, 2, 3, 4], True),  # extends the whole first request
        ([0, 1, 2, 9, 8], True),  # extends all but its last (partial) block
        ([0, 1, 9, 8], False),  # shares two blocks only: the first request had four
        ([0, 7, 8], False),  # shares the one block every request starts with
        ([0, 1, 2, 3], True),  # the same prompt again
    ],
)
def test_mooncake_continuation_rule(second, continues):
    trace = read_mooncake([mooncake_line(0, [0, 1, 2, 3]), mooncake_line(1000, second)])
    first, then = trace.requests
    assert (then.session == first.session) is continues


def test_mooncake_continues_the_latest_request_that_it_extends():
    trace = read_mooncake([
        mooncake_line(0, [0, 1, 2]),
        mooncake_line(1, [0, 5, 6]),
        mooncake_line(2, [0, 1, 2, 3, 4]),  # continues the first
        mooncake_line(3, [0, 1, 2, 3, 4, 7]),  # continues the third, so the first's session
    ])
    assert [r.session for r in trace.requests] == ["m1", "m2", "m1", "m1"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: a Mooncake request must be a JSON object"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1}', "line 2: missing field 'hash_ids'"),
        ('{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": []}',
         "line 2: field 'input_length' must be a non-negative integer"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}',
         "line 2: field 'hash_ids' must be a list of non-negative integers"),
        ('{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": []}',
         "line 2: field 'timestamp' must be a non-negative number"),
        ('{"input_length": 5, "output_length": 1, "hash_ids": []}', "line 2: missing field 'timestamp'"),
    ],
)
def test_mooncake_malformed_lines_are_named(line, message):
    with pytest.raises(TraceFormatError) as caught:
        read_mooncake([mooncake_line(0, [0]), line])
    assert str(caught.value).startswith(message)


def test_a_hash_id_is_one_fixed_run_of_tokens_and_scale_shrinks_it():
    trace = read_mooncake([
        mooncake_line(0, [0, 1, 2], n_in=2 * 512 + 100, n_out=16),  # the last block is partial
        mooncake_line(5, [0, 1, 3], n_out=8),
        mooncake_line(9, [4, 1], n_out=8),  # id 1 at another position: still id 1's run
    ])
    ops = [t.op for t in timed_ops(trace, scale=8)]
    requests = [op for op in ops if op.op == "request"]
    a, b, c = (op.fields["input"] for op in requests)
    assert len(a) == 64 + 64 + 13 and len(b) == 3 * 64 and len(c) == 128  # ceil(100 / 8) = 13
    assert a[:128] == b[:128] and a[128:] != b[128:141]  # ids 2 and 3 differ
    assert b[128:] != a[:64] and c[64:] == a[64:128] and c[:64] not in (a[:64], b[128:])
    outputs = [op.fields["output"] for op in requests]
    assert [len(o) for o in outputs] == [2, 1, 1]
    everything = [t for op in requests for t in op.fields["output"]]
    assert not set(everything) & set(a + b + c) and len(set(everything)) == len(everything)
    with pytest.raises(ValueError, match="--scale 3 does not divide the trace's 512-token blocks"):
        list(timed_ops(trace, scale=3))


def test_every_session_is_closed_once_right_after_its_last_request():
    trace = load_trace(MOONCAKE, "mooncake")
    ops = [t.op for t in timed_ops(trace, scale=16)]
    closes = [i for i, op in enumerate(ops) if op.op == "close"]
    assert len(closes) == trace.sessions == len({ops[i].fields["session"] for i in closes})
    for i in closes:
        session = ops[i].fields["session"]
        assert ops[i - 1].op == "request" and ops[i - 1].fields["session"] == session
        assert not any(op.fields.get("session") == session for op in ops[i + 1 :])
    assert not any(op.op == "close" for op in (t.op for t in timed_ops(trace, 16, close_sessions=False)))


def test_reuse_counts_the_tokens_a_sessions_previous_request_had():
    trace = read_mooncake([mooncake_line(0, [0, 1, 2], n_in=2 * 512 + 100), mooncake_line(5, [0, 1, 3, 4])])
    first, second = (t.op for t in timed_ops(trace, scale=1) if t.op.op == "request")
    assert first.fields["reuse"] == 0 and second.fields["reuse"] == 2 * 512


# ----- kv-cache-tester -----


def test_kv_cache_tester_sessions_are_the_files_and_their_sub_agents():
    trace = load_trace(TESTER, "kv-cache-tester")
    assert trace.block_size == 64
    by_session: dict[str, list[float]] = {}
    for r in trace.requests:
        by_session.setdefault(r.session, []).append(r.t)
    assert sorted(by_session) == ["trace_0277", "trace_0291", "trace_0291/agent_001", "trace_0291/agent_002"]
    assert by_session["trace_0291/agent_001"] == [pytest.approx(1148.013), pytest.approx(1153.013),
                                                  pytest.approx(1159.013)]  # 1148.013 + its own t
    assert [len(v) for k, v in sorted(by_session.items())] == [2, 4, 3, 3]
    assert [r.t for r in trace.requests] == sorted(r.t for r in trace.requests)


def test_local_scope_keeps_two_traces_ids_apart_and_sub_agents_share_their_parents():
    trace = load_trace(TESTER, "kv-cache-tester")
    firsts = {}
    for t in timed_ops(trace, scale=8):
        if t.op.op == "begin" and t.op.fields["session"] not in firsts:
            firsts[t.op.fields["session"]] = t.op.fields["input"]
    # Both files start with hash ids 1, 2, 3...; local scope: different tokens.
    assert firsts["trace_0277"][:8] != firsts["trace_0291"][:8]
    # The two sub-agents start with the same blocks (ids 1584...) in their parent's scope.
    shared = SUB_AGENTS_SHARED_BLOCKS * 8
    assert firsts["trace_0291/agent_001"][:shared] == firsts["trace_0291/agent_002"][:shared]
    assert firsts["trace_0291/agent_001"][shared] != firsts["trace_0291/agent_002"][shared]
    glob = [(name, json.dumps({**json.loads((TESTER / name).read_text()), "hash_id_scope": "global"}))
            for name in ("trace_0277.json", "trace_0291.json")]
    same = {}
    for t in timed_ops(read_kv_cache_tester(glob), scale=8):
        if t.op.op == "begin":
            same.setdefault(t.op.fields["session"], t.op.fields["input"])
    assert same["trace_0277"][:8] == same["trace_0291"][:8]


def test_api_time_runs_a_request_but_never_past_its_sessions_next():
    trace = load_trace(TESTER, "kv-cache-tester")
    parent = [r for r in trace.requests if r.session == "trace_0291"]
    raw = json.loads((TESTER / "trace_0291.json").read_text())["requests"]
    assert parent[0].duration == pytest.approx(raw[0]["api_time"])  # 10.02 s, next at 19 s
    assert parent[-1].duration == pytest.approx(raw[3]["api_time"])
    for a, b in zip(parent, parent[1:]):
        assert a.t + a.duration <= b.t
    ops = [t.op for t in timed_ops(trace, scale=8)]
    order = [(op.op, op.fields.get("id")) for op in ops if op.op in ("begin", "finish")]
    rids = [rid for kind, rid in order if kind == "begin" and rid.startswith("trace_0291#")]
    for k, rid in enumerate(rids[:-1]):  # each turn finishes before the next one begins
        assert order.index(("finish", rid)) < order.index(("begin", rids[k + 1]))
    times = [t.t for t in timed_ops(trace, scale=8)]
    assert times == sorted(times)


def edited_tester_doc(**changes) -> str:
    doc = json.loads((TESTER / "trace_0291.json").read_text())
    for path, value in changes.items():
        target = doc
        *parts, last = path.split("__")
        for p in parts:
            target = target[int(p) if p.isdigit() else p]
        if value is None:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"requests__2__in": None}, "requests[2]: missing field 'in'"),
        ({"requests__1__hash_ids": "abc"}, "requests[1]: field 'hash_ids' must be a list of non-negative"),
        ({"requests__5__requests__1__out": -1}, "requests[5].requests[1]: field 'out' must be a non-negative"),
        ({"requests__4__requests": None}, "requests[4]: missing field 'requests'"),
        ({"requests__0__t": None}, "requests[0]: missing field 't'"),
        ({"hash_id_scope": "galactic"}, "unknown hash_id_scope 'galactic'"),
        ({"block_size": 0}, "field 'block_size' must be a positive integer"),
        ({"requests": None}, "not a kv-cache-tester trace"),
    ],
)
def test_kv_cache_tester_malformed_fields_are_named(changes, message):
    with pytest.raises(TraceFormatError) as caught:
        read_kv_cache_tester([("t.json", edited_tester_doc(**changes))])
    assert str(caught.value) == f"t.json: {message}" or str(caught.value).startswith(f"t.json: {message}")


def test_kv_cache_tester_files_with_other_block_sizes_are_refused():
    with pytest.raises(TraceFormatError, match="b.json: block_size 32 differs from the other traces' 64"):
        read_kv_cache_tester([("a.json", edited_tester_doc()), ("b.json", edited_tester_doc(block_size=32))])
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        read_kv_cache_tester([("a.json", "{")])


# ----- replay with figures, and comparisons -----


def test_eviction_costs_hits_and_shows_as_lost_tokens():
    trace = load_trace(MOONCAKE, "mooncake")
    big, _ = replay_figures((t.op for t in timed_ops(trace, 8)), TINY, 2**20)
    small, _ = replay_figures((t.op for t in timed_ops(trace, 8)), TINY, 6144)
    assert big.requests == small.requests == 37
    assert big.refused == 0 and small.refused == 1  # line 12: 87,169 tokens, 10,897 at scale 8
    assert big.evicted_tokens == 0 and big.lost_tokens == 0
    assert small.evicted_tokens > 0 and small.lost_tokens > 0
    assert small.cached_tokens < big.cached_tokens
    assert big.peak_used_tokens > 6144 >= small.peak_used_tokens
    # With room for everything, a session's requests hit at least what its previous turn had.
    for figures in big.sessions.values():
        assert figures.cached_tokens >= figures.reuse_tokens
    assert sum(s.reuse_tokens for s in big.sessions.values()) > 0
    assert big.close_freed_tokens == sum(s.close_freed_tokens for s in big.sessions.values()) > 0
    assert big.stats["total_size"] == 0  # every session closed: the free policy freed all of it


def test_a_request_too_large_for_the_pool_is_refused_and_the_replay_goes_on():
    trace = read_mooncake([mooncake_line(0, [0, 1, 2, 3]), mooncake_line(1, [0, 9])])
    figures, results = replay_figures((t.op for t in timed_ops(trace, 1)), TINY, 1536, keep_results=True)
    assert figures.requests == 2 and figures.refused == 1 and figures.prompt_tokens == 1024
    assert results[0] == {"op": "request", "hit": 0, "refused": True}
    assert results[2]["op"] == "request" and "refused" not in results[2]


def test_a_turn_after_a_refused_one_has_nothing_to_lose():
    trace = read_mooncake([mooncake_line(0, [0, 1]), mooncake_line(1, [0, 1, 2], n_out=5000),
                           mooncake_line(2, [0, 1, 2, 3])])
    ops = [t.op for t in timed_ops(trace, 1, close_sessions=False)]
    assert [op.fields["reuse"] for op in ops] == [0, 1024, 1536]
    figures, _ = replay_figures(ops, TINY, 4096)  # the second's 5,000 output tokens never fit: retracted
    (session,) = figures.sessions.values()
    assert session.refused == 1 and session.cached_tokens == 1024 + 1024
    # The third turn misses the second's third block, which was never cached: not a loss.
    assert session.reuse_tokens == 1024 and session.lost_tokens == 0


def test_deref_close_keeps_what_the_next_sub_agent_reuses():
    trace = load_trace(TESTER, "kv-cache-tester")
    free, deref = compare(lambda: (t.op for t in timed_ops(trace, 8)), TINY, [2**20], ["lru"], ["free", "deref"])
    # agent_002 starts after agent_001 closed; both begin with the same blocks.
    assert deref.sessions["trace_0291/agent_002"].cached_tokens == (
        free.sessions["trace_0291/agent_002"].cached_tokens + SUB_AGENTS_SHARED_BLOCKS * 8)
    assert free.close_freed_tokens > 0 and deref.close_freed_tokens == 0


def test_compare_runs_every_combination_and_is_reproducible():
    trace = load_trace(MOONCAKE, "mooncake")
    runs = compare(lambda: (t.op for t in timed_ops(trace, 8)), TINY, [4096, 8192], ["lru", "lfu"], ["free"])
    assert [(r.settings["capacity"], r.settings["eviction_policy"]) for r in runs] == [
        (4096, "lru"), (4096, "lfu"), (8192, "lru"), (8192, "lfu")]
    again = compare(lambda: (t.op for t in timed_ops(trace, 8)), TINY, [4096, 8192], ["lru", "lfu"], ["free"])
    strip = lambda r: {k: v for k, v in r.as_dict().items() if k != "ops_s"}  # noqa: E731
    assert [strip(r) for r in runs] == [strip(r) for r in again]
    assert runs[0].evicted_tokens >= runs[2].evicted_tokens


@pytest.mark.parametrize(
    "line",
    ['{"op":"finish","id":"ghost","output":[1]}', '{"op":"abort","id":"ghost"}'],
)
def test_a_figures_replay_of_radixtop_ops_names_an_unknown_request(line):
    with pytest.raises(TraceError, match="line 1: request 'ghost' is not running"):
        replay_figures(read_trace([line]), TINY, 64)


def test_a_refused_begin_skips_its_finish_and_its_abort():
    ops = read_trace(['{"op":"begin","id":"a","input":[1,2,3,4,5,6,7,8,9]}', '{"op":"finish","id":"a","output":[]}',
                      '{"op":"begin","id":"b","input":[1,2,3,4,5,6,7,8,9]}', '{"op":"abort","id":"b"}',
                      '{"op":"request","input":[1,2],"output":[3]}'])
    figures, results = replay_figures(ops, TINY, 8, keep_results=True)
    assert figures.refused == 2 and figures.requests == 3 and figures.output_tokens == 1
    assert [r.get("refused", False) for r in results] == [True, True, True, False, False]


@pytest.mark.parametrize(("text", "tokens"), [("65536", 65536), ("64k", 65536), ("2M", 2 * 2**20), (" 16k ", 16384)])
def test_parse_capacity(text, tokens):
    assert parse_capacity(text) == tokens


@pytest.mark.parametrize("text", ["0", "", "k", "-5", "1.5k", "12q"])
def test_parse_capacity_refuses(text):
    with pytest.raises(ValueError, match="not a positive number of tokens"):
        parse_capacity(text)


# ----- real time -----


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_playback_starts_each_op_when_its_time_comes_at_speed():
    trace = read_mooncake([mooncake_line(0, [0, 1]), mooncake_line(4000, [0, 2]), mooncake_line(10_000, [0, 3])])
    clock = FakeClock()
    playback = TracePlayback(timed_ops(trace, 8), speed=2.0, clock=clock)
    first = playback.step()
    assert [a.kind for a in first] == ["begin", "finish", "close"]  # a request: begin and its finish
    assert first[0].rid == first[1].rid and first[0].input_ids and first[1].output_ids
    clock.now += 1.9  # 3.8 s of trace
    assert playback.step() == []
    clock.now += 0.1  # 4 s
    assert [a.kind for a in playback.step()] == ["begin", "finish", "close"]
    clock.now += 3.0  # 10 s
    assert len(playback.step()) == 3 and playback.done and playback.trace_time() == pytest.approx(10.0)


def test_playback_catches_up_a_bounded_number_of_ops_per_step():
    lines = [mooncake_line(0, [0, i + 1]) for i in range(MAX_OPS_PER_STEP * 2)]
    playback = TracePlayback(timed_ops(read_mooncake(lines), 8), clock=FakeClock())
    sizes = [len(playback.step()) for _ in range(5)]
    assert sizes[0] <= 3 * MAX_OPS_PER_STEP and sum(sizes) == 2 * MAX_OPS_PER_STEP * 3 and playback.done


def test_the_engine_plays_a_trace_to_its_end():
    trace = load_trace(TESTER, "kv-cache-tester")
    scheduler = Scheduler(TINY, 1 << 17, device="meta")
    playback = TracePlayback(timed_ops(trace, 8), speed=20_000.0)
    engine = Engine(scheduler, playback, step_interval=0.001).start()
    try:
        deadline = time.monotonic() + 60
        while not (playback.done and engine.call(lambda s: not s.running)):
            assert time.monotonic() < deadline and engine.alive
            time.sleep(0.05)
        assert engine.requests_finished == len(trace.requests) == 12
        stats = engine.call(lambda s: (s.closes, s.prompt_tokens, s.cached_tokens, s.stats().total_size))
        assert stats[0] == 4 and stats[1] > stats[2] > 0 and stats[3] == 0
    finally:
        engine.stop()
