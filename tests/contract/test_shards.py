"""ShardedMap: a dict's interface over 64 dicts, so that a map of a million entries kept on the
owner thread never rebuilds all of them in one insert (a plain dict at a million entries, nodes
coming and going, took ~50 ms for one insert every ~400k)."""

from __future__ import annotations

import random

from radixtop.gpu_backend.owner.shards import SHARDS, ShardedMap


def test_it_answers_as_a_dict_does_through_inserts_deletes_and_overwrites():
    rng, plain, sharded = random.Random(5), {}, ShardedMap()
    for _ in range(20_000):
        key = rng.randrange(3000) if rng.random() < 0.7 else f"k{rng.randrange(300)}"
        roll = rng.random()
        if roll < 0.5:
            plain[key] = sharded[key] = rng.random()
        elif roll < 0.7:
            assert plain.pop(key, None) == sharded.pop(key, None)
        elif roll < 0.8 and key in plain:
            del plain[key]
            del sharded[key]
        assert (key in plain) == (key in sharded) and plain.get(key) == sharded.get(key)
    assert len(plain) == len(sharded) and bool(plain) == bool(sharded)
    assert set(plain) == set(sharded) == set(sharded.keys())
    assert sorted(plain.items(), key=repr) == sorted(sharded.items(), key=repr)
    assert sorted(plain.values()) == sorted(sharded.values())
    assert dict(ShardedMap(plain).items()) == plain and ShardedMap(plain) == plain == ShardedMap(plain)
    assert ShardedMap(plain) != {**plain, "extra": 1} and sharded != ShardedMap()


def test_no_one_dict_holds_more_than_its_share():
    sharded = ShardedMap((i, i) for i in range(64_000))
    assert max(len(s) for s in sharded.shards) <= 2 * 64_000 // SHARDS
    assert not ShardedMap() and ShardedMap({1: 2})[1] == 2
