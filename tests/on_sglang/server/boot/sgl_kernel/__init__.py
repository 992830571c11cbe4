"""A stand-in for ``sgl_kernel`` (the PyPI wheel is CUDA-only), for SGLang servers the tests start on CPU.

With ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports a few ``*_cpu`` ops at module level
(``kvcache/cache_move.py``, ``mem_cache/allocation.py``, ``speculative/*``). On the path the tests
run (a plain Llama, ``torch_native`` attention, no speculative decoding) none is ever called: every
attribute here is a function that raises if it is, so a call that starts to matter fails loudly.
"""

from __future__ import annotations

import types

__version__ = "0.0.0+radixtop.stand-in"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not available in radixtop's CPU test server")

    missing.__name__ = name
    return missing


class _Ops(types.ModuleType):
    def __getattr__(self, name: str):
        return __getattr__(name)
