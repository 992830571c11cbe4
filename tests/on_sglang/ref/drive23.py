"""Build and drive the REAL SGLang 0.5.23 radix caches on CPU, the way its scheduler does.

This is the 0.5.23 counterpart of :mod:`tests.sglang_ref.replay_sglang` (which drives 0.5.16), for
the engineer writing radixtop's in-process adapter over 0.5.23's ``RadixCache`` and
``UnifiedRadixCache``. Everything here is SGLang's own code; only the model forward is missing
(no tokens are computed, slots are allocated and handed back exactly as the scheduler does).
See ``docs/sglang-internals.md`` for the facts this module relies on, with file/line references.

Objects (all SGLang's, all on ``device="cpu"``):

* ``MHATokenToKVPool`` with a small geometry (``KVGeometry``: 2 layers, 2 heads, head_dim 4, fp16
  by default) -- a real KV buffer, ``k_buffer[layer].shape == (capacity + page_size, heads, dim)``;
* ``TokenToKVPoolAllocator`` (page_size 1) or ``PagedTokenToKVPoolAllocator`` (page_size > 1);
* ``ReqToTokenPool``;
* ``RadixCache(CacheInitParams(...))`` -- 0.5.23's plain tree; it has NO session support
  (``release_radix_session`` is ``BasePrefixCache``'s no-op returning None), and 0.5.23's
  scheduler no longer builds it by default (``create_unified_radix_cache`` does, registry.py);
* ``UnifiedRadixCache(CacheInitParams(..., tree_components=(FULL,), enable_session_radix_cache=...,
  tree_core_backend="python"))`` -- what 0.5.23's scheduler builds. ``enable_session_radix_cache``
  alone already forces the Python TreeCore (tree_core_registry.py ``_rust_fallback_reason``);
  ``tree_core_backend="python"`` makes the choice explicit for the session-less build too, since the
  Rust core exposes no Python nodes (``root_node``/``node_by_id`` raise NotImplementedError).

Requests are SGLang's real ``Req`` (schedule_batch.py). Per request, the calls are the scheduler's:

* arrival (``handle_generate_request``): with sessions on, ``req.session_generation =
  cache.ensure_session_generation(session_id)`` (this also re-opens a closed id: 0.5.23's tombstone
  only stops requests that were created before the close);
* admission: ``req.init_next_round_input(cache)`` (``match_kv_cache``: ``match_prefix`` capped at
  ``len(input) - 1``, sets ``prefix_len``/``last_node``/``kv.cache_protected_len``), then
  ``req.lock = cache.lock(req.last_node)`` (``PrefillAdder._commit_prefill_admission``);
* prefill allocation (``alloc_for_extend``): a ``ReqToTokenPool`` row, the prefix's slots
  (``cache.prefix_device_indices(req)``) then fresh slots (evict-then-alloc, as
  ``alloc_token_slots`` / ``alloc_paged_token_slots_extend``); ``kv_committed_len ==
  kv_allocated_len == len(input)``;
* decode (``alloc_for_decode``): one slot per step for the token fed back; a request that emitted
  ``n`` output tokens ran ``n - 1`` decode steps, so its KV covers ``input + output[:-1]``
  (the last sampled token never had KV computed);
* finish: ``req.finished_reason = FINISH_LENGTH``, then ``release_kv_cache(req, cache,
  checkpoint=True)`` -- ``cache.checkpoint`` (insert, free the duplicates, re-lock the new leaf,
  register the session ref), ``free_kv_row`` for the unaligned tail, ``unlock``, row freed;
* abort (retract / client abort of a running request): ``release_kv_cache(req, cache,
  checkpoint=False)`` (nothing inserted, own slots freed, lock dropped);
* close: ``cache.release_radix_session(sid)`` (``Scheduler.close_session``);
* evict: ``cache.evict(EvictParams(num_tokens=N))``.

Import: call :func:`import_sglang23` (it installs the torchvision stand-in first, exactly as the
0.5.16 side does; sglang 0.5.23's ``sglang.srt.configs`` imports ``torchvision.transforms`` on the
mem_cache import path). It raises :class:`SGLang23UnavailableError` unless sglang 0.5.23 imports.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import types
import warnings
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import torchvision_stub

SGLANG_VERSION = "0.5.23"


class SGLang23UnavailableError(ImportError):
    """sglang 0.5.23 is not installed here (or does not import)."""


_SGL: types.SimpleNamespace | None = None


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def import_sglang23() -> types.SimpleNamespace:
    """Import the SGLang 0.5.23 pieces once (about 8 s on these machines)."""
    global _SGL
    if _SGL is not None:
        return _SGL
    version = installed_sglang_version()
    if version != SGLANG_VERSION:
        raise SGLang23UnavailableError(
            f"sglang {SGLANG_VERSION} is needed, found {version!r} (set up .venv-sglang23 with "
            ".ci/setup-sglang23)"
        )
    torchvision_stub.install()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
            from sglang.srt.mem_cache import radix_cache as radix_cache_module
            from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.common import evict_from_tree_cache, release_kv_cache
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
            from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
            from sglang.srt.sampling.sampling_params import SamplingParams
            from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    except Exception as exc:  # ImportError, or anything sglang's import-time code raises
        raise SGLang23UnavailableError(
            f"cannot import sglang {SGLANG_VERSION} ({type(exc).__name__}: {exc})"
        ) from exc
    _SGL = types.SimpleNamespace(
        torch=torch, Req=Req, FINISH_LENGTH=FINISH_LENGTH, FINISH_ABORT=FINISH_ABORT,
        radix_cache_module=radix_cache_module, TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator, EvictParams=EvictParams,
        MatchPrefixParams=MatchPrefixParams, CacheInitParams=CacheInitParams,
        evict_from_tree_cache=evict_from_tree_cache, release_kv_cache=release_kv_cache,
        MHATokenToKVPool=MHATokenToKVPool, ReqToTokenPool=ReqToTokenPool, RadixCache=RadixCache,
        RadixKey=RadixKey, ComponentType=ComponentType, UnifiedRadixCache=UnifiedRadixCache,
        SamplingParams=SamplingParams, ServerArgs=ServerArgs,
        set_global_server_args_for_scheduler=set_global_server_args_for_scheduler,
    )
    return _SGL


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class KVGeometry:
    """The KV pool's shape: bytes/token = layers * heads * (head_dim + v_head_dim) * dtype size."""

    layer_num: int = 2
    head_num: int = 2
    head_dim: int = 4
    dtype: str = "float16"


@dataclass
class Pools:
    """SGLang's pools behind one cache (``cache.token_to_kv_pool_allocator`` is ``allocator``)."""

    kv_pool: Any
    allocator: Any
    req_to_token_pool: Any
    page_size: int
    kind: str  # "radix" or "unified"
    sessions: bool  # enable_session_radix_cache
    rids: Any = field(default_factory=itertools.count)

    @property
    def capacity(self) -> int:
        return int(self.allocator.size)

    @property
    def bytes_per_token(self) -> int:
        kv = self.kv_pool
        itemsize = kv.store_dtype.itemsize
        return int(kv.layer_num * kv.head_num * (kv.head_dim + kv.v_head_dim) * itemsize)


def _publish_server_args(sgl, page_size: int, sessions: bool) -> None:
    # release_kv_cache and Req read the published runtime context (get_spec(), get_serving(),
    # get_memory()); SGLang's own unit fixtures publish a dummy ServerArgs the same way.
    sgl.set_global_server_args_for_scheduler(
        sgl.ServerArgs(model_path="dummy", page_size=page_size, enable_session_radix_cache=sessions)
    )


def _build_pools(sgl, capacity: int, page_size: int, geometry: KVGeometry, max_running: int,
                 max_context_len: int):
    if capacity % page_size:
        raise ValueError(f"capacity {capacity} is not a multiple of page_size {page_size}")
    torch = sgl.torch
    dtype = getattr(torch, geometry.dtype)
    kv_pool = sgl.MHATokenToKVPool(
        size=capacity, page_size=page_size, dtype=dtype, head_num=geometry.head_num,
        head_dim=geometry.head_dim, layer_num=geometry.layer_num, device="cpu",
        enable_memory_saver=False,
    )
    if page_size == 1:
        allocator = sgl.TokenToKVPoolAllocator(
            size=capacity, dtype=dtype, device="cpu", kvcache=kv_pool, need_sort=False,
        )
    else:
        allocator = sgl.PagedTokenToKVPoolAllocator(
            size=capacity, page_size=page_size, dtype=dtype, device="cpu", kvcache=kv_pool,
            need_sort=False,
        )
    req_to_token_pool = sgl.ReqToTokenPool(
        size=max_running, max_context_len=max_context_len, device="cpu", enable_memory_saver=False,
    )
    return kv_pool, allocator, req_to_token_pool


def build_radix_cache23(
    capacity: int,
    page_size: int = 1,
    *,
    eviction_policy: str = "lru",
    geometry: KVGeometry = KVGeometry(),
    max_running: int = 16,
    max_context_len: int = 4096,
):
    """A real 0.5.23 ``RadixCache`` (no sessions) over real pools. Returns ``(cache, pools)``."""
    sgl = import_sglang23()
    _publish_server_args(sgl, page_size, sessions=False)
    kv_pool, allocator, rtp = _build_pools(sgl, capacity, page_size, geometry, max_running,
                                           max_context_len)
    cache = sgl.RadixCache(sgl.CacheInitParams(
        disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=allocator,
        page_size=page_size, eviction_policy=eviction_policy,
    ))
    return cache, Pools(kv_pool, allocator, rtp, page_size, kind="radix", sessions=False)


def build_unified_cache23(
    capacity: int,
    page_size: int = 1,
    *,
    enable_session_radix_cache: bool = True,
    tree_core_backend: str = "python",
    eviction_policy: str = "lru",
    geometry: KVGeometry = KVGeometry(),
    max_running: int = 16,
    max_context_len: int = 4096,
    enable_kv_cache_events: bool = False,
):
    """A real 0.5.23 ``UnifiedRadixCache`` (FULL component only, as ``create_unified_radix_cache``
    builds it for a plain full-attention model) over real pools. Returns ``(cache, pools)``.
    ``enable_kv_cache_events``: its core records KV events (``take_events()``).

    ``tree_core_backend`` is ``CacheInitParams.tree_core_backend`` (overrides the env var
    ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, default "rust"); with sessions on, "rust" falls back
    to "python" anyway. Check ``cache._tree_core_backend`` for what was picked.
    """
    sgl = import_sglang23()
    _publish_server_args(sgl, page_size, sessions=enable_session_radix_cache)
    kv_pool, allocator, rtp = _build_pools(sgl, capacity, page_size, geometry, max_running,
                                           max_context_len)
    cache = sgl.UnifiedRadixCache(sgl.CacheInitParams(
        disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=allocator,
        page_size=page_size, eviction_policy=eviction_policy,
        tree_components=(sgl.ComponentType.FULL,),
        enable_session_radix_cache=enable_session_radix_cache,
        tree_core_backend=tree_core_backend, enable_kv_cache_events=enable_kv_cache_events,
    ))
    pools = Pools(kv_pool, allocator, rtp, page_size, kind="unified",
                  sessions=enable_session_radix_cache)
    return cache, pools


# --------------------------------------------------------------------------- driving


@dataclass
class RequestResult:
    rid: str
    prefix_len: int  # device prefix hit at admission (capped at len(input) - 1)
    kv_len: int  # tokens whose KV the request computed/held at release (input + output[:-1])
    aborted: bool = False


def _alloc_row(cache, pools: Pools, req, start: int, end: int) -> None:
    """Give row positions [start, end) KV slots, as alloc_for_extend / alloc_for_decode do:
    page_size 1 takes ``end - start`` fresh slots; a paged pool fills the row's last page first
    and takes whole fresh pages for the rest. Evicts from the tree first when short."""
    sgl = import_sglang23()
    torch = sgl.torch
    if end <= start:
        return
    ps = pools.page_size
    row = req.kv.req_pool_idx
    rtp = pools.req_to_token_pool
    allocator = pools.allocator
    if ps == 1:
        need = end - start
        sgl.evict_from_tree_cache(cache, need)
        slots = allocator.alloc(need)
        if slots is None:
            raise RuntimeError(f"out of KV slots: need {need}, {allocator.available_size()} free")
        rtp.write((row, slice(start, end)), slots)
        return
    pos = start
    if pos % ps:  # the rest of the current last page
        last = int(rtp.req_to_token[row, pos - 1])
        fill = min(end, (pos // ps + 1) * ps) - pos
        rtp.write((row, slice(pos, pos + fill)),
                  torch.arange(last + 1, last + 1 + fill, dtype=torch.int64))
        pos += fill
    if pos < end:
        pages = -(-(end - pos) // ps)
        sgl.evict_from_tree_cache(cache, pages * ps)
        slots = allocator.alloc(pages * ps)
        if slots is None:
            raise RuntimeError(f"out of KV pages: need {pages}, "
                               f"{allocator.available_size() // ps} free")
        rtp.write((row, slice(pos, end)), slots[: end - pos])


def begin_request(cache, pools: Pools, input_ids: Sequence[int], *, session_id: str | None = None,
                  rid: str | None = None, extra_key: str | None = None, priority: int | None = None):
    """Arrival + admission + prefill allocation of one request. Returns SGLang's ``Req``, which
    now holds a tree lock on its matched prefix (``req.lock``) and its own slots."""
    sgl = import_sglang23()
    if not input_ids:
        raise ValueError("a request needs at least one input token")
    rid = rid if rid is not None else f"drive23-{next(pools.rids)}"
    req = sgl.Req(
        rid=rid, origin_input_text="", origin_input_ids=array("q", input_ids),
        sampling_params=sgl.SamplingParams(temperature=0, max_new_tokens=1 << 20),
        session_id=session_id, extra_key=extra_key, priority=priority,
    )
    if session_id is not None and pools.sessions:
        # Scheduler.handle_generate_request, radix-native session branch.
        req.session_generation = cache.ensure_session_generation(session_id)
    req.init_next_round_input(cache)  # match_kv_cache
    req.lock = cache.lock(req.last_node)  # PrefillAdder._commit_prefill_admission
    req.cached_tokens = req.prefix_len  # ScheduleBatch.prepare_for_extend: pre_len - already_computed (0)
    if pools.req_to_token_pool.alloc([req]) is None:
        raise RuntimeError("ReqToTokenPool is full (raise max_running)")
    prefix = cache.prefix_device_indices(req)
    n_in = len(input_ids)
    pools.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, req.prefix_len)), prefix)
    _alloc_row(cache, pools, req, req.prefix_len, n_in)
    req.extend_end = n_in
    req.kv.kv_committed_len = req.kv.kv_allocated_len = n_in
    return req


def finish_request(cache, pools: Pools, req, output_ids: Iterable[int] = (), *,
                   abort: bool = False) -> RequestResult:
    """Decode ``output_ids`` (one slot per token fed back: all but the last), then release the
    request: ``release_kv_cache(checkpoint=True)`` on a normal finish, ``checkpoint=False`` on
    ``abort`` (nothing is inserted)."""
    sgl = import_sglang23()
    output_ids = list(output_ids)
    prefix_len = req.prefix_len
    for i, token in enumerate(output_ids):
        if i:  # decode step i feeds output_ids[i - 1] (alloc_for_decode: one slot per step)
            pos = req.kv.kv_allocated_len
            _alloc_row(cache, pools, req, pos, pos + 1)
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
        req.output_ids.append(token)
    kv_len = req.kv.kv_committed_len
    if abort:
        req.finished_reason = sgl.FINISH_ABORT("aborted by drive23")
        sgl.release_kv_cache(req, cache, checkpoint=False)
    else:
        req.finished_reason = sgl.FINISH_LENGTH(length=len(output_ids))
        sgl.release_kv_cache(req, cache, checkpoint=True)
    return RequestResult(rid=req.rid, prefix_len=prefix_len, kv_len=kv_len, aborted=abort)


def run_request(cache, pools: Pools, tokens: Sequence[int], output_ids: Iterable[int] = (), *,
                session_id: str | None = None, **kwargs) -> RequestResult:
    """One whole request: :func:`begin_request` then :func:`finish_request`."""
    req = begin_request(cache, pools, tokens, session_id=session_id, **kwargs)
    return finish_request(cache, pools, req, output_ids)


def open_session(cache, sid: str):
    """``Scheduler.open_session`` (after the session controller accepted it): clears the tombstone,
    returns the new generation. RadixCache has no such method: returns None."""
    opener = getattr(cache, "open_radix_session", None)
    return opener(sid) if opener is not None else None


@dataclass
class CloseResult:
    returned: Any  # what release_radix_session returned (0.5.23 unified: always 0; radix: None)
    freed_tokens: int  # allocator available_size after - before (0.5.23: always 0, deref only)
    leaves_indexed: int  # FULL-component frontier nodes the session had (unified only)


def close_session(cache, sid: str) -> CloseResult:
    """``Scheduler.close_session`` with --enable-session-radix-cache: ``release_radix_session``."""
    allocator = cache.token_to_kv_pool_allocator
    before = allocator.available_size()
    leaves = len(session_leaves(cache, sid))
    returned = cache.release_radix_session(sid)
    return CloseResult(returned, allocator.available_size() - before, leaves)


def evict(cache, num_tokens: int) -> int:
    sgl = import_sglang23()
    return int(cache.evict(sgl.EvictParams(num_tokens=num_tokens)).num_tokens_evicted)


# --------------------------------------------------------------------------- reading


def root_node(cache):
    """The Python root node (Unified: ``cache.tree_core.root_node``; raises NotImplementedError
    on the Rust core)."""
    return cache.root_node


def node_view(cache, node) -> dict[str, Any]:
    """The fields an adapter reads, for either tree's node type (plain values, no tensors)."""
    sgl = import_sglang23()
    full = getattr(node, "component_data", None)
    if full is not None:  # UnifiedTreeNode: per-component data, list indexed by ComponentType
        cd = full[sgl.ComponentType.FULL]
        value, lock_ref = cd.value, cd.lock_ref
        session_ref, session_ids = cd.session_ref, sorted(cd.session_ids or ())
    else:  # radix_cache.TreeNode
        value, lock_ref = node.value, node.lock_ref
        session_ref, session_ids = None, sorted(getattr(node, "session_ids", None) or ())
    return {
        "id": node.id,
        "tokens": node.key.token_ids.tolist() if hasattr(node.key.token_ids, "tolist")
        else list(node.key.token_ids),
        "extra_key": node.key.extra_key,
        "slots": None if value is None else value.tolist(),
        "lock_ref": int(lock_ref),
        "hit_count": node.hit_count,
        "last_access_time": float(node.last_access_time),
        "priority": node.priority,
        "session_ref": session_ref,
        "session_ids": session_ids,
    }


def iter_nodes(cache):
    """Every non-root node, parents before children (iterative: no recursion limit)."""
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def tree_rows(cache) -> list[dict[str, Any]]:
    """One row per node: ``path`` (token ids root..node), plus :func:`node_view`'s fields."""
    rows = []
    stack = [(c, []) for c in cache.root_node.children.values()]
    while stack:
        node, prefix = stack.pop()
        view = node_view(cache, node)
        path = prefix + view["tokens"]
        rows.append({"path": path, **view})
        stack.extend((c, path) for c in node.children.values())
    rows.sort(key=lambda r: r["path"])
    return rows


def session_leaves(cache, sid: str) -> list:
    """The FULL component's frontier nodes tagged with ``sid`` (Unified only; [] otherwise)."""
    components = getattr(cache, "components", None)
    if not components:
        return []
    sgl = import_sglang23()
    return list(components[sgl.ComponentType.FULL]._session_leaves.get(sid, ()))


def stats(cache, pools: Pools) -> dict[str, int]:
    """Token accounting. ``owned`` = slots held by running requests outside the tree, so
    ``available + evictable + protected + owned == capacity`` always."""
    capacity = pools.capacity
    available = int(pools.allocator.available_size())
    evictable = int(cache.evictable_size())
    protected = int(cache.protected_size())
    return {
        "capacity": capacity,
        "available": available,
        "evictable": evictable,
        "protected": protected,
        "owned": capacity - available - evictable - protected,
        "bytes_per_token": pools.bytes_per_token,
    }
