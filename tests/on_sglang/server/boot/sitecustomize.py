"""Imported at start by every process of an SGLang server the tests launch (PYTHONPATH holds this
folder, and multiprocessing's spawned children inherit it): installs the torchvision stand-in,
which PyPI's torchvision cannot be beside the CPU build of torch. 0.5.16 (transformers 5.12)
needs it visible to ``importlib.util.find_spec``; 0.5.23 (transformers 5.19) needs it not to be
(RADIXTOP_TORCHVISION_STUB=hidden), or transformers takes the stand-in for a real torchvision."""

import os

_mode = os.environ.get("RADIXTOP_TORCHVISION_STUB", "")
if _mode:
    from tests.on_sglang.ref import torchvision_stub

    torchvision_stub.install(hidden=_mode == "hidden")
