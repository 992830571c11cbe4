"""radixtop's SGLang plugin loaded by SGLang's REAL plugin loader (entry point ``radixtop`` in the
``sglang.srt.plugins`` group, ``SGLANG_PLUGINS=radixtop``) and hook registry, attached to a
``Scheduler`` whose cache is the contract's known cache built in SGLang 0.5.16 on CPU.

A real ``Scheduler.__init__`` needs a model and a GPU; the scheduler here is
``Scheduler.__new__`` with the attributes the hooked path reads (``tree_cache``, a real
``SessionController``, ``server_args``, ranks), and its loop is the hooked
``Scheduler.process_input_requests(scheduler, [])`` called by a thread, as SGLang's event loop
calls it between batches. The ``__init__`` hook's function (``_after_init``) is called on it
directly.
"""

from __future__ import annotations

import os
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager

from radixtop.adapters.http.client import RadixtopClient
from tests.on_sglang.ref.known16 import OPENED, build_known
from tests.on_sglang.ref.replay_sglang import import_sglang
from tests.support.live_server import free_port

TOKEN = "plugin-test-token"
_loaded = False


def load_plugin() -> types.SimpleNamespace:
    """SGLang's own ``load_plugins()`` with ``SGLANG_PLUGINS=radixtop`` (once per process)."""
    global _loaded
    import_sglang()
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    if not _loaded:
        os.environ["SGLANG_PLUGINS"] = "radixtop"
        load_plugins()
        _loaded = True
    return types.SimpleNamespace(Scheduler=Scheduler, HookRegistry=HookRegistry)


class _NoPendingFlush:
    """The scheduler's flush wrapper, with no flush pending (what ``process_input_requests``
    checks after the control messages)."""

    def check_pending(self) -> None:
        return None


class SchedulerLoop:
    """Calls the hooked ``Scheduler.process_input_requests`` between (empty) batches."""

    def __init__(self, scheduler, step_s: float = 0.001):
        self.scheduler = scheduler
        self.step_s = step_s
        self.running = threading.Event()
        self.running.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sglang-scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        cls = type(self.scheduler)
        while not self._stop.wait(self.step_s):
            if self.running.is_set():
                cls.process_input_requests(self.scheduler, [])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def stand_in(replayer) -> object:
    """A ``Scheduler`` (``__new__``) over the replayer's cache, with the attributes the hooked path
    reads and a real, empty ``SessionController``."""
    sgl = load_plugin()
    from sglang.srt.session.session_controller import SessionController

    scheduler = sgl.Scheduler.__new__(sgl.Scheduler)
    scheduler.tree_cache = replayer.cache
    scheduler.token_to_kv_pool_allocator = replayer.allocator
    scheduler.server_args = types.SimpleNamespace(enable_session_radix_cache=True, model_path="/models/tiny")
    scheduler.session_controller = SessionController(replayer.cache)
    scheduler.flush_wrapper = _NoPendingFlush()
    scheduler.external_corpus_manager = None
    scheduler.tp_rank, scheduler.dp_rank = 0, None
    return scheduler


def open_in(scheduler, session_ids) -> None:
    """Open the sessions through the scheduler's ``SessionController`` (SGLang's /open_session)."""
    from sglang.srt.managers.io_struct import OpenSessionReqInput

    for sid in session_ids:
        scheduler.session_controller.open(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id=sid))


def attach_plugin(scheduler, read_only: bool = False):
    """What the ``__init__`` hook runs (``_after_init``), on a free port; the ``Attached``."""
    from radixtop.adapters.sglang import plugin as sglang_plugin

    env = {"RADIXTOP_TOKEN": TOKEN, "RADIXTOP_PORT": str(free_port()),
           "RADIXTOP_READ_ONLY": "1" if read_only else "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        sglang_plugin._after_init(None, scheduler)  # what the __init__ hook runs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return sglang_plugin.attached_to(scheduler)


@contextmanager
def plugin_target(read_only: bool = False, tokenizer: object = None
                  ) -> Iterator[tuple[RadixtopClient, object, SchedulerLoop]]:
    """(an RadixtopClient on the plugin's API, the SGLang replayer, the scheduler loop);
    ``tokenizer``: the scheduler's own (SGLang's Scheduler has one unless --skip-tokenizer-init)."""
    from radixtop.adapters.sglang import plugin as sglang_plugin

    replayer = build_known()
    scheduler = stand_in(replayer)
    if tokenizer is not None:
        scheduler.tokenizer = tokenizer
    open_in(scheduler, OPENED)
    attached = attach_plugin(scheduler, read_only)
    loop = SchedulerLoop(scheduler)
    remote = RadixtopClient(attached.url, token=TOKEN, timeout=10)
    try:
        if not read_only:
            remote.close_session("gone")
        else:  # built like the others: "gone" closed, through the plugin's own adapter
            attached.adapter.read_only = False
            attached.adapter.close_session("gone")
            attached.adapter.read_only = True
        yield remote, replayer, loop
    finally:
        remote.release()
        loop.stop()
        attached.stop()
        setattr(scheduler, sglang_plugin.ATTACHED, None)
