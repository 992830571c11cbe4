"""Differential tests: radixtop's cache against the REAL SGLang 0.5.16 RadixCache.

Every trace is replayed through radixtop (``gpu_backend.traces.ops.replay``) and through SGLang's own
``RadixCache`` + ``SessionRadixCacheMixin`` + ``TokenToKVPoolAllocator`` (``sglang_ref``), and the
two documents must be identical: one result per op, every tree node (path, size, lock_ref,
session holders) and the size stats. Both sides read a fresh tick counter instead of
``time.monotonic()``, so eviction order is deterministic (see ``sglang_ref.replay_sglang``).

These tests never skip: without an importable sglang they fail (CI installs it, .ci/).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from radixtop.gpu_backend.traces.ops import replay
from tests.on_sglang.ref.replay_sglang import SGLangUnavailableError, TickClock, import_sglang, replay_sglang
from tests.support.trace_gen import capacity_for, generate_trace, min_safe_capacity

pytestmark = pytest.mark.sglang

SEEDS = range(120)  # per capacity size, eviction policy "priority" (the server's required policy)
LRU_SEEDS = range(1000, 1020)
ABORT_SEEDS = range(2000, 2030)


@pytest.fixture(scope="session")
def sgl():
    """The SGLang modules, imported once per session (about 7 s). Fails, never skips."""
    try:
        return import_sglang()
    except SGLangUnavailableError as exc:
        pytest.fail(f"{exc}. Install it as .ci/ does; these tests must not be skipped.", pytrace=False)


# ----- running both sides -----


def run_radixtop(lines: list[str], capacity: int, policy: str) -> dict:
    doc = replay(lines, capacity, eviction_policy=policy, clock=TickClock())
    doc.pop("timing", None)
    return doc


def run_sglang(lines: list[str], capacity: int, policy: str, counters: dict | None = None) -> dict:
    return replay_sglang(lines, capacity, eviction_policy=policy, counters=counters)


def first_difference(lines: list[str], ours: dict, ref: dict) -> str | None:
    """A readable account of where two documents first differ, or None when they are equal."""
    if ours == ref:
        return None
    ops = [t for t in lines if t.strip() and not t.lstrip().startswith("#")]
    for i, (a, b) in enumerate(zip(ours["results"], ref["results"])):
        if a != b:
            return f"results differ first at op {i}: {ops[i]}\n  radixtop: {a}\n  sglang:   {b}"
    if len(ours["results"]) != len(ref["results"]):
        return f"result counts differ: radixtop {len(ours['results'])}, sglang {len(ref['results'])}"
    if ours["tree"] != ref["tree"]:
        paths_a = {tuple(r["path"]): r for r in ours["tree"]}
        paths_b = {tuple(r["path"]): r for r in ref["tree"]}
        for path in sorted(paths_a.keys() | paths_b.keys()):
            a, b = paths_a.get(path), paths_b.get(path)
            if a != b:
                return f"tree differs first at path {list(path)}:\n  radixtop: {a}\n  sglang:   {b}"
    return f"stats differ:\n  radixtop: {ours['stats']}\n  sglang:   {ref['stats']}"


def shrink(lines: list[str], differs: Callable[[list[str]], bool]) -> list[str]:
    """Greedy delta debugging: drop chunks of lines (a begin goes with its finish) while the
    trace still replays on both sides and still differs."""

    def without(current: list[str], drop: set[int]) -> list[str]:
        ids = {json.loads(current[i]).get("id") for i in drop if '"begin"' in current[i]}
        keep = []
        for i, text in enumerate(current):
            if i in drop:
                continue
            if ids and '"finish"' in text and json.loads(text).get("id") in ids:
                continue
            keep.append(text)
        return keep

    current = list(lines)
    chunk = max(1, len(current) // 2)
    while chunk >= 1:
        i, progressed = 0, False
        while i < len(current):
            candidate = without(current, set(range(i, min(i + chunk, len(current)))))
            if candidate != current and differs(candidate):
                current, progressed = candidate, True
            else:
                i += chunk
        if not progressed:
            chunk //= 2
    return current


def assert_same(lines: list[str], capacity: int, policy: str, label: str, counters: dict | None = None) -> None:
    ref = run_sglang(lines, capacity, policy, counters)
    ours = run_radixtop(lines, capacity, policy)
    diff = first_difference(lines, ours, ref)
    if diff is None:
        return

    def differs(candidate: list[str]) -> bool:
        try:
            return run_sglang(candidate, capacity, policy) != run_radixtop(candidate, capacity, policy)
        except Exception:
            return False

    small = shrink(lines, differs)
    small_diff = first_difference(small, run_radixtop(small, capacity, policy), run_sglang(small, capacity, policy))
    pytest.fail(
        f"{label} (capacity {capacity}, eviction policy {policy!r}): radixtop and SGLang disagree.\n"
        f"{diff}\n\nshrunk to {len(small)} lines (same capacity):\n" + "\n".join(small)
        + f"\n{small_diff}",
        pytrace=False,
    )


def trace_for(seed: int) -> list[str]:
    """Traces of varied length, concurrency and vocabulary (every 4th: a tiny vocabulary, so
    unrelated requests share first tokens and nodes split all the time)."""
    return generate_trace(
        seed,
        n_ops=60 + (seed * 53) % 240,
        max_in_flight=2 + seed % 5,
        vocab=6 if seed % 4 == 3 else 400,
    )


# ----- generated traces -----


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", SEEDS)
def test_generated_trace_priority(sgl, seed, size):
    lines = trace_for(seed)
    assert_same(lines, capacity_for(lines, size), "priority", f"seed {seed}, {size} capacity")


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", ABORT_SEEDS)
def test_generated_trace_with_aborts(sgl, seed, size):
    # abort = SGLang's retract path: cache_finished_req(is_insert=False), which still tags an
    # open session through match_prefix.
    lines = generate_trace(seed, n_ops=200, max_in_flight=4, vocab=6 if seed % 2 else 400, abort_weight=6)
    assert any('"abort"' in line for line in lines)
    assert_same(lines, capacity_for(lines, size), "priority", f"seed {seed} with aborts, {size} capacity")


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", LRU_SEEDS)
def test_generated_trace_lru(sgl, seed, size):
    # (A server refuses --enable-session-radix-cache without the priority policy; the cache
    # classes themselves take any policy, and with every priority 0 the two must agree anyway.)
    lines = trace_for(seed)
    assert_same(lines, capacity_for(lines, size), "lru", f"seed {seed}, {size} capacity")


def test_generated_traces_exercise_everything(sgl):
    """The corpus above really does split nodes, evict on allocation (a lot with the small pool,
    rarely with the large one), close in every way, and finish requests after their close."""
    small: dict[str, int] = {}
    large: dict[str, int] = {}
    traces_evicting = {"small": 0, "large": 0}
    kinds = dict.fromkeys(
        ["unknown_close", "repeat_close", "finish_after_own_close", "reopen", "turn_on_closed",
         "empty_input", "in_flight_at_end"], 0,
    )
    for seed in SEEDS:
        lines = trace_for(seed)
        for size, counters in (("small", small), ("large", large)):
            before = counters.get("alloc_evictions", 0)
            run_sglang(lines, capacity_for(lines, size), "priority", counters)
            traces_evicting[size] += counters["alloc_evictions"] > before
        seen, closed, running, closed_under = set(), set(), {}, set()
        for op in map(json.loads, lines):
            sid = op.get("session")
            if op["op"] == "close":
                kinds["unknown_close"] += sid not in seen
                kinds["repeat_close"] += sid in closed
                closed.add(sid)
                seen.add(sid)
                closed_under |= {rid for rid, owner in running.items() if owner == sid}
            elif op["op"] == "register":
                kinds["reopen"] += sid in closed
                closed.discard(sid)
                seen.add(sid)
            elif op["op"] in ("begin", "request"):
                kinds["empty_input"] += not op["input"]
                kinds["turn_on_closed"] += sid in closed
                seen.add(sid)
                if op["op"] == "begin":
                    running[op["id"]] = sid
            elif op["op"] == "finish":
                running.pop(op["id"])
                kinds["finish_after_own_close"] += op["id"] in closed_under
        kinds["in_flight_at_end"] += bool(running)
    n = len(SEEDS)
    assert small["splits"] > 10 * n, small
    assert traces_evicting["small"] >= 0.9 * n, traces_evicting
    assert small["alloc_evictions"] > 0.1 * small["allocs"], small
    assert 0 < large["alloc_evictions"] < 0.02 * large["allocs"], large
    assert all(v >= 20 for v in kinds.values()), kinds


def test_min_safe_capacity_is_tight(sgl):
    """One slot less than the safe minimum can run out on some traces (so "small" is really small),
    while the minimum itself never does (every test above replays at it)."""
    ran_out = 0
    for seed in range(40):
        lines = trace_for(seed)
        try:
            run_sglang(lines, min_safe_capacity(lines) - 1, "priority")
        except Exception:
            ran_out += 1
    assert ran_out > 0


# ----- directed examples -----


def _lines(*ops: dict) -> list[str]:
    return [json.dumps(op) for op in ops]


def test_two_sessions_share_a_prefix(sgl):
    """The session mixin's own rule (a node shared by several sessions is freed only when its last
    holder closes), on two sessions over one system prompt, through both sides."""
    prompt = list(range(100, 116))
    lines = _lines(
        {"op": "request", "input": prompt + [1, 2, 3], "output": [4, 5], "session": "A"},
        {"op": "request", "input": prompt + [7, 8], "output": [9], "session": "B"},
        {"op": "close", "session": "A"},  # A's own tokens go; the shared prompt stays for B
        {"op": "request", "input": prompt + [7, 8, 9, 10], "output": [], "session": None},
        {"op": "close", "session": "B"},  # B's leaf, then the prompt: B was its last holder
    )
    ref = run_sglang(lines, 64, "priority")
    assert_same(lines, 64, "priority", "two sessions sharing a prompt")
    assert [r.get("freed_nodes") for r in ref["results"]] == [None, None, 1, None, 0]
    # (after the plain request, B's node has an unheld child: B's close stops there)
    assert ref["results"][3]["hit"] == len(prompt) + 3
    assert {tuple(r["path"][16:]): r["holders"] for r in ref["tree"]} == {
        (): [], (7, 8, 9): [], (7, 8, 9, 10): [],
    }

    lines = _lines(
        {"op": "request", "input": prompt + [1, 2, 3], "output": [4, 5], "session": "A"},
        {"op": "request", "input": prompt + [7, 8], "output": [9], "session": "B"},
        {"op": "close", "session": "A"},
        {"op": "close", "session": "B"},
    )
    ref = run_sglang(lines, 64, "priority")
    assert_same(lines, 64, "priority", "two sessions sharing a prompt, closed in turn")
    assert ref["results"][2] == {"op": "close", "freed_nodes": 1, "freed_tokens": 5}
    assert ref["results"][3] == {"op": "close", "freed_nodes": 2, "freed_tokens": 3 + len(prompt)}
    assert ref["tree"] == [] and ref["stats"]["available_size"] == 64

    # Both sessions end on the very same node: one node, two holders (B's match split the
    # prompt off A's node, so the close frees that node and then the unheld prompt above it).
    lines = _lines(
        {"op": "request", "input": prompt, "output": [1], "session": "A"},
        {"op": "request", "input": prompt, "output": [1], "session": "B"},
        {"op": "close", "session": "A"},
        {"op": "close", "session": "B"},
    )
    ref = run_sglang(lines, 64, "priority")
    assert_same(lines, 64, "priority", "two sessions on one node")
    assert ref["results"][2]["freed_nodes"] == 0
    assert ref["results"][3] == {"op": "close", "freed_nodes": 2, "freed_tokens": len(prompt) + 1}


def test_finish_after_close_and_reopen(sgl):
    base = [
        {"op": "begin", "id": "r1", "input": [1, 2, 3, 4], "session": "s"},
        {"op": "close", "session": "s"},
        {"op": "finish", "id": "r1", "output": [5, 6]},  # s is closed: its finish does not tag
        {"op": "close", "session": "ghost"},  # never seen
        {"op": "close", "session": "s"},  # already closed
    ]
    reopen = [
        {"op": "register", "session": "s"},  # clears the tombstone: s tags again
        {"op": "request", "input": [1, 2, 3, 4, 5, 6, 7], "output": [8], "session": "s"},
    ]
    close = [{"op": "close", "session": "s"}]

    lines = _lines(*base)
    ref = run_sglang(lines, 32, "priority")
    assert_same(lines, 32, "priority", "finish after close")
    assert ref["tree"] == [{"path": [1, 2, 3, 4, 5, 6], "tokens": 6, "lock_ref": 0, "holders": []}]
    assert [r.get("freed_tokens") for r in ref["results"]] == [None, 0, None, 0, 0]

    lines = _lines(*base, *reopen)
    ref = run_sglang(lines, 32, "priority")
    assert_same(lines, 32, "priority", "finish after close, then reopen")
    assert [r["holders"] for r in ref["tree"]] == [[], ["s"]]

    # The close walks up from s's node and also frees the unheld parent (an evictable leaf by then).
    lines = _lines(*base, *reopen, *close)
    ref = run_sglang(lines, 32, "priority")
    assert_same(lines, 32, "priority", "finish after close, reopen, close")
    assert ref["results"][-1] == {"op": "close", "freed_nodes": 2, "freed_tokens": 8}
    assert ref["tree"] == []


@pytest.mark.parametrize("later_closes, tags_again", [(8191, False), (8192, True)])
def test_tombstone_bound(sgl, later_closes, tags_again):
    """The closed-session guard remembers the last 8192 closes: a finish that comes after 8192
    later closes tags its (closed) session again, on both sides."""
    lines = _lines(
        {"op": "begin", "id": "late", "input": [1, 2, 3], "session": "old"},
        {"op": "close", "session": "old"},
        *({"op": "close", "session": f"g{i}"} for i in range(later_closes)),
        {"op": "finish", "id": "late", "output": [4]},
    )
    ref = run_sglang(lines, 16, "priority")
    assert_same(lines, 16, "priority", f"{later_closes} closes after 'old'")
    assert ref["tree"][0]["holders"] == (["old"] if tags_again else [])


def test_evict_respects_locks_and_lru(sgl):
    lines = _lines(
        {"op": "request", "input": [1, 2, 3], "output": [4], "session": None},
        {"op": "request", "input": [5, 6], "output": [7], "session": None},
        {"op": "begin", "id": "hold", "input": [1, 2, 9], "session": None},  # locks [1, 2]
        {"op": "request", "input": [8], "output": [9, 10], "session": None},
        {"op": "evict", "tokens": 4},  # [5,6,7] then [3,4] (oldest first); [1,2] is locked
        {"op": "evict", "tokens": 100},
        {"op": "finish", "id": "hold", "output": []},
    )
    ref = run_sglang(lines, 12, "priority")
    assert_same(lines, 12, "priority", "evict order with a lock")
    assert [r.get("evicted_tokens") for r in ref["results"][4:6]] == [5, 3]
    assert [r["path"] for r in ref["tree"]] == [[1, 2], [1, 2, 9]]


def test_sglang_side_reads_the_tick_clock(sgl):
    """The patch reaches SGLang's radix tree (its stamps are ticks, not monotonic seconds) and is
    undone afterwards."""
    import time

    from tests.on_sglang.ref.replay_sglang import SGLangReplayer, deterministic_clock

    with deterministic_clock(sgl) as clock:
        replayer = SGLangReplayer(sgl, 16, max_running=1, max_context_len=8)
        replayer.apply(1, {"op": "request", "input": [1, 2], "output": [3], "session": None})
        (node,) = replayer.cache.root_node.children.values()
        assert 0 < node.last_access_time <= clock.ticks < 100
    assert sgl.radix_cache_module.time is time
