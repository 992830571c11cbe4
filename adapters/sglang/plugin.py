"""radixtop as an SGLang plugin: the admin API inside each scheduler process.

Enable it with ``SGLANG_PLUGINS=radixtop`` (the entry point ``radixtop`` in the
``sglang.srt.plugins`` group, see pyproject.toml). In every scheduler process SGLang calls
``register()``, which adds two hooks through SGLang's ``HookRegistry``:

* after ``Scheduler.__init__``: ``attach(scheduler)`` serves radixtop's HTTP admin API (the same
  routes and auth as ``radixtop serve``) on ``RADIXTOP_HOST`` (127.0.0.1) at ``RADIXTOP_PORT``
  (30100) plus the DP rank, from the first TP rank only (the others hold the same tree);
* after ``Scheduler.process_input_requests`` (once per scheduler loop iteration, between batches,
  where SGLang applies its own control messages): the hold, ``OwnerQueue.between_steps``, runs the
  queued reads and actions and a slice of radixtop's passes on the scheduler thread;
* before ``RustUnifiedTreeCore.__init__`` (SGLang 0.5.19+, where the module exists): the Rust
  tree core records its KV events, from which radixtop keeps the tree Python cannot read
  (``events.core``; ``RADIXTOP_CORE_EVENTS=0`` leaves the core as SGLang built it). A request the scheduler does not take within
  ``RADIXTOP_TIMEOUT`` seconds (10) fails with a clear timeout and never runs late. With
  ``--sleep-on-idle`` a queued request wakes the scheduler (``IdleWaker``).

By default (``RADIXTOP_BESIDE``, 1) the admin API and the tree run in radixtop's own process beside
the scheduler instead (``probe.BesideProcess``, ``beside``; issue 27), fed by a probe that never
makes the scheduler wait: on the Python cores SGLang's own ``RadixCache`` (0.5.15/0.5.16) and
``UnifiedRadixCache`` (0.5.17+, Python tree core), from the tree's change records; on the Rust core
(SGLang's own KV-event publisher off), from its events. Elsewhere, and with ``RADIXTOP_BESIDE=0``,
everything above runs in the scheduler's process.

Environment: ``RADIXTOP_TOKEN`` (the bearer token for actions; without it one is made up and
written, mode 0600, to ``RADIXTOP_TOKEN_FILE`` or ``sglang-<port>.token`` in a private directory,
``$XDG_RUNTIME_DIR/radixtop`` or ``$TMPDIR/radixtop-<uid>``, never through a link or into a file
someone else made; a non-loopback host needs an explicit token), ``RADIXTOP_READ_ONLY=1``, ``RADIXTOP_AUDIT`` (a JSON
lines file). Nothing here runs unless the plugin is enabled.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.owned.common import switch
from radixtop.adapters.sglang.buckets import sglang_buckets
from radixtop.adapters.sglang.doctor import running_requests, waiting_requests
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.owner.queue import OwnerQueue

log = logging.getLogger("radixtop.sglang")

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
DEFAULT_PORT = 30100


@dataclass
class Attached:
    """radixtop inside one scheduler process."""

    adapter: CacheAdapter  # SGLangInProcessAdapter, or CoreEventsAdapter over it
    owner: OwnerQueue
    url: str
    server: Any  # uvicorn.Server (None where radixtop's process beside serves the admin API)
    thread: threading.Thread | None
    waker: IdleWaker | None = None
    core: Any = None  # CoreEvents: the Rust core's KV events, taken here each loop unless SGLang takes them
    beside: Any = None  # probe.BesideProcess: radixtop's process next to the scheduler (RADIXTOP_BESIDE=1)

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(10)  # type: ignore[union-attr]
        if self.beside is not None:
            self.beside.close()
        self.adapter.release()


ATTACHED = "_radixtop_attached"
"""Set on the scheduler: what radixtop attached there (``attached_to``). On the scheduler itself,
not by its id: a gone scheduler's id is reused by a new one, which would run the old one's queue."""


def attached_to(scheduler: Any) -> Attached | None:
    """What radixtop attached to ``scheduler`` (None: nothing, or another TP rank)."""
    return getattr(scheduler, ATTACHED, None)


class IdleWaker:
    """Wakes a scheduler that sleeps on idle (``--sleep-on-idle``) when radixtop queues a read.

    SGLang's ``IdleSleeper`` waits up to a second in a ``zmq.Poller`` on its input sockets, so a
    request queued meanwhile would wait for it. The read end of a pipe joins that poller; queueing
    writes a byte to it, and the hook after ``process_input_requests`` empties it."""

    def __init__(self, poller: Any) -> None:
        import zmq

        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        poller.register(self._read, zmq.POLLIN)

    def wake(self) -> None:
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:  # the pipe is full: the scheduler is awake already
            pass

    def drained(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass


def register() -> None:
    """The entry point SGLang's plugin loader calls (no arguments) in each of its processes."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{SCHEDULER}.__init__", _after_init, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.process_input_requests", _after_inputs, HookType.AFTER)
    if os.environ.get("RADIXTOP_CORE_EVENTS", "1").strip() != "0" and _has_rust_core():
        from radixtop.adapters.sglang.events.core import RUST_CORE, record_events

        HookRegistry.register(f"{RUST_CORE}.__init__", record_events, HookType.BEFORE)


def _has_rust_core() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("sglang.srt.mem_cache.rust_tree_core.adapter") is not None
    except (ImportError, ValueError):
        return False


def _after_init(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    try:
        attach(scheduler)
    except TokenFileError as exc:
        log.error("radixtop: %s; set RADIXTOP_TOKEN (or RADIXTOP_TOKEN_FILE to a path of your own). "
                  "SGLang goes on without radixtop", exc)
    except ValueError as exc:  # a setting radixtop cannot use: one line, what to change
        log.error("radixtop: %s; SGLang goes on without radixtop", exc)
    except Exception:  # radixtop must never take a scheduler down
        log.exception("radixtop: could not attach to this scheduler; SGLang goes on without it")


def _after_inputs(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    attached = attached_to(scheduler)
    if attached is not None:
        if attached.waker is not None:
            attached.waker.drained()
        if attached.beside is not None:
            _beside_step(attached)
        elif attached.core is not None and not attached.core.sglang_takes:
            attached.core.drain()
        attached.owner.between_steps(max_items=64)
    if attached is None or (attached.core is None and attached.beside is None):
        _discard_events(scheduler)


def _beside_step(attached: Attached) -> None:
    """The probe's turn; whatever it raises stays here (an AFTER hook's exception would reach
    SGLang's scheduler loop): radixtop's process is stopped, SGLang goes on without it."""
    try:
        attached.beside.step()
    except Exception:
        log.exception("radixtop: its probe failed; radixtop's process beside the scheduler is stopped, "
                      "SGLang goes on without it")
        beside, attached.beside = attached.beside, None
        try:
            beside.close()
        except Exception:
            pass


UNREAD = "_radixtop_events_unread"
"""Set on the scheduler: whether its cache records KV events nobody takes (radixtop not attached
there: another TP rank, or an attach that failed; SGLang's own publisher off). On the scheduler
itself, not by its id: a gone scheduler's id is reused by a new one."""


def _discard_events(scheduler: Any) -> None:
    """Take and drop the events of a core that records them for nobody, so they never pile up."""
    unread = getattr(scheduler, UNREAD, None)
    if unread is None:
        from radixtop.adapters.sglang.events.core import records_events

        publisher = getattr(scheduler, "kv_events_publisher", None)
        unread = (records_events(getattr(scheduler, "tree_cache", None))
                  and not getattr(publisher, "enable_kv_cache_events", False))
        setattr(scheduler, UNREAD, unread)
    if unread:
        scheduler.tree_cache.take_events()


def beside_wanted() -> bool | str:
    """``RADIXTOP_BESIDE``: 1 (unset: the default) radixtop's process beside the scheduler where the
    cache allows it; 0 in the scheduler's process; ``attach`` the probe only, for a radixtop
    process the operator starts (``radixtop attach``: ``ATTACH``); anything else a ValueError (the
    plugin says so and SGLang goes on without it)."""
    value = os.environ.get("RADIXTOP_BESIDE", "").strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value == ATTACH:
        return ATTACH
    raise ValueError(f"RADIXTOP_BESIDE must be 1 (radixtop beside the scheduler, the default), 0 (in the "
                     f"scheduler's process) or attach (for radixtop attach), not {value[:40]!r}")


ATTACH = "attach"
"""``RADIXTOP_BESIDE=attach``: no radixtop process started by the plugin, no admin API bound by it;
the probe waits at ``attach_path`` for one the operator starts (``radixtop attach PATH``), as the
process it would start would be fed (``probe.AttachPoint``)."""


def attach_path(port: int) -> Path:
    """Where the probe of the scheduler whose admin port would be ``port`` (``RADIXTOP_PORT`` +
    its DP rank) waits for ``radixtop attach``: ``probe-PORT.sock`` in the user's private
    directory (``_private_dir``: mode 0700, this user's own)."""
    return _private_dir("make the probe's socket for radixtop attach") / f"probe-{port}.sock"


class TokenFileError(ValueError):
    """The made-up token has nowhere safe to go: the plugin does not serve (say RADIXTOP_TOKEN)."""


def _private_dir(purpose: str = "write the radixtop token") -> Path:
    """``$XDG_RUNTIME_DIR/radixtop`` (the user's own runtime directory), else
    ``$TMPDIR/radixtop-<uid>``: made mode 0700 if absent, refused if it is a link, someone else's,
    or writable by others (a shared /tmp lets anyone make that name first)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    path = (Path(runtime) / "radixtop" if runtime and os.path.isdir(runtime)
            else Path(tempfile.gettempdir()) / f"radixtop-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    _check_own(path, "directory", purpose)
    return path


def _check_own(path: Path, what: str, purpose: str = "write the radixtop token") -> os.stat_result:
    """lstat of ``path``, refused unless it is this user's own, not a link, and not writable by others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise TokenFileError(f"refusing to {purpose}: {path} is a link")
    if st.st_uid != os.geteuid():
        raise TokenFileError(f"refusing to {purpose}: {what} {path} is owned by uid {st.st_uid}")
    if st.st_mode & 0o022:
        raise TokenFileError(f"refusing to {purpose}: others can write {what} {path}")
    return st


def _token(port: int) -> str:
    """RADIXTOP_TOKEN, or a token made up here and written (mode 0600, never through a link, never
    into a file someone else made) to RADIXTOP_TOKEN_FILE or ``<private dir>/sglang-<port>.token``."""
    token = os.environ.get("RADIXTOP_TOKEN", "").strip()
    if token:
        return token
    token = secrets.token_urlsafe(24)
    explicit = os.environ.get("RADIXTOP_TOKEN_FILE", "").strip()
    path = Path(explicit) if explicit else _private_dir() / f"sglang-{port}.token"
    if os.path.lexists(path):  # ours from a run before is replaced; anything else is refused
        if not stat.S_ISREG(_check_own(path, "file").st_mode):
            raise TokenFileError(f"refusing to write the radixtop token: {path} is not a plain file")
        os.unlink(path)
    try:  # a file someone makes meanwhile fails O_EXCL, a link O_NOFOLLOW: refused, not followed
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise TokenFileError(f"refusing to write the radixtop token to {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    log.warning("radixtop: no RADIXTOP_TOKEN set; the token for actions is in %s", path)
    return token


def attach(scheduler: Any, port: int | None = None, host: str | None = None) -> Attached | None:
    """Serve the admin API over ``scheduler.tree_cache`` (what the ``__init__`` hook does).
    Returns None on a TP rank other than the first."""
    from radixtop.adapters.http.server import AuditLog, check_token_strength, create_app, is_loopback, serve_in_thread
    from radixtop.adapters.http.server.run import base_url

    if int(getattr(scheduler, "tp_rank", 0) or 0) != 0:
        return None
    dp_rank = int(getattr(scheduler, "dp_rank", None) or 0)
    host = host or os.environ.get("RADIXTOP_HOST", "127.0.0.1")
    port = (port if port is not None else int(os.environ.get("RADIXTOP_PORT", DEFAULT_PORT))) + dp_rank
    if not os.environ.get("RADIXTOP_TOKEN") and not is_loopback(host):
        raise ValueError(f"refusing to serve radixtop on {host!r} without RADIXTOP_TOKEN")
    besides = beside_wanted()  # (its settings checked before a token is made up and written)
    read_only = switch(os.environ.get("RADIXTOP_READ_ONLY"), "RADIXTOP_READ_ONLY", False)
    if besides:
        from radixtop.adapters.http.server.budget import BESIDE_CPU_SHARE, parse_share

        parse_share(os.environ.get("RADIXTOP_BESIDE_CPU"), BESIDE_CPU_SHARE)
    token = "" if besides == ATTACH else _token(port)  # (attach: the tokens are those radixtop attach serves with)
    server_args = getattr(scheduler, "server_args", None)
    model = os.path.basename(str(getattr(server_args, "model_path", "") or "").rstrip("/"))
    sleeper = getattr(scheduler, "idle_sleeper", None)
    waker = IdleWaker(sleeper.poller) if sleeper is not None and hasattr(sleeper, "poller") else None
    owner = OwnerQueue(f"the SGLang scheduler (DP rank {dp_rank})", wake=waker.wake if waker else None)
    options: dict[str, Any] = dict(
        name=f"sglang dp{dp_rank}" + (f" {model}" if model else ""),
        model=model, read_only=read_only,
        timeout=float(os.environ.get("RADIXTOP_TIMEOUT", "10")),
        session_controller=getattr(scheduler, "session_controller", None), closer=lambda sid: _close(scheduler, sid),
        buckets=lambda: sglang_buckets(scheduler),
        running_requests=lambda: running_requests(scheduler), waiting_requests=lambda: waiting_requests(scheduler),
        # the server's own tokenizer (None where it was started with --skip-tokenizer-init):
        # previews and details show text, the ids beside them
        tokenizer=getattr(scheduler, "tokenizer", None),
    )
    if besides:  # its calls answered on the scheduler's thread: no owner queue there
        try:
            beside = _beside(scheduler, options, dp_rank, host, port, token, getattr(sleeper, "poller", None),
                             besides == ATTACH)
        except Exception as exc:  # (radixtop in the scheduler's process rather than none)
            if besides == ATTACH:  # (asked for none in the scheduler's process: none)
                log.error("radixtop: its probe for radixtop attach did not start (%s: %s); SGLang goes on without "
                          "radixtop", type(exc).__name__, str(exc)[:300])
                return None
            log.error("radixtop: its process beside the scheduler did not start (%s: %s); radixtop runs in the "
                      "scheduler's process instead", type(exc).__name__, str(exc)[:300])
            beside = None
        if beside is None and besides == ATTACH:
            log.error("radixtop: radixtop attach does not apply to this cache (the line above says why); SGLang goes "
                      "on without radixtop")
            return None
        if beside is not None:
            url = f"unix:{beside.path}" if besides == ATTACH else base_url(host, port)
            attached = Attached(beside.sglang, owner, url, None, None, waker, None, beside)
            setattr(scheduler, ATTACHED, attached)
            if besides == ATTACH:
                log.info("radixtop: the probe of %s waits for a radixtop process: radixtop attach %s", options["name"],
                         beside.path)
            else:
                log.info("radixtop admin API for %s on %s, served by radixtop's process beside the scheduler (pid %d)",
                         options["name"], attached.url, beside.child.pid)
            return attached
    adapter = SGLangInProcessAdapter(scheduler.tree_cache, owner, **options)
    served, core = _over_core_events(scheduler, adapter, dp_rank)
    app = create_app(served, check_token_strength(token), AuditLog(os.environ.get("RADIXTOP_AUDIT") or None),
                     host=host, read_token=os.environ.get("RADIXTOP_READ_TOKEN") or None)
    server, thread, url = serve_in_thread(app, host, port, name=f"radixtop-api-dp{dp_rank}")
    attached = Attached(served, owner, url, server, thread, waker, core)
    setattr(scheduler, ATTACHED, attached)
    log.info("radixtop admin API for %s on %s%s", adapter.name, url,
             " (the tree from the core's own KV events)" if core is not None else "")
    return attached


def _beside(scheduler: Any, options: dict[str, Any], dp_rank: int, host: str, port: int, token: str,
            poller: Any = None, attach: bool = False) -> Any:
    """radixtop's process next to the scheduler, fed by a probe (issue 27): on a Python core
    (SGLang 0.5.15/0.5.16's ``RadixCache``, 0.5.17+'s ``UnifiedRadixCache`` on its Python tree
    core), the tree's change records (``records``), copied
    there (``mirror``); on the Rust core, its KV events, where SGLang's own publisher does not
    take them. None elsewhere (a line says why), and radixtop stays in process. ``attach``: no
    process of its own, the probe waits for ``radixtop attach`` (``probe.AttachPoint``)."""
    import dataclasses

    from radixtop.adapters.http.server.run import bind
    from radixtop.adapters.sglang.events.core import records_events
    from radixtop.adapters.sglang.probe import AttachPoint, BesideProcess, CoreOps, EventsProbe
    from radixtop.adapters.sglang.records import can_record, hook_admissions, recorder_for
    from radixtop.adapters.sglang.trees import tree_for

    cache = scheduler.tree_cache
    tree = tree_for(cache)
    recorder = None
    if tree.has_nodes:
        why = can_record(cache)
        if why is not None:
            log.info("radixtop: its process beside the scheduler does not apply to this cache yet (%s); radixtop "
                     "stays in the scheduler's process here", why)
            return None
        direct: Any = CoreOps(cache, options["name"], options["closer"], options["buckets"],
                              options["running_requests"], options["waiting_requests"], options["model"])
        more = {"tree": "unified" if hasattr(cache, "tree_core") else "radix", "page_size": tree.page_size,
                "sessions": tree.policy is not None, "geometry": dataclasses.asdict(direct.geometry),
                "ops": True}  # (each request given back, as an OP record: ``records.hook_requests``)
    else:
        publisher = getattr(scheduler, "kv_events_publisher", None)
        if not records_events(cache) or getattr(publisher, "enable_kv_cache_events", False):
            log.info("radixtop: its process beside the scheduler applies to the Rust tree core without SGLang's own "
                     "KV-event publisher; radixtop stays in the scheduler's process here")
            return None
        direct = SGLangInProcessAdapter(cache, None, **options)
        more = {"ops": True} if callable(getattr(cache, "on_release", None)) else {}  # (``probe.SERVED``)
    from radixtop.adapters.http.server import check_token_strength

    listening = None
    if not attach:  # (attach: radixtop attach binds its own, with its own tokens)
        check_token_strength(token)  # (here, once: a weak token would stop radixtop's process at each start)
        read_token = os.environ.get("RADIXTOP_READ_TOKEN") or None
        if read_token is not None:
            check_token_strength(read_token, "read token")
        listening = bind(host, port)
        listening.listen(2048)
    info = {"name": options["name"], "dp_rank": dp_rank, "bytes_per_token": int(direct.geometry.bytes_per_token),
            "capacity_tokens": int(direct.allocator.size), "tokenizer": tokenizer_source(scheduler), **more}
    try:
        if tree.has_nodes:
            recorder = recorder_for(cache, options["session_controller"])
            hook_admissions(recorder, scheduler)  # (each request's begin at its admission)
        if attach:
            process: Any = AttachPoint(cache, attach_path(port), info, sglang=direct, poller=poller, recorder=recorder)
        else:
            process = BesideProcess(cache, listening, host, info, {**os.environ, "RADIXTOP_TOKEN": token},
                                    sglang=direct, poller=poller, recorder=recorder)
        if isinstance(process.probe, EventsProbe) and more.get("ops"):  # (the Rust core: begins at admission)
            process.probe.hook_admissions(scheduler)
        return process
    except BaseException:
        if recorder is not None:
            recorder.stop()
        if listening is not None:
            listening.close()
        raise


def tokenizer_source(scheduler: Any) -> dict[str, Any] | None:
    """Where the scheduler's tokenizer came from (radixtop's process beside loads the same one for
    its text previews), or None: no tokenizer (``--skip-tokenizer-init``), or none loaded from a path."""
    tokenizer = getattr(scheduler, "tokenizer", None)
    path = getattr(tokenizer, "name_or_path", None)
    if tokenizer is None or not isinstance(path, str) or not path:
        return None
    args = getattr(scheduler, "server_args", None)
    revision = getattr(args, "tokenizer_revision", None) or getattr(args, "revision", None)
    return {"path": path, "trust_remote_code": bool(getattr(args, "trust_remote_code", False)),
            "revision": revision if isinstance(revision, str) else None}


def _over_core_events(scheduler: Any, adapter: SGLangInProcessAdapter, dp_rank: int) -> tuple[CacheAdapter, Any]:
    """Where Python cannot read the tree but the core records KV events (the Rust core, through
    the hook before its ``__init__``): the adapter that keeps the tree from them."""
    if adapter.tree.has_nodes:
        return adapter, None
    from radixtop.adapters.events.adapter import EventTreeAdapter
    from radixtop.adapters.sglang.events.core import CoreEvents, CoreEventsAdapter, records_events

    if not records_events(scheduler.tree_cache):
        return adapter, None
    tree = EventTreeAdapter(name=adapter.name, dp_rank=dp_rank, geometry=adapter.geometry,
                            capacity_tokens=int(adapter.allocator.size), tokenizer=adapter.tokenizer,
                            no_history=f"{adapter.name}: radixtop in SGLang's process (RADIXTOP_BESIDE=0) keeps no "
                                       "history of the tree there (its memory and time would be SGLang's): run "
                                       "it beside the scheduler, the plugin's default, for why and then")
    core = CoreEvents(scheduler.tree_cache, tree, getattr(scheduler, "kv_events_publisher", None))
    return CoreEventsAdapter(adapter, core, sync_timeout=adapter.timeout), core


def _close(scheduler: Any, session_id: str) -> None:
    """Close as SGLang's own /close_session does (its scheduler handler: the tree's release,
    then the session controller), so both stay consistent."""
    from sglang.srt.managers.io_struct import CloseSessionReqInput

    scheduler.close_session(CloseSessionReqInput(session_id=session_id))
