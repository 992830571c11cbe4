"""Replay a radixtop trace through the REAL SGLang 0.5.16 radix cache, as its scheduler drives it.

This is the reference side of the differential tests: ``replay_sglang(lines, capacity)`` returns
the same document as radixtop's ``gpu_backend.traces.ops.replay`` (``results``, ``tree``, ``stats``;
no ``timing``), computed with SGLang's own objects:

* ``MHATokenToKVPool`` on cpu with a tiny geometry (1 layer, 1 head, head_dim 1, fp16): it builds in
  about a millisecond, so the allocator holds a real KV cache, as in a server;
* ``TokenToKVPoolAllocator(size=capacity, dtype=<kv dtype>, device="cpu", kvcache=..., need_sort=False)``
  (``dtype`` is the KV cache dtype, as ``ModelRunner`` passes it, not the index dtype);
* ``ReqToTokenPool`` on cpu, sized from the trace (rows = most requests in flight at once,
  columns = longest input + output);
* ``RadixCache(CacheInitParams(..., enable_session_radix_cache=True))`` with its
  ``SessionRadixCacheMixin``.

Per op, the calls are the scheduler's:

* ``begin``: ``match_prefix`` on the whole input, ``inc_lock_ref`` on the matched last node, a
  ``ReqToTokenPool`` row, then ``alloc_token_slots`` (SGLang's helper: ``evict_from_tree_cache`` --
  evict the whole need when fewer slots are free than needed -- then ``alloc``) for the unmatched
  input; the row gets the prefix's slots then the new ones.
* ``finish``: ``alloc_token_slots`` for the output, then ``cache_finished_req(req,
  kv_len_to_handle=len(input)+len(output))`` (insert, free duplicates, tag the session,
  ``dec_lock_ref``), then the row is freed (as ``release_kv_cache`` does).
* ``request``: a begin then its finish.
* ``abort`` (not produced by ``tests/support/trace_gen.py``): SGLang's retract path, see
  :meth:`SGLangReplayer.abort`.
* ``close``: ``release_radix_session``; it returns the freed node count, the freed token count is
  the allocator's ``available_size`` after minus before.
* ``register``: SGLang 0.5.16 has no register method (its docstring mentions
  ``register_session``, but no such method exists); a register is emulated by clearing the
  tombstone: ``cache._closed_session_ids.pop(sid, None)``, which is what reopening a session id
  has to do for the session's later requests to tag again.
* ``evict``: ``cache.evict(EvictParams(num_tokens=N))``.

Differences from a live server that do not matter to the radix cache: the real scheduler caps the
match at ``input_len - 1`` (so at least one token is computed); the trace format, and radixtop,
match the whole input, and so does this replay. Only ``page_size == 1`` is supported (the
``TokenToKVPoolAllocator`` is the page-size-1 allocator; paged allocators are not wired here).

Determinism: SGLang stamps nodes with ``time.monotonic()``, so two stamps can tie and the evict
heap's order would then be arbitrary. During a replay the ``time`` that
``sglang.srt.mem_cache.radix_cache`` sees is replaced by a :class:`TickClock`, whose
``monotonic()`` returns a strictly increasing counter (everything else, ``perf_counter``
included, is the real ``time``). Give radixtop's ``replay(..., clock=TickClock())`` a fresh one of
its own: both sides read the clock at the same points (start of each match and insert, each new
node), so equal counters order the same nodes the same way. (SGLang's ``TreeNode`` reads the clock
twice, for ``last_access_time`` and ``creation_time``; those two reads are adjacent, so the relative
order of all stamps is still the same as radixtop's single read.)
"""

from __future__ import annotations

import json
import time
import types
import warnings
from array import array
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

from . import torchvision_stub


class SGLangUnavailableError(ImportError):
    """The real sglang package could not be imported."""


class SGLangReplayError(ValueError):
    """A trace line the SGLang side cannot apply (the message names the line)."""


class TickClock:
    """A ``time`` stand-in whose ``monotonic()`` counts 1, 2, 3, ...; calling it does the same.

    Every other attribute is the real ``time`` module's (``perf_counter`` for SGLang's metrics).
    """

    def __init__(self) -> None:
        self.ticks = 0

    def monotonic(self) -> float:
        self.ticks += 1
        return float(self.ticks)

    __call__ = monotonic

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


_SGL: types.SimpleNamespace | None = None


def import_sglang() -> types.SimpleNamespace:
    """Import the SGLang pieces once (about 7 s: sglang pulls in transformers and more).

    Raises :class:`SGLangUnavailableError` with the underlying reason when it cannot.
    """
    global _SGL
    if _SGL is not None:
        return _SGL
    torchvision_stub.install()
    try:
        with warnings.catch_warnings():
            # Import-time noise only: Triton/AWQ/GGUF "needs a GPU" notices, torch.jit deprecations.
            warnings.simplefilter("ignore")
            import torch
            from sglang.srt.mem_cache import radix_cache as radix_cache_module
            from sglang.srt.mem_cache.allocation import alloc_token_slots
            from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    except Exception as exc:  # ImportError, or anything sglang's import-time code raises
        raise SGLangUnavailableError(
            f"cannot import the real sglang package ({type(exc).__name__}: {exc}); the "
            "differential tests need sglang==0.5.16 (see .ci/sglang-0.5.16.txt)"
        ) from exc
    _SGL = types.SimpleNamespace(
        torch=torch,
        radix_cache_module=radix_cache_module,
        alloc_token_slots=alloc_token_slots,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        EvictParams=EvictParams,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        MHATokenToKVPool=MHATokenToKVPool,
        ReqToTokenPool=ReqToTokenPool,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
    )
    return _SGL


@contextmanager
def deterministic_clock(sgl: types.SimpleNamespace):
    """Swap the ``time`` that SGLang's radix_cache module uses for a fresh :class:`TickClock`."""
    module = sgl.radix_cache_module
    saved = module.time
    module.time = TickClock()
    try:
        yield module.time
    finally:
        module.time = saved


class _Req:
    """The fields of SGLang's ``Req`` that the radix cache and the req-to-token pool read."""

    def __init__(self, rid: str, input_ids: list[int], session_id: str | None, extra_key: str | None = None):
        self.rid = rid
        self.origin_input_ids = array("q", input_ids)  # SGLang keeps token ids in array('q')
        self.output_ids = array("q")
        self.session_id = session_id
        self.extra_key = extra_key
        """Its namespace in the tree (a LoRA's, a cache salt's: SGLang's ``RadixKey.extra_key``)."""
        self.priority = 0
        self.req_pool_idx = None
        self.prefix_indices = None
        self.cache_protected_len = 0
        self.last_node = None
        self.cached_tokens = 0
        """Its prompt's tokens served from the cache (SGLang sets it at its prefill)."""
        self.finished_reason: str | None = None

    def finished(self) -> bool:
        return self.finished_reason is not None


def _parse(lines: Iterable[str]) -> list[tuple[int, dict]]:
    ops = []
    for line_no, text in enumerate(lines, start=1):
        text = text.strip()
        if text and not text.startswith("#"):
            ops.append((line_no, json.loads(text)))
    return ops


def _pool_shape(ops: list[tuple[int, dict]]) -> tuple[int, int]:
    """(most requests running at once, longest input + output) over the whole trace."""
    running: dict[str, int] = {}
    most, longest = 1, 1
    for _, op in ops:
        kind = op["op"]
        if kind == "begin":
            running[op["id"]] = len(op["input"])
            most = max(most, len(running))
            longest = max(longest, len(op["input"]))
        elif kind == "finish" and op["id"] in running:
            longest = max(longest, running.pop(op["id"]) + len(op["output"]))
        elif kind == "abort":
            running.pop(op["id"], None)
        elif kind == "request":
            most = max(most, len(running) + 1)
            longest = max(longest, len(op["input"]) + len(op["output"]))
    return most, longest


class SGLangReplayer:
    """Owns one set of SGLang objects and applies trace ops to them."""


    def __init__(
        self,
        sgl: types.SimpleNamespace,
        capacity: int,
        eviction_policy: str = "priority",
        max_running: int = 64,
        max_context_len: int = 4096,
        kv_shape: tuple[int, int, int, str] = (1, 1, 1, "float16"),
    ):
        """``kv_shape``: (layers, heads, head_dim, dtype) of the KV pool (tiny by default)."""
        torch = sgl.torch
        self.sgl = sgl
        layers, heads, head_dim, dtype_name = kv_shape
        kv_dtype = getattr(torch, dtype_name)
        self.kv_pool = sgl.MHATokenToKVPool(
            size=capacity, page_size=1, dtype=kv_dtype, head_num=heads, head_dim=head_dim,
            layer_num=layers, device="cpu", enable_memory_saver=False,
        )
        self.allocator = sgl.TokenToKVPoolAllocator(
            size=capacity, dtype=kv_dtype, device="cpu", kvcache=self.kv_pool, need_sort=False,
        )
        self.req_to_token_pool = sgl.ReqToTokenPool(
            size=max_running, max_context_len=max_context_len, device="cpu",
            enable_memory_saver=False,
        )
        self.cache = sgl.RadixCache(
            sgl.CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
                eviction_policy=eviction_policy,
                enable_session_radix_cache=True,
            )
        )
        self.running: dict[str, _Req] = {}
        self.results: list[dict[str, Any]] = []
        # What the trace made SGLang do (for coverage checks; no effect on the replay).
        self.counters = {"allocs": 0, "alloc_evictions": 0, "splits": 0}
        split_node = self.cache._split_node

        def counting_split_node(*args, **kwargs):
            self.counters["splits"] += 1
            return split_node(*args, **kwargs)

        self.cache._split_node = counting_split_node

    # ----- scheduler steps -----

    def _alloc(self, num_tokens: int):
        # SGLang's own helper: evict_from_tree_cache (evict num_tokens when fewer are free), alloc,
        # and a RuntimeError when the pool is still short.
        if num_tokens:
            self.counters["allocs"] += 1
            if self.allocator.available_size() < num_tokens:
                self.counters["alloc_evictions"] += 1
        return self.sgl.alloc_token_slots(self.cache, num_tokens)

    def begin(self, rid: str, input_ids: list[int], session_id: str | None, extra_key: str | None = None) -> int:
        if rid in self.running:
            raise ValueError(f"request {rid!r} is already running")
        sgl = self.sgl
        req = _Req(rid, input_ids, session_id, extra_key)
        match = self.cache.match_prefix(
            sgl.MatchPrefixParams(key=sgl.RadixKey(array("q", input_ids), extra_key))
        )
        prefix = match.device_indices
        req.prefix_indices = prefix
        req.last_node = match.last_device_node
        req.cache_protected_len = req.cached_tokens = len(prefix)
        self.cache.inc_lock_ref(req.last_node)
        if self.req_to_token_pool.alloc([req]) is None:
            raise RuntimeError("ReqToTokenPool is full (sized from the trace: a bug here)")
        own = self._alloc(len(input_ids) - len(prefix))
        row = req.req_pool_idx
        self.req_to_token_pool.write((row, slice(0, len(prefix))), prefix)
        self.req_to_token_pool.write((row, slice(len(prefix), len(input_ids))), own)
        self.running[rid] = req
        return len(prefix)

    def finish(self, rid: str, output_ids: list[int]) -> None:
        req = self.running.pop(rid, None)
        if req is None:
            raise KeyError(f"request {rid!r} is not running")
        start = len(req.origin_input_ids)
        req.output_ids = array("q", output_ids)
        total = start + len(output_ids)
        if total > start:
            more = self._alloc(total - start)
            self.req_to_token_pool.write((req.req_pool_idx, slice(start, total)), more)
        req.finished_reason = "length"
        self.cache.cache_finished_req(req, kv_len_to_handle=total)
        self.req_to_token_pool.free(req)

    def abort(self, rid: str) -> None:
        """SGLang's retract path (``release_req``): ``release_kv_cache(req, tree_cache,
        is_insert=False)``, i.e. ``cache_finished_req(req, is_insert=False)`` over the KV it holds
        (the input: outputs get slots only at finish here), then the row is freed. The
        retract-time ``evict_from_tree_cache`` for the remaining requests' next decode steps
        is not modelled (it depends on batch state a trace does not have)."""
        req = self.running.pop(rid, None)
        if req is None:
            raise KeyError(f"request {rid!r} is not running")
        self.cache.cache_finished_req(req, is_insert=False, kv_len_to_handle=len(req.origin_input_ids))
        self.req_to_token_pool.free(req)

    def close(self, session_id: str) -> tuple[int, int]:
        before = self.allocator.available_size()
        freed_nodes = self.cache.release_radix_session(session_id)
        return freed_nodes, self.allocator.available_size() - before

    def register(self, session_id: str) -> None:
        # SGLang 0.5.16 has no register_session (the mixin's comment names one, the method does
        # not exist): reopening a session id means dropping its close tombstone so that its
        # later requests tag nodes again. This is that, done on SGLang's own state.
        self.cache._closed_session_ids.pop(session_id, None)

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(self.sgl.EvictParams(num_tokens=num_tokens)).num_tokens_evicted

    # ----- ops -----

    def apply(self, line_no: int, op: dict) -> dict[str, Any]:
        kind = op.get("op")
        try:
            if kind == "begin":
                result = {"op": "begin", "hit": self.begin(op["id"], op["input"], op.get("session"))}
            elif kind == "finish":
                self.finish(op["id"], op["output"])
                result = {"op": "finish"}
            elif kind == "abort":
                self.abort(op["id"])
                result = {"op": "abort"}
            elif kind == "request":
                rid = f"\x00request-{line_no}"
                hit = self.begin(rid, op["input"], op.get("session"))
                self.finish(rid, op["output"])
                result = {"op": "request", "hit": hit}
            elif kind == "close":
                freed_nodes, freed_tokens = self.close(op["session"])
                result = {"op": "close", "freed_nodes": freed_nodes, "freed_tokens": freed_tokens}
            elif kind == "register":
                self.register(op["session"])
                result = {"op": "register"}
            elif kind == "evict":
                result = {"op": "evict", "evicted_tokens": self.evict(op["tokens"])}
            else:
                raise ValueError(f"unknown op {kind!r}")
        except (KeyError, ValueError, RuntimeError) as exc:
            raise SGLangReplayError(f"line {line_no}: {type(exc).__name__}: {exc}") from exc
        self.results.append(result)
        return result

    # ----- the document -----

    def tree_rows(self) -> list[dict[str, Any]]:
        rows = []
        stack = [(child, []) for child in self.cache.root_node.children.values()]
        while stack:
            node, prefix = stack.pop()
            path = prefix + node.key.token_ids.tolist()
            rows.append({
                "path": path,
                "tokens": len(node.key),
                "lock_ref": node.lock_ref,
                "holders": sorted(getattr(node, "session_ids", None) or ()),
            })
            stack.extend((c, path) for c in node.children.values())
        rows.sort(key=lambda r: r["path"])
        return rows

    def stats(self) -> dict[str, int]:
        return {
            "total_size": int(self.cache.total_size()),
            "evictable_size": int(self.cache.evictable_size()),
            "protected_size": int(self.cache.protected_size()),
            "available_size": int(self.allocator.available_size()),
        }


def replay_sglang(
    lines: Iterable[str],
    capacity: int,
    page_size: int = 1,
    eviction_policy: str = "priority",
    counters: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Replay a trace through SGLang's RadixCache; the document radixtop's ``replay`` returns
    (``results``, ``tree``, ``stats``), without ``timing``. ``page_size`` must be 1.

    ``counters``, when given, is updated with what the trace made SGLang do: ``allocs`` (slot
    allocations), ``alloc_evictions`` (allocations that had to evict first), ``splits``.
    """
    if page_size != 1:
        raise NotImplementedError("replay_sglang drives SGLang's page-size-1 allocator only")
    sgl = import_sglang()
    ops = _parse(lines)
    most, longest = _pool_shape(ops)
    with deterministic_clock(sgl):
        replayer = SGLangReplayer(
            sgl, capacity, eviction_policy=eviction_policy,
            max_running=most, max_context_len=longest,
        )
        try:
            for line_no, op in ops:
                replayer.apply(line_no, op)
        finally:
            if counters is not None:
                for name, value in replayer.counters.items():
                    counters[name] = counters.get(name, 0) + value
        return {"results": replayer.results, "tree": replayer.tree_rows(), "stats": replayer.stats()}
