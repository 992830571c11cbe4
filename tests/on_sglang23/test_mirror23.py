"""The mirror beside the scheduler on SGLang 0.5.23's UnifiedRadixCache, Python tree core, sessions
on (issue 27): the REAL cache driven through SGLang's own request paths (splits, aborts, evictions,
closes, re-opened ids, a reset), its change records taken by the ``UnifiedRecorder``, sent through
msgpack as the hand-over carries them and applied to a ``MirrorUnifiedCache``; after every
operation the mirror equals SGLang's tree field for field (the session marks and coverage, locks,
access stamps, hits, tombstones, generations, the evictable and protected totals), the ledger kept
on the mirror equals the from-scratch attribution, and radixtop's adapter over the mirror answers
what the adapter in SGLang's process answers. Collected only beside sglang 0.5.23."""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest

from radixtop.adapters.owned.records import Walk
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.sglang.mirror_unified import MirrorUnifiedCache
from radixtop.adapters.sglang.records import FULL, UnifiedRecorder, can_record, recorder_for
from tests.on_sglang.ref import drive23
from tests.on_sglang.test_mirror16 import check_reads, node_rows, walk
from tests.on_sglang23.test_ledger23 import check_kept


def check_same(cache, mirror: MirrorUnifiedCache) -> None:
    real, mine = walk(cache.root_node), walk(mirror.root_node)
    assert set(real) == set(mine)
    assert set(mine) == set(mirror.tree_core._node_arena)
    assert set(cache.tree_core._node_arena) == set(mine)
    assert mirror.root_node.id == cache.root_node.id
    for node_id, node in real.items():
        copy = mine[node_id]
        assert copy.last_access_time == node.last_access_time, node_id
        if node is cache.root_node:
            continue
        want, got = node.component_data[FULL], copy.component_data[FULL]
        assert copy.parent.id == node.parent.id, node_id
        assert list(copy.key.token_ids) == list(node.key.token_ids), node_id
        assert (copy.key.extra_key, copy.key.cache_salt) == (node.key.extra_key, node.key.cache_salt)
        assert set(copy.children) == set(node.children), node_id
        assert got.lock_ref == want.lock_ref, node_id
        assert got.session_ref == want.session_ref, node_id
        assert (got.session_ids or set()) == (want.session_ids or set()), node_id
        assert want.value is not None and want.host_value is None, node_id  # (all on the device: no HiCache)
        assert (copy.hit_count, copy.creation_time) == (node.hit_count, node.creation_time), node_id
    real_full, my_full = cache.components[FULL], mirror.components[FULL]
    assert {sid: {n.id for n in nodes} for sid, nodes in my_full._session_leaves.items() if nodes} == \
        {sid: {n.id for n in nodes} for sid, nodes in real_full._session_leaves.items() if nodes}
    refs, my_refs = cache.session_refs, mirror.session_refs
    assert list(my_refs._closed_session_ids) == list(refs._closed_session_ids)
    assert my_refs._session_generations == refs._session_generations
    assert (mirror.evictable_size(), mirror.protected_size()) == (cache.evictable_size(), cache.protected_size())


def wire(records: list) -> list:
    """Through the hand-over's encoding (the probe's encoder, the mirror's decoder)."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(records))


def drive(seed: int, steps: int = 150, n_sessions: int = 5, snapshot_at: int = 0, page_size: int = 1,
          sessions: bool = True, policy: str = "lru", extra_keys: tuple = (None,), sliced: int = 0) -> set[int]:
    """Random requests, aborts, evictions, closes and re-opens on the real cache; the mirror made
    from a snapshot taken after ``snapshot_at`` steps, then from the records. ``sliced``: the
    snapshot walked ``sliced`` nodes a step (``Walk``) while the operations go on, as the probe
    walks it; the mirror checked once it came whole. Returns the record kinds seen."""
    rng = random.Random(seed)
    cache, pools = drive23.build_unified_cache23(600, page_size, tree_core_backend="python", eviction_policy=policy,
                                                 enable_session_radix_cache=sessions)
    prompts = [[rng.randrange(2, 40) for _ in range(rng.randint(4, 20))] for _ in range(6)]
    running: list = []
    recorder = mirror = beside = walk = None
    kinds: set[int] = set()

    def adapter_beside():
        beside = SGLangInProcessAdapter(mirror, model="tiny")
        beside.bpt = inproc.bpt
        if sessions:
            beside._orders.bpt = inproc.bpt
        return beside

    for step in range(steps):
        if step == snapshot_at:  # (radixtop in SGLang's process, attached at the same moment, to compare)
            inproc = SGLangInProcessAdapter(cache, model="tiny")
            recorder = recorder_for(cache)
            assert isinstance(recorder, UnifiedRecorder)
            mirror = MirrorUnifiedCache(page_size=page_size, sessions=sessions)
            if sliced:  # (radixtop's side reads its copy from the start, as beside the scheduler)
                beside = adapter_beside()
                walk = Walk(recorder)
            else:
                mirror.apply(wire(recorder.snapshot()))
                check_same(cache, mirror)
                beside = adapter_beside()
        roll = rng.random()
        if roll < 0.5 or not running:
            tokens = rng.choice(prompts)[: rng.randint(1, 20)] + [rng.randrange(2, 60) for _ in range(rng.randint(1, 12))]
            sid = f"s{rng.randrange(n_sessions)}" if rng.random() < 0.7 else None
            try:
                running.append(drive23.begin_request(cache, pools, tokens, session_id=sid,
                                                     extra_key=rng.choice(extra_keys)))
            except RuntimeError:
                pass
        elif roll < 0.8:
            req = running.pop(rng.randrange(len(running)))
            drive23.finish_request(cache, pools, req, [rng.randrange(2, 60) for _ in range(rng.randint(1, 5))],
                                   abort=rng.random() < 0.1)
        elif roll < 0.88:
            drive23.evict(cache, rng.randint(1, 60))
        elif roll < 0.96:
            drive23.close_session(cache, f"s{rng.randrange(n_sessions)}")
        else:
            drive23.open_session(cache, f"s{rng.randrange(n_sessions)}")
        if recorder is None:
            continue
        if walk is not None and not walk.done:
            records = walk.step(most=sliced)
            kinds |= {r[0] for r in records}
            mirror.apply(wire(records))
            if not walk.done:
                assert mirror.receiving
                continue
        else:
            records = recorder.take()
            kinds |= {r[0] for r in records}
            mirror.apply(wire(records))
        check_same(cache, mirror)
        if sessions:
            check_kept(mirror, beside)
            check_reads(inproc, beside)
        else:
            a, b = inproc.children(0, 0, 50), beside.children(0, 0, 50)
            assert (a.total, node_rows(a)) == (b.total, node_rows(b))
    while walk is not None and not walk.done:
        mirror.apply(wire(walk.step(most=sliced)))
    for req in running:
        drive23.finish_request(cache, pools, req, [7])
    drive23.evict(cache, 10_000)
    mirror.apply(wire(recorder.take()))
    check_same(cache, mirror)
    if sessions:
        check_kept(mirror, beside)
    cache.reset()
    mirror.apply(wire(recorder.take()))
    check_same(cache, mirror)
    assert not recorder.failed
    return kinds


@pytest.mark.parametrize("seed", range(6))
def test_the_mirror_follows_every_operation(seed):
    from radixtop.adapters.owned.records import ADD, CLOSE, DELETE, LOCK, MATCHED, SPLIT, STAMP, TAG, UNLOCK

    kinds = drive(seed)
    assert {ADD, SPLIT, DELETE, LOCK, UNLOCK, STAMP, MATCHED, TAG, CLOSE} <= kinds, kinds


@pytest.mark.parametrize("shape", [dict(page_size=4), dict(sessions=False), dict(policy="priority"),
                                   dict(extra_keys=(None, "lora-a", "lora-b"))], ids=str)
def test_the_mirror_follows_other_shapes_of_the_cache(shape):
    """Pages of 4 tokens, sessions off, the priority policy the real server runs with sessions,
    namespaced keys (``extra_key``)."""
    drive(7, **shape)


@pytest.mark.parametrize("seed", range(3))
def test_a_mirror_made_from_a_snapshot_of_a_running_cache_equals_it(seed):
    drive(100 + seed, snapshot_at=90)


@pytest.mark.parametrize("sliced", [1, 3])
def test_a_whole_tree_walked_in_slices_while_sglang_changes_it_comes_equal(sliced):
    """The whole tree sent over many steps (issue 27: no step holds the scheduler for a whole
    tree's walk), the requests, aborts, evictions, closes and re-opens going on between its
    slices: once whole, the copy equals SGLang's tree field for field (the sessions' activity
    during the walk in its order), its ledger the from-scratch attribution, its reads the
    in-process adapter's; then it follows the records."""
    from radixtop.adapters.owned.records import BEGIN, DROP, GENS, NODE, SEEN, TOMBS, WHOLE

    kinds = set()
    for seed in range(6):
        kinds |= drive(200 + seed, steps=220, snapshot_at=100, sliced=sliced)
    assert {BEGIN, NODE, WHOLE, SEEN, TOMBS, GENS, DROP} <= kinds, kinds


def test_the_recorder_refuses_what_it_cannot_follow():
    cache, _ = drive23.build_unified_cache23(600, tree_core_backend="python")
    assert can_record(cache) is None
    rust, _ = drive23.build_unified_cache23(600, tree_core_backend="rust", enable_session_radix_cache=False)
    assert "Python" in (can_record(rust) or "")
    with pytest.raises(TypeError):
        UnifiedRecorder(rust)


def test_a_record_the_copy_cannot_have_come_from_is_refused():
    """A node that exists already, a split that does not fit, a mark that is not there: the copy
    says it no longer equals SGLang's tree (and asks for the whole tree again) rather than go on."""
    from radixtop.adapters.owned.records import ADD, RESET, SPLIT, UNMARK, WHOLE
    from radixtop.adapters.sglang.mirror import MirrorError

    mirror = MirrorUnifiedCache(page_size=1, sessions=True)
    tokens = array("q", [5, 6, 7]).tobytes()
    mirror.apply([(RESET, 0, True, 0.0), (ADD, 1, 0, tokens, None, 1.0, 1.0, 0, 0, 0, None), (WHOLE, 2)])
    for bad in [(ADD, 1, 0, tokens, None, 2.0, 2.0, 0, 0, 0, None), (SPLIT, 2, 1, 3, 2.0, 2.0),
                (SPLIT, 1, 1, 1, 2.0, 2.0), (UNMARK, "s", 1), (ADD, 9, 8, tokens, None, 2.0, 2.0, 0, 0, 0, None)]:
        with pytest.raises(MirrorError):
            mirror.apply([bad])
    assert mirror.evictable_size() == 3 and len(mirror.tree_core._node_arena) == 2
