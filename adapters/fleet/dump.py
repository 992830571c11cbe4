"""Dynamo's KV indexer dump (``GET /dump``) as what each worker caches and what is cached twice.

The dump is the indexer's radix tree as events, per ``model:routing_group``: each event's
``stored`` chain of blocks hangs under ``parent_hash`` (null at the root), for one ``worker_id``
and ``dp_rank`` in one ``storage_tier``. A block's ``block_hash`` is a sequence hash: it names the
whole prefix up to and including it, so the same hash on two workers is the same prefix cached
twice. Only the ``device`` tier is counted as duplicated memory (a host or disk copy is another
tier, not a second copy in a pool)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixtop.adapters.fleet.model import DuplicatePrefix, Duplicates
from radixtop.adapters.http.wire import is_count

DEVICE_TIER = "device"
MAX_BLOCK_SIZE = 2**20
"""The largest block size a dump may give (Dynamo's are 16 to a few hundred tokens)."""


class DumpError(ValueError):
    """The dump is not in the shape Dynamo 1.6 writes."""


@dataclass
class _DumpBlock:
    parent: int | None
    holders: set[str]


def holder(worker_id: Any, dp_rank: Any) -> str:
    return f"{worker_id}" if not dp_rank else f"{worker_id}@{dp_rank}"


@dataclass(frozen=True)
class ParsedDump:
    block_sizes: dict[str, int]
    """Per model group (``model:group``)."""
    indexed_tokens: dict[str, int]
    """Per holder (``id`` or ``id@dp``): tokens in the device tier."""
    blocks: dict[str, dict[int, _DumpBlock]]
    """Per model group: block hash -> parent and holders (device tier)."""


def parse_dump(body: Any) -> ParsedDump:
    if not isinstance(body, dict):
        raise DumpError(f"expected an object of model groups, got {type(body).__name__}")
    sizes: dict[str, int] = {}
    indexed: dict[str, int] = {}
    groups: dict[str, dict[int, _DumpBlock]] = {}
    for group, doc in body.items():
        try:
            size = doc["block_size"]
            events = doc["events"]
        except (KeyError, TypeError) as exc:
            raise DumpError(f"{group}: no block_size or events ({exc!r})") from None
        if not is_count(size) or not 1 <= size <= MAX_BLOCK_SIZE:
            raise DumpError(f"{group}: block_size {size!r:.40} is not a block size (a whole number from 1 to "
                            f"{MAX_BLOCK_SIZE})")
        sizes[group] = size
        blocks: dict[int, _DumpBlock] = groups.setdefault(group, {})
        per_holder: dict[str, set[int]] = {}
        try:
            for event in events:
                _apply(event, blocks, per_holder)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise DumpError(f"{group}: an event not in Dynamo's shape ({type(exc).__name__}: {exc})") from None
        for who, held in per_holder.items():
            indexed[who] = indexed.get(who, 0) + len(held) * size
    return ParsedDump(sizes, indexed, groups)


def _apply(event: Any, blocks: dict[int, _DumpBlock], per_holder: dict[str, set[int]]) -> None:
    """One event of the dump on ``blocks`` and its holder's set; KeyError, TypeError, ValueError
    or AttributeError where the event is not in Dynamo's shape (``parse_dump`` says which)."""
    if event.get("storage_tier", DEVICE_TIER) != DEVICE_TIER:
        return
    who = holder(event["worker_id"], event.get("dp_rank") or event["event"].get("dp_rank"))
    data = event["event"]["data"]
    held = per_holder.setdefault(who, set())
    if "stored" in data:
        parent = data["stored"].get("parent_hash")
        parent = None if parent is None else _hash(parent)
        for block in data["stored"]["blocks"]:
            h = _hash(block["block_hash"])
            entry = blocks.get(h)
            if entry is None:
                entry = blocks[h] = _DumpBlock(parent, set())
            entry.holders.add(who)
            held.add(h)
            parent = h
    elif "removed" in data:  # (a dump holds stored chains; a removal is applied if one comes)
        for h in data["removed"].get("block_hashes", []):
            h = _hash(h)
            held.discard(h)
            if h in blocks:
                blocks[h].holders.discard(who)
    elif "cleared" in data or data == "cleared":
        for h in held:
            if h in blocks:
                blocks[h].holders.discard(who)
        held.clear()


def _hash(value: Any) -> int:
    """A block hash: a whole number (signed or not, 64 bits); ValueError for anything else."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
        raise ValueError(f"{value!r:.40} is not a block hash")
    return value


def duplicates(parsed: ParsedDump, bytes_per_token: int | None, limit: int = 50) -> Duplicates:
    """The prefixes cached on more than one worker: each deepest block that two or more hold
    (its holders hold its whole path), largest duplicated first, at most ``limit``."""
    prefixes: list[DuplicatePrefix] = []
    total = 0
    size_seen = 0
    for group, blocks in parsed.blocks.items():
        size = parsed.block_sizes[group]
        size_seen = size_seen or size
        shared = {h: b for h, b in blocks.items() if len(b.holders) > 1}
        total += sum((len(b.holders) - 1) * size for b in shared.values())
        has_shared_child: set[int] = set()
        for h, b in shared.items():
            if b.parent in shared and shared[b.parent].holders == b.holders:
                has_shared_child.add(b.parent)
        depth: dict[int, int] = {}

        def depth_of(h: int | None) -> int:
            chain: list[int] = []
            on_chain: set[int] = set()
            while h is not None and h not in depth and h in blocks and h not in on_chain:
                chain.append(h)
                on_chain.add(h)
                h = blocks[h].parent
            # a parent already on this chain is a cycle (a malformed dump): the chain starts there
            d = depth.get(h, 0) if h is not None and h not in on_chain else 0
            for x in reversed(chain):
                d += 1
                depth[x] = d
            return d

        for h, b in shared.items():
            if h in has_shared_child:
                continue  # a longer prefix with the same holders says it
            n = depth_of(h)
            copies = len(b.holders)
            tokens = n * size
            dup = (copies - 1) * tokens
            prefixes.append(DuplicatePrefix(
                model=group, block_hash=h, blocks=n, tokens=tokens,
                holders=tuple(sorted(b.holders, key=lambda s: (len(s), s))), duplicated_tokens=dup,
                duplicated_bytes=dup * bytes_per_token if bytes_per_token else None))
    prefixes.sort(key=lambda p: (-p.duplicated_tokens, p.model, p.block_hash))
    return Duplicates(tuple(prefixes[:limit]), total, total * bytes_per_token if bytes_per_token else None,
                      size_seen, bytes_per_token)
