"""Import the real SGLang radix-cache pieces beside CPU torch (benchmarks only).

``sglang.srt.utils.common`` imports ``torchvision`` at import time; the PyPI torchvision wheels do not
load beside the CPU torch build, and nothing on the radix-cache path uses torchvision. So, as the
differential tests do, the tests' stand-in (``tests/on_sglang/ref/torchvision_stub.py``) answers
``torchvision`` imports before sglang is imported.
"""

from __future__ import annotations

import types

from tests.on_sglang.ref import torchvision_stub


def import_sglang() -> types.SimpleNamespace:
    """The SGLang classes the benchmark drives (raises ImportError when sglang is missing)."""
    torchvision_stub.install()
    import sglang
    from sglang.srt.mem_cache import radix_cache as radix_cache_module
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    version = getattr(sglang, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as _v

            version = _v("sglang")
        except Exception:
            version = "unknown"
    return types.SimpleNamespace(
        version=version,
        stub="tests",
        radix_cache_module=radix_cache_module,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        EvictParams=EvictParams,
        InsertParams=InsertParams,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
    )
