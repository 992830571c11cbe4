"""A stand-in for ``torchvision`` so that the real SGLang package imports beside CPU torch.

Why: ``sglang.srt.utils.common`` does ``from torchvision.io import decode_jpeg`` at import time,
and that module is on the import path of ``sglang.srt.mem_cache.radix_cache``. The torchvision
wheels on PyPI are built against a specific (CUDA) torch and fail to load beside the CPU build of
torch that this project tests with, and nothing on the radix-cache path (radix tree, allocator,
KV pool, session mixin) ever calls into torchvision. So the differential tests install this
finder before importing sglang.

How: a meta-path finder that answers every ``torchvision`` / ``torchvision.*`` import with an
empty package whose attributes are inert placeholders (callable, subclassable, attribute-able),
so module-level ``from torchvision.x import y`` statements, decorators and base classes work.

The finder is deliberately visible to ``importlib.util.find_spec("torchvision")``: transformers
checks availability with ``find_spec`` and, when the distribution metadata is missing, falls back
to importing the module and reading ``__version__``. Answering consistently (a spec, and a module
with a version) keeps sglang's and transformers' import-time checks on one code path instead of
half-seeing torchvision. Anything that really *uses* a placeholder gets another placeholder back,
so code that truly needs torchvision would misbehave: do not use this outside these tests.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUB_VERSION = "0.0.0+radixtop.stub"


class _Placeholder:
    """Any attribute of the stand-in: attribute access, calls and subclassing all succeed."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):  # keep dunder probes (copy, pickle, inspect) honest
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs) -> "_Placeholder":
        return _Placeholder(f"{self._name}()")

    def __mro_entries__(self, bases):  # ``class X(torchvision.Foo)`` subclasses object instead
        return (object,)

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class TorchvisionStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchvision`` and every submodule as a stand-in package. ``hidden``: only for an
    import statement, never for ``importlib.util.find_spec`` (what availability checks call)."""

    def __init__(self, hidden: bool = False):
        self.hidden = hidden

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision" and not fullname.startswith("torchvision."):
            return None
        if self.hidden and _asked_by_find_spec():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = STUB_VERSION
        return module

    def exec_module(self, module):
        pass


def _asked_by_find_spec() -> bool:
    """Is this lookup ``importlib.util.find_spec`` (an availability check) rather than an import?"""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_name == "find_spec" and frame.f_code.co_filename.endswith(("importlib/util.py",
                                                                                         "importlib\\util.py")):
            return True
        frame = frame.f_back
    return False


def install(hidden: bool = False) -> None:
    """Put the stand-in first on ``sys.meta_path`` (idempotent). Call before importing sglang.

    A torchvision module that is already imported is left alone (the stand-in only answers imports
    that have not happened yet). ``hidden``: availability checks do not see it (transformers 5.19,
    which sglang 0.5.23 pins, must take torchvision for absent).
    """
    if not any(isinstance(f, TorchvisionStubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionStubFinder(hidden))


def installed() -> bool:
    return any(isinstance(f, TorchvisionStubFinder) for f in sys.meta_path)
