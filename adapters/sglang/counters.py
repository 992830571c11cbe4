"""What the in-process adapter reads of SGLang besides its tree: the KV pool's geometry, and
counters of what SGLang itself does to the cache (its evictions, its requests' prompt and cached
tokens, every session close), kept by wrapping a few of the cache's own methods."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixtop.adapters.model import Geometry

if TYPE_CHECKING:
    from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter


def kv_geometry(kv_pool: Any, page_size: int, model: str) -> Geometry:
    """Geometry and bytes per token from a real SGLang KV pool (MHA: K and V per layer)."""
    layers = int(getattr(kv_pool, "layer_num", 0) or 0)
    heads = int(getattr(kv_pool, "head_num", 0) or 0)
    head_dim = int(getattr(kv_pool, "head_dim", 0) or 0)
    v_head_dim = int(getattr(kv_pool, "v_head_dim", head_dim) or head_dim)
    dtype = getattr(kv_pool, "store_dtype", None) or getattr(kv_pool, "dtype", None)
    itemsize = int(getattr(dtype, "itemsize", 0) or 0)
    bpt = layers * heads * (head_dim + v_head_dim) * itemsize
    if bpt == 0 and hasattr(kv_pool, "get_kv_size_bytes"):  # MLA and other pools: measured
        rows = int(getattr(kv_pool, "size", 0)) + page_size
        bpt = int(sum(int(x) for x in kv_pool.get_kv_size_bytes())) // max(rows, 1)
    name = str(getattr(kv_pool, "dtype", dtype)).replace("torch.", "")
    return Geometry(model or type(kv_pool).__name__, layers, heads, head_dim, name, page_size, bpt)


OBSERVER = "_radixtop_observer"
"""The attribute of a tree cache that names the adapter counting what SGLang does to it."""
HEALTH_CHECK = "HEALTH_CHECK"
"""``sglang.srt.constants.HEALTH_CHECK_RID_PREFIX``: /health's own requests, which SGLang's
TokenizerManager leaves out of its counters (it drops their state before their output comes)."""


def observe(cache: Any, adapter: SGLangInProcessAdapter) -> None:
    """Count what SGLang itself does to ``cache``, not only what radixtop asks: its evictions (its
    own ``update_eviction_metrics``, which feeds ``sglang:evicted_tokens_total``), the prompt and
    cached tokens of every finished request (``on_release``, or 0.5.16's ``cache_finished_req``: the figures SGLang reports
    per request and counts in ``sglang:prompt_tokens_total`` / ``cached_tokens_total``, /health's
    requests left out as SGLang leaves them out), and every
    session close (``release_radix_session``, whoever asked: SGLang's /close_session or radixtop).
    The cache's own methods are wrapped on the instance, once; a later adapter over the same cache
    takes the counting over. The wrappers run on the scheduler thread, inside SGLang's own calls."""
    if getattr(cache, OBSERVER, None) is not None:
        setattr(cache, OBSERVER, adapter)
        return
    setattr(cache, OBSERVER, adapter)

    def wrap(name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(cache, name, None)
        if callable(original):
            setattr(cache, name, functools.wraps(original)(make(original)))

    def evictions(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(num_evicted: int, *args: Any, **kwargs: Any) -> Any:
            result = original(num_evicted, *args, **kwargs)
            if num_evicted and num_evicted > 0:
                getattr(cache, OBSERVER).evicted_tokens += int(num_evicted)
            return result

        return counted

    def finished(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(req: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(req, *args, **kwargs)
            done = getattr(req, "finished", None)
            if (not callable(done) or done()) and not str(getattr(req, "rid", "")).startswith(HEALTH_CHECK):
                observer = getattr(cache, OBSERVER)
                observer.prompt_tokens += len(getattr(req, "origin_input_ids", ()) or ())
                observer.cached_tokens += int(getattr(req, "cached_tokens", 0) or 0)
            return result

        return counted

    def closes(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(session_id: str, *args: Any, **kwargs: Any) -> Any:
            observer = getattr(cache, OBSERVER)
            before = int(observer.allocator.available_size())
            result = original(session_id, *args, **kwargs)
            observer.closes += 1
            observer.freed_by_close_tokens += max(0, int(observer.allocator.available_size()) - before)
            observer._changed()  # a walk of a tree the index cannot follow is made again
            return result

        return counted

    wrap("update_eviction_metrics", evictions)
    # Once per request given back: 0.5.17+ calls the cache's ``on_release`` (0.5.16 has none, and
    # calls ``cache_finished_req``); a retracted request, not finished, comes back later.
    wrap("on_release" if callable(getattr(cache, "on_release", None)) else "cache_finished_req", finished)
    wrap("release_radix_session", closes)
