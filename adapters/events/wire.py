"""The KV-event stream's wire format, without ZMQ or threads: tolerant decoding of SGLang's and
vLLM's event batches (msgpack) into ``Stored``, ``Removed`` and ``Cleared`` events.

What is on the wire (each ZMQ message is ``topic, seq (8 bytes, big-endian), payload``), by version:

* SGLang up to 0.5.17 (0.5.16 here): ``array_like`` tagged structs. A batch is
  ``[ts, events, attn_dp_rank]``; an event is
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``,
  ``["BlockRemoved", block_hashes, medium]`` or ``["AllBlocksCleared"]``. Hashes are signed int64
  (the first 8 bytes of the page's SHA-256); ``medium`` is ``"GPU"`` (device), ``"CPU_PINNED"``,
  ``"DISK"`` or ``"EXTERNAL"`` (HiCache tiers; the first releases said ``"CPU_TIER1"`` and
  ``"CPU_TIER2"`` for host and disk, read here as today's names). Bigram (EAGLE) pages carry
  ``[t, t_next]`` pairs.
* SGLang 0.5.18-0.5.19: the same arrays, with a ``BlockStoredMetadata`` map at position 7 (after
  ``medium``) when the stored node has one: ``{"cache_salt"}`` (sgl-project/sglang#30827), then
  ``{"cache_salt", "session_id"}``. Where vLLM's arrays have ``lora_name`` (a string) there.
* SGLang 0.5.19+ (0.5.23 here, #37482): events are tagged maps, ``{"type": "BlockStored",
  "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
  "cache_salt", "session_id", "lora_name"}``, optional fields left out when None; the batch stays
  an array. ``session_id`` is the session of the request that stored the blocks (attribution
  only: others may share them).
* older vLLM (0.9-era): the same arrays without ``medium`` and without the batch's rank.
* vLLM now: maps, not arrays: ``{"ts", "events", "data_parallel_rank"}`` and events tagged by
  ``"type"``, with more trailing fields (``lora_name``, ``extra_keys``, ``group_idx``,
  ``kv_cache_spec_kind``, ...); hashes may be ``bytes`` as well as ints.

So: arrays and maps both decode; missing trailing fields read as None, extra ones are ignored;
an unknown tag is counted and skipped; an event whose fields have the wrong types is counted and
skipped. Only a payload that is not a batch at all raises :class:`DecodeError`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec

BlockHash = Union[int, bytes]
"""A block's hash as published: an int (SGLang, older vLLM) or bytes (newer vLLM)."""

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind")
"""An array ``BlockStored``'s fields in order (vLLM's; SGLang 0.5.18's metadata map takes
``lora_name``'s place)."""
MEDIUM_ALIASES = {"CPU_TIER1": "CPU_PINNED", "CPU_TIER2": "DISK"}
"""Tier names of SGLang's first ``medium`` releases (#18205), as it names them now."""
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
BATCH_FIELDS = ("ts", "events", "rank")
RANK_KEYS = ("attn_dp_rank", "data_parallel_rank")


class DecodeError(ValueError):
    """The payload is not an event batch (not msgpack, or neither an array nor a map)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """``BlockStored``: a chain of blocks; ``token_ids`` is every block's tokens, in order."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    group_idx: int | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    """The session of the request that stored these blocks (SGLang 0.5.19+; None: not said)."""
    kind: str | None = None
    """vLLM's ``kv_cache_spec_kind`` of the group (``full_attention``, ``sliding_window``, ...)."""
    lora_name: str | None = None
    """The LoRA adapter of the request that stored these blocks (vLLM; its blocks hash apart)."""
    first_extra_keys: tuple[str, ...] | None = None
    """vLLM's ``extra_keys`` of the first block (a ``cache_salt``, a LoRA's name, a picture's
    hash: what its hash keeps apart from the same tokens' without them), as text; None: none."""

    def blocks(self) -> list[tuple[BlockHash, tuple[int, ...]]]:
        """(hash, tokens) of each block, root-ward first."""
        size, tokens = self.block_size, self.token_ids
        if size == 1:  # SGLang's default page size: a block per token
            return [(h, (t,)) for h, t in zip(self.block_hashes, tokens)]
        return [(h, tokens[i * size : (i + 1) * size]) for i, h in enumerate(self.block_hashes)]


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class Cleared:
    """``AllBlocksCleared``: the whole cache was reset."""


Event = Union[Stored, Removed, Cleared]


@dataclass(slots=True)
class Batch:
    ts: float
    rank: int | None
    events: list[Event]
    unknown: Counter[str] = field(default_factory=Counter)
    """Events skipped, by tag (``"?"`` when an event had no readable tag)."""
    malformed: int = 0
    """Events with a known tag whose fields could not be read."""


_decoder = msgspec.msgpack.Decoder()


def _fields(raw: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Positional (array) or named (map) fields as a dict; absent ones are left out."""
    if isinstance(raw, dict):
        return raw
    return dict(zip(names, raw))


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, (int, bytes)):
        raise TypeError(f"a block hash must be an int or bytes, got {type(value).__name__}")
    return value


def _token(value: Any) -> int:
    if isinstance(value, (list, tuple)):  # an SGLang bigram page: (token, next token)
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a token id must be an int, got {type(value).__name__}")
    return value


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _medium(value: Any) -> str | None:
    return MEDIUM_ALIASES.get(value, value) if isinstance(value, str) else None


def _first_extra_keys(value: Any) -> tuple[str, ...] | None:
    """The first block's ``extra_keys`` (vLLM: a list a block, each None or a list of keys), as
    text (bounded); None where there are none."""
    if not isinstance(value, list) or not value or not isinstance(value[0], (list, tuple)) or not value[0]:
        return None
    return tuple(str(key)[:256] for key in value[0][:16])


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _event(tag: str, body: Any) -> Event:
    if tag == "BlockStored":
        f = _fields(body, STORED_FIELDS)
        hashes = tuple(_hash(h) for h in f["block_hashes"])
        parent = f.get("parent_block_hash")
        tokens = tuple(_token(t) for t in f["token_ids"])
        size = f.get("block_size")
        if not isinstance(size, int) or size < 1:
            size = len(tokens) // len(hashes) if hashes else 0
        if not hashes or -(-len(tokens) // size) != len(hashes):  # the last block may be partial
            raise ValueError(f"{len(hashes)} blocks of {size} tokens do not hold {len(tokens)} tokens")
        meta = f if isinstance(body, dict) else f.get("lora_name")  # 0.5.18's map at position 7
        lora = f.get("lora_name") if not isinstance(f.get("lora_name"), dict) else None
        if not isinstance(meta, dict):
            meta = {}
        return Stored(hashes, None if parent is None else _hash(parent), tokens, size,
                      _medium(f.get("medium")), _optional_int(f.get("group_idx")),
                      _optional_str(meta.get("cache_salt")), _optional_str(meta.get("session_id")),
                      _optional_str(f.get("kv_cache_spec_kind")), _optional_str(lora),
                      _first_extra_keys(f.get("extra_keys")))
    if tag == "BlockRemoved":
        f = _fields(body, REMOVED_FIELDS)
        return Removed(tuple(_hash(h) for h in f["block_hashes"]), _medium(f.get("medium")),
                       _optional_int(f.get("group_idx")))
    return Cleared()


KNOWN_TAGS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


def batch_of(ts: float, events: list[Any], rank: int | None = None) -> Batch:
    """A batch of SGLang's own event objects (``BlockStored``... msgspec structs, as a cache's
    ``take_events()`` returns them) read field by field, with the same rules as the wire's
    maps: no encoding and decoding between a cache and radixtop in one process."""
    batch = Batch(float(ts), rank, [])
    for item in events:
        tag = type(item).__name__
        if tag not in KNOWN_TAGS:
            batch.unknown[tag] += 1
            continue
        fields = getattr(item, "__struct_fields__", None)  # () for AllBlocksCleared
        if fields is None:
            fields = tuple(getattr(item, "__dict__", ()))
        try:
            batch.events.append(_event(tag, {name: getattr(item, name) for name in fields}))
        except (KeyError, TypeError, ValueError, IndexError):
            batch.malformed += 1
    return batch


def decode_batch(payload: bytes) -> Batch:
    """One published payload as a :class:`Batch` (see the module docstring for the tolerance)."""
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        rank = next((raw[k] for k in RANK_KEYS if k in raw), None)
        raw = {"ts": raw.get("ts"), "events": raw.get("events"), "rank": rank}
    elif not isinstance(raw, list):
        raise DecodeError(f"a batch is an array or a map, got {type(raw).__name__}")
    f = _fields(raw, BATCH_FIELDS)
    ts, events = f.get("ts"), f.get("events")
    if not isinstance(events, list):
        raise DecodeError("the batch has no list of events")
    batch = Batch(float(ts) if isinstance(ts, (int, float)) else 0.0, _optional_int(f.get("rank")), [])
    for item in events:
        if isinstance(item, list) and item and isinstance(item[0], str):
            tag, body = item[0], item[1:]
        elif isinstance(item, dict) and isinstance(item.get("type"), str):
            tag, body = item["type"], item
        else:
            batch.unknown["?"] += 1
            continue
        if tag not in KNOWN_TAGS:
            batch.unknown[tag] += 1
            continue
        try:
            batch.events.append(_event(tag, body))
        except (KeyError, TypeError, ValueError, IndexError):
            batch.malformed += 1
    return batch
