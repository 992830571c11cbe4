"""The real SGLang 0.5.23 RadixCache and UnifiedRadixCache, driven on CPU (tests/on_sglang/ref/drive23.py).

These pin down the 0.5.23 behaviour radixtop's in-process adapter has to read: prefix sharing,
session tags on the FULL component (``session_ids`` on frontier nodes, ``session_ref`` counts on
the path), close as a pure dereference (``release_radix_session`` returns 0 and frees nothing),
eviction that takes session-held nodes last, and the tombstone for in-flight requests.

They need sglang 0.5.23 (``.ci/setup-sglang23`` builds ``.venv-sglang23``; run
``.venv-sglang23/bin/python -m pytest tests/on_sglang23/test_drive23.py -q``). With any other sglang
(the main ``.venv`` has 0.5.16) or none, the whole module is skipped.
"""

from __future__ import annotations

import pytest

from tests.support.engines import SGLANG_VERSION

if SGLANG_VERSION != "0.5.23":  # tests/conftest.py collects this file only beside 0.5.23
    raise RuntimeError(f"needs sglang 0.5.23 (found {SGLANG_VERSION}): run it with .venv-sglang23 "
                       "(.ci/setup-sglang23), as .ci/test does")

from tests.on_sglang.ref import drive23  # noqa: E402

pytestmark = pytest.mark.sglang


def rows_by_path(cache) -> dict[tuple[int, ...], dict]:
    return {tuple(r["path"]): r for r in drive23.tree_rows(cache)}


def reconciles(cache, pools) -> dict[str, int]:
    s = drive23.stats(cache, pools)
    assert s["available"] + s["evictable"] + s["protected"] + s["owned"] == s["capacity"]
    assert s["owned"] >= 0
    return s


@pytest.fixture(scope="module")
def sgl():
    try:
        return drive23.import_sglang23()
    except drive23.SGLang23UnavailableError as exc:  # pragma: no cover - a broken install
        pytest.fail(str(exc))


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_cache_shares_prefixes_locks_and_evicts(sgl, page_size):
    cache, pools = drive23.build_radix_cache23(64, page_size=page_size)
    assert type(cache).__name__ == "RadixCache"
    assert cache.release_radix_session("nobody") is None  # BasePrefixCache's no-op
    assert drive23.stats(cache, pools)["bytes_per_token"] == 2 * 2 * (4 + 4) * 2

    first = drive23.run_request(cache, pools, list(range(1, 9)), [50, 51, 52])
    assert first.prefix_len == 0 and first.kv_len == 8 + 2  # the last output has no KV
    second = drive23.run_request(cache, pools, [1, 2, 3, 4, 9, 9, 9, 9], [60])
    assert second.prefix_len == 4  # shares the first page / first 4 tokens
    s = reconciles(cache, pools)
    assert s["owned"] == 0 and s["protected"] == 0 and s["evictable"] > 0
    rows = rows_by_path(cache)
    assert (1, 2, 3, 4) in rows and rows[(1, 2, 3, 4)]["lock_ref"] == 0
    assert rows[(1, 2, 3, 4, 9, 9, 9, 9)]["slots"] is not None

    # A running request locks its matched path: protected, not evictable.
    req = drive23.begin_request(cache, pools, list(range(1, 9)) + [70, 71])
    running = reconciles(cache, pools)
    assert running["protected"] == 8 and running["owned"] > 0
    assert rows_by_path(cache)[(1, 2, 3, 4)]["lock_ref"] == 1
    drive23.finish_request(cache, pools, req, [72])
    assert reconciles(cache, pools)["protected"] == 0

    evictable = cache.evictable_size()
    assert drive23.evict(cache, evictable) == evictable
    after = reconciles(cache, pools)
    assert after["evictable"] == 0 and after["available"] == after["capacity"]
    assert drive23.tree_rows(cache) == []


def test_unified_cache_picks_the_python_core_for_sessions(sgl):
    cache, _ = drive23.build_unified_cache23(32, enable_session_radix_cache=True,
                                             tree_core_backend="rust")
    assert cache._tree_core_backend == "python"  # sessions force the Python TreeCore
    assert type(cache.tree_core).__name__ == "UnifiedTreeCore"
    assert cache.root_node is cache.tree_core.root_node


def test_unified_rust_core_has_no_python_nodes(sgl):
    cache, pools = drive23.build_unified_cache23(32, enable_session_radix_cache=False,
                                                 tree_core_backend="rust")
    assert cache._tree_core_backend == "rust", "0.5.23's wheel ships the Rust TreeCore; it must load here"
    drive23.run_request(cache, pools, [1, 2, 3, 4], [5, 6])
    assert cache.evictable_size() == 5
    assert isinstance(cache.root_node_handle(), int)  # NodeId handles only
    with pytest.raises(NotImplementedError):
        cache.root_node  # noqa: B018


def test_unified_sessions_tag_frontier_nodes_and_count_refs(sgl):
    cache, pools = drive23.build_unified_cache23(64)
    drive23.run_request(cache, pools, list(range(1, 9)), [50, 51], session_id="A")
    drive23.run_request(cache, pools, [1, 2, 3, 4, 9, 9, 9, 9], [60], session_id="B")
    rows = rows_by_path(cache)
    shared = rows[(1, 2, 3, 4)]
    assert shared["session_ref"] == 2 and shared["session_ids"] == []
    a_leaf = rows[tuple(range(1, 9)) + (50,)]
    assert a_leaf["session_ids"] == ["A"] and a_leaf["session_ref"] == 1
    assert rows[(1, 2, 3, 4, 9, 9, 9, 9)]["session_ids"] == ["B"]
    assert [n.id for n in drive23.session_leaves(cache, "A")] == [a_leaf["id"]]

    # A later turn of A extends the path: the frontier moves, refs are not double counted.
    drive23.run_request(cache, pools, list(range(1, 9)) + [50, 51, 52], [53], session_id="A")
    rows = rows_by_path(cache)
    assert rows[tuple(range(1, 9)) + (50,)]["session_ids"] == []
    assert rows[tuple(range(1, 9)) + (50, 51, 52)]["session_ids"] == ["A"]
    assert rows[(1, 2, 3, 4)]["session_ref"] == 2
    assert all(r["session_ref"] == 1 for p, r in rows.items() if p[:5] == (1, 2, 3, 4, 5))
    cache.sanity_check()


def test_unified_close_dereferences_without_freeing_then_evicts_closed_first(sgl):
    cache, pools = drive23.build_unified_cache23(64)
    drive23.run_request(cache, pools, list(range(1, 9)), [50, 51], session_id="A")
    drive23.run_request(cache, pools, [1, 2, 3, 4, 9, 9, 9, 9], [60], session_id="B")
    before = reconciles(cache, pools)

    result = drive23.close_session(cache, "A")
    assert result.returned == 0 and result.freed_tokens == 0 and result.leaves_indexed == 1
    assert reconciles(cache, pools) == before  # nothing freed: close only dereferences
    rows = rows_by_path(cache)
    assert rows[(1, 2, 3, 4)]["session_ref"] == 1  # B still holds the shared prefix
    assert all(r["session_ref"] == 0 and not r["session_ids"]
               for p, r in rows.items() if p[:5] == (1, 2, 3, 4, 5))
    assert drive23.close_session(cache, "A").leaves_indexed == 0  # closing again: nothing

    # Eviction takes session_ref == 0 nodes first: A's former chain, not B's.
    a_only = sum(len(r["slots"]) for p, r in rows.items() if p[:5] == (1, 2, 3, 4, 5))
    assert a_only == 4 + 1  # [5..8] and [50]
    assert drive23.evict(cache, a_only) == a_only
    rows = rows_by_path(cache)
    assert set(rows) == {(1, 2, 3, 4), (1, 2, 3, 4, 9, 9, 9, 9)}
    assert rows[(1, 2, 3, 4, 9, 9, 9, 9)]["session_ids"] == ["B"]
    cache.sanity_check()


def test_unified_tombstone_stops_inflight_requests_and_new_requests_reopen(sgl):
    cache, pools = drive23.build_unified_cache23(64)
    inflight = drive23.begin_request(cache, pools, [1, 2, 3, 4], session_id="A")
    drive23.close_session(cache, "A")
    drive23.finish_request(cache, pools, inflight, [5, 6])
    assert all(not r["session_ids"] and r["session_ref"] == 0 for r in drive23.tree_rows(cache))

    # A request that arrives after the close re-opens the id (ensure_session_generation).
    later = drive23.begin_request(cache, pools, [1, 2, 3, 4, 5, 9], session_id="A")
    assert later.session_generation == inflight.session_generation + 1
    drive23.finish_request(cache, pools, later, [7])
    assert rows_by_path(cache)[(1, 2, 3, 4, 5, 9)]["session_ids"] == ["A"]


def test_unified_abort_inserts_nothing_and_frees_its_slots(sgl):
    cache, pools = drive23.build_unified_cache23(64)
    drive23.run_request(cache, pools, [1, 2, 3, 4], [5], session_id="A")
    before = rows_by_path(cache)
    req = drive23.begin_request(cache, pools, [1, 2, 3, 8, 8, 8], session_id="C")
    assert reconciles(cache, pools)["owned"] == 3
    drive23.finish_request(cache, pools, req, [1, 2], abort=True)
    s = reconciles(cache, pools)
    assert s["owned"] == 0 and s["protected"] == 0
    after = rows_by_path(cache)
    assert all("C" not in r["session_ids"] for r in after.values())
    assert sum(len(r["slots"]) for r in after.values()) == sum(
        len(r["slots"]) for r in before.values())  # a match may split, never grow
