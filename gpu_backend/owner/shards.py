"""A large map, in shards, so that no insert stops the thread that makes it to rebuild it all.

A Python dict grows by rebuilding its whole table, and one that keeps as many entries while
some come and others go (a cache at capacity: nodes added and evicted every step) rebuilds it all
again each time its deleted slots run out. At a million entries that is one insert of ~50 ms,
every ~400k inserts, on the thread that called it: SGLang's scheduler, in the index's hook on its
tree (measured: ``benchmarks/profile_owner_chunks.py``), or any thread in its process (the GIL is
held throughout). In 64 shards the same rebuild touches a 64th of the entries (~1 ms) and happens
64 times as often: the same work, never in one stall. Used by the SGLang index, the KV events'
block tree and the attribution pass (which hands it to the exclusive-tokens walk); pure Python,
so the KV-events adapter, which loads no torch, uses it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

SHARDS = 64
SHARD_MASK = SHARDS - 1
"""``map.shards[hash(key) & SHARD_MASK]``: the dict that holds ``key`` (for a hot loop; for a
non-negative int below 2**61, as node ids are, ``hash(key) == key``)."""
_MISSING: Any = object()


class _Sharded(Generic[K]):
    """What a sharded dict and set share: ``shards``, a key's shard by its hash."""

    __slots__ = ("shards",)
    shards: list[Any]

    def __contains__(self, key: object) -> bool:
        return key in self.shards[hash(key) & SHARD_MASK]

    def __len__(self) -> int:
        return sum(map(len, self.shards))

    def __bool__(self) -> bool:
        return any(self.shards)

    def __iter__(self) -> Iterator[K]:
        for shard in self.shards:
            yield from shard


class ShardedMap(_Sharded[K], Generic[K, V]):
    """The part of a dict's interface the owner's indexes use, over ``SHARDS`` dicts by the
    key's hash. Iteration goes shard by shard (not in insertion order)."""

    __slots__ = ()

    def __init__(self, items: Any = ()) -> None:
        self.shards: list[dict[K, V]] = [{} for _ in range(SHARDS)]
        pairs = items.items() if hasattr(items, "items") else items
        for key, value in pairs:
            self.shards[hash(key) & SHARD_MASK][key] = value

    def get(self, key: K, default: Any = None) -> Any:
        return self.shards[hash(key) & SHARD_MASK].get(key, default)

    def __getitem__(self, key: K) -> V:
        return self.shards[hash(key) & SHARD_MASK][key]

    def __setitem__(self, key: K, value: V) -> None:
        self.shards[hash(key) & SHARD_MASK][key] = value

    def __delitem__(self, key: K) -> None:
        del self.shards[hash(key) & SHARD_MASK][key]

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        shard = self.shards[hash(key) & SHARD_MASK]
        return shard.pop(key) if default is _MISSING else shard.pop(key, default)


    def keys(self) -> Iterator[K]:
        return iter(self)

    def values(self) -> Iterator[V]:
        for shard in self.shards:
            yield from shard.values()

    def items(self) -> Iterator[tuple[K, V]]:
        for shard in self.shards:
            yield from shard.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardedMap):
            return self.shards == other.shards
        if isinstance(other, dict):
            return len(self) == len(other) and all(other.get(k, _MISSING) == v for k, v in self.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dict

    def __repr__(self) -> str:
        return f"ShardedMap({len(self)} entries in {SHARDS} shards)"


class ShardedSet(_Sharded[K]):
    """The part of a set's interface the sessions' orders use, over ``SHARDS`` sets by the key's
    hash (a set rebuilds its whole table as a dict does)."""

    __slots__ = ()

    def __init__(self, items: Any = ()) -> None:
        self.shards: list[set[K]] = [set() for _ in range(SHARDS)]
        self.update(items)

    def add(self, key: K) -> None:
        self.shards[hash(key) & SHARD_MASK].add(key)

    def discard(self, key: K) -> None:
        self.shards[hash(key) & SHARD_MASK].discard(key)

    def update(self, keys: Any) -> None:
        shards = self.shards
        for key in keys:
            shards[hash(key) & SHARD_MASK].add(key)

    def difference_update(self, keys: Any) -> None:
        shards = self.shards
        for key in keys:
            shards[hash(key) & SHARD_MASK].discard(key)


    def __repr__(self) -> str:
        return f"ShardedSet({len(self)} keys in {SHARDS} shards)"
