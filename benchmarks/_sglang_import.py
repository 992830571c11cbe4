"""Import the real SGLang radix-cache pieces beside CPU torch (benchmarks only).

``sglang.srt.utils.common`` imports ``torchvision`` at import time; the PyPI torchvision wheels do not
load beside the CPU torch build, and nothing on the radix-cache path uses torchvision. So, as the
differential tests do, a stand-in finder answers ``torchvision`` imports before sglang is imported.
The tests' stand-in (``tests/sglang_ref/torchvision_stub.py``) is used when it is present; otherwise
an equivalent copy below is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


class _Placeholder:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs) -> "_Placeholder":
        return _Placeholder(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+radixtop.bench.stub"
        return module

    def exec_module(self, module):
        pass


def install_torchvision_stub() -> str:
    """Install a torchvision stand-in; returns which one ("tests" or "local")."""
    path = _REPO / "tests" / "sglang_ref" / "torchvision_stub.py"
    if path.is_file():
        try:
            spec = importlib.util.spec_from_file_location("_radixtop_tv_stub", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.install()
            return "tests"
        except Exception:  # a half-written file: fall back to the local copy
            pass
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return "local"


def import_sglang() -> types.SimpleNamespace:
    """The SGLang classes the benchmark drives (raises ImportError when sglang is missing)."""
    stub = install_torchvision_stub()
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
        stub=stub,
        radix_cache_module=radix_cache_module,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        EvictParams=EvictParams,
        InsertParams=InsertParams,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
    )
