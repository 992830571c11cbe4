"""The TreeIndex over the REAL SGLang 0.5.23 trees (UnifiedRadixCache on its Python core, and
RadixCache): after every operation the tree does itself, nodes by id and subtree tokens equal a
walk. Collected only beside sglang 0.5.23."""

from __future__ import annotations

import random

import pytest

from radixtop.adapters.sglang.index import INDEX
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from tests.on_sglang.ref import drive23


def build(kind: str, capacity: int):
    if kind == "radix":
        return drive23.build_radix_cache23(capacity)
    return drive23.build_unified_cache23(capacity, tree_core_backend="python")


@pytest.mark.parametrize("kind", ["unified", "radix"])
@pytest.mark.parametrize("seed", range(4))
def test_the_index_follows_every_operation(kind, seed):
    rng = random.Random(seed)
    cache, pools = build(kind, capacity=600)
    adapter = SGLangInProcessAdapter(cache, model="tiny")  # installs the index on the empty tree
    index = getattr(cache, INDEX)
    sessions = pools.sessions
    prompts = [[rng.randrange(2, 40) for _ in range(rng.randint(4, 20))] for _ in range(6)]
    running = []
    for step in range(150):
        roll = rng.random()
        if roll < 0.55 or not running:
            tokens = rng.choice(prompts)[: rng.randint(1, 20)] + [rng.randrange(2, 60) for _ in range(rng.randint(1, 12))]
            sid = f"s{rng.randrange(5)}" if sessions and rng.random() < 0.6 else None
            try:
                running.append(drive23.begin_request(cache, pools, tokens, session_id=sid))
            except RuntimeError:  # the pool is full of locked paths: finish some first
                pass
        elif roll < 0.85:
            req = running.pop(rng.randrange(len(running)))
            drive23.finish_request(cache, pools, req, [rng.randrange(2, 60) for _ in range(rng.randint(1, 5))],
                                   abort=rng.random() < 0.1)
        elif roll < 0.93:
            drive23.evict(cache, rng.randint(1, 60))
        elif sessions:
            drive23.close_session(cache, f"s{rng.randrange(5)}")
        assert index.verify() == [], (kind, seed, step)
    for req in running:
        drive23.finish_request(cache, pools, req, [7])
    assert index.verify() == []
    assert adapter.stats().node_count == index.count == len(list(drive23.iter_nodes(cache)))
    drive23.evict(cache, 10_000)
    assert index.verify() == []
