"""radixtop's process beside an SGLang scheduler (issue 27): the tree, its figures and the admin
API, fed by the scheduler's probe (``adapters.sglang.probe``) over the hand-over, so that no read
and no upkeep takes the scheduler's GIL, and a crash here is not a crash of SGLang.

    python -m radixtop.adapters.sglang.beside --handover-fd N --socket-fd M [--host H]

The process that starts it (the plugin, or a test standing for it) passes two file descriptors:
its end of the hand-over and the admin API's listening socket, bound there (so the port is taken
before this starts, and a port in use fails there). The token comes in ``RADIXTOP_TOKEN`` (never
in argv), with ``RADIXTOP_READ_TOKEN`` and ``RADIXTOP_AUDIT`` as the plugin reads them. The first
frame is ``HELLO`` (JSON: the target's name, DP rank, bytes per token, pool capacity in tokens);
then ``EVENTS`` frames. When the probe's end closes (the scheduler exited, even killed), this
process stops its server and exits: it never outlives the server it watches.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from types import SimpleNamespace
from typing import Any

from radixtop.adapters.base import check_tokens
from radixtop.adapters.errors import TargetTimeout
from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.handover import HandoverEvents
from radixtop.adapters.http import wire
from radixtop.adapters.http.server.budget import BESIDE_CPU_SHARE, parse_share
from radixtop.adapters.model import (
    Bucket,
    Capabilities,
    ClosePlanView,
    CloseResultView,
    Diagnosis,
    EvictResultView,
    FlushResultView,
    Geometry,
    Stats,
)
from radixtop.adapters.owned.common import refuse_if_read_only, switch
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.sglang.probe import CALL, CAUSED, HELLO, MORE, REFUSED, REPLY, SERVED
from radixtop.adapters.text import inert, load_tokenizer
from radixtop.gpu_backend.owner.handover import Frame, MirrorEnd, ProbeGone

log = logging.getLogger("radixtop.sglang")

HELLO_TIMEOUT_S = 10.0
"""How long this waits for the probe's first frame before giving up."""


def hello_of(end: MirrorEnd, timeout: float = HELLO_TIMEOUT_S) -> dict[str, Any]:
    """The probe's first frame, read: what the tree needs that the events do not say."""
    frame = end.receive(timeout)
    if frame is None:
        raise TimeoutError(f"no hello from the probe within {timeout:g}s")
    if frame.kind == REFUSED:  # (a radixtop attach turned away: why, in its words)
        raise ValueError(inert(bytes(frame.payload[:300]).decode(errors="replace")))
    if frame.kind != HELLO:
        raise ValueError(f"the probe's first frame is of kind {frame.kind}, not a hello")
    info = json.loads(frame.payload)
    if not isinstance(info, dict):
        raise ValueError("the probe's hello is not a JSON object")
    return info


def tree_of(info: dict[str, Any]) -> EventTreeAdapter:
    def number(key: str) -> int:
        value = info.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"the probe's hello has a bad {key!r}: {value!r}")
        return value

    from radixtop.adapters.sglang.events.core import CoreTree

    name = info.get("name")
    tree = CoreTree(name=str(name) if isinstance(name, str) and name else "sglang",
                            endpoint="the scheduler's probe", dp_rank=number("dp_rank"),
                            bytes_per_token=number("bytes_per_token"), capacity_tokens=number("capacity_tokens"))
    if number("missed"):  # started again: what the cache stored before is not in this tree
        tree.missed(number("missed"))
    return tree


class Calls:
    """Calls to SGLang itself through the probe (``probe.OPS``): each waits for its reply, which
    the probe sends after every event the scheduler recorded before it, so the tree has them when
    the reply is read (``HandoverEvents`` hands the replies here in their order among the events)."""

    def __init__(self, end: MirrorEnd, timeout: float, owner: str = "SGLang's scheduler") -> None:
        self.end = end
        self.timeout = timeout
        self.owner = owner
        """What answers the calls, as an error names it (the hello's ``owner``: SGLang's scheduler,
        or radixtop's own engine)."""
        self._ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()

    def start(self, op: str, **args: Any) -> Future:
        """Send a call now: the future of its reply (a dict), resolved on the hand-over's thread."""
        ident = next(self._ids)
        future: Future = Future()
        future.ident = ident  # type: ignore[attr-defined]
        with self._lock:
            self._pending[ident] = future
        future.add_done_callback(self._forget)
        try:
            self.end.send(CALL, json.dumps({"id": ident, "op": op, "args": args}).encode(), timeout=self.timeout)
        except (ProbeGone, TimeoutError) as exc:
            settle(future, {"error": {"code": "target_unreachable",
                                      "message": f"{self.owner} cannot be reached: {exc}"}})
        return future

    def call(self, op: str, **args: Any) -> Any:
        """A call, its reply waited for: its result, or the error it stands for."""
        future = self.start(op, **args)
        try:
            reply = future.result(self.timeout)
        except FutureTimeout:
            self._forget(future)
            raise TargetTimeout(f"{self.owner} did not answer {op!r} within {self.timeout:g}s") from None
        return result_of(reply)

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._pending.pop(future.ident, None)  # type: ignore[attr-defined]

    def replied(self, frame: Frame) -> None:
        if frame.kind != REPLY:
            return
        try:
            reply = json.loads(frame.payload)
            future = self._pending.get(reply["id"]) if isinstance(reply, dict) else None
        except (ValueError, KeyError, TypeError):
            return
        if future is not None:
            settle(future, reply)

    def gone(self) -> None:
        with self._lock:
            pending = list(self._pending.values())
        for future in pending:
            settle(future, {"error": {"code": "target_unreachable", "message": f"{self.owner} went away"}})


def settle(future: Future, reply: dict[str, Any]) -> None:
    """A call's reply, unless it has one: the sender (its send failed), the receiving thread (the
    probe gone, or its reply read) and a timed-out caller race to settle it; the first wins."""
    try:
        future.set_result(reply)
    except InvalidStateError:
        pass


def result_of(reply: dict[str, Any]) -> Any:
    if "error" in reply:
        raise wire.error_from_body(500, reply)
    return reply.get("result")


class Syncs:
    """Reads bring the tree up to the scheduler's step with a ``sync`` call; concurrent reads
    share one (a flood makes at most one a round trip, not one a read). A read joins the next
    sync not yet sent, never one sent before it began: its answer is as of a step after the read
    began. At most one in flight; the next is sent when its reply comes."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self._lock = threading.RLock()  # (a call that fails at once replies in the sender's own thread)
        self._in_flight = False
        self._next: Future | None = None
        self.sent = 0
        self.last: Any = None
        """What the last sync's reply carried (a Python core's probe: SGLang's totals then)."""

    def wait(self, timeout: float) -> bool:
        with self._lock:
            if self._next is None:
                self._next = Future()
            mine = self._next
            if not self._in_flight:
                self._send_next()
        try:
            result_of(mine.result(timeout))
        except FutureTimeout:
            return False
        return True

    def _send_next(self) -> None:  # (under the lock)
        group, self._next, self._in_flight = self._next, None, True
        self.sent += 1
        reply = self.calls.start("sync")
        reply.add_done_callback(lambda done: self._replied(group, done))  # type: ignore[arg-type]

    def _replied(self, group: Future, reply: Future) -> None:
        answer = reply.result()
        if isinstance(answer, dict) and answer.get("result") is not None:
            self.last = answer["result"]
        group.set_result(answer)
        with self._lock:
            self._in_flight = False
            if self._next is not None:
                self._send_next()


class RemoteSGLang:
    """What SGLang itself says and does (its totals, its doctor's figures, evict and flush), asked
    of the scheduler through the probe: the part of ``SGLangInProcessAdapter`` that
    ``CoreEventsAdapter`` uses."""

    def __init__(self, calls: Calls, name: str, read_only: bool, timeout: float) -> None:
        self.calls = calls
        self.name = name
        self.read_only = read_only
        self.timeout = timeout
        self.tree = SimpleNamespace(kind="Rust tree core", policy=None)

    def capabilities(self) -> Capabilities:
        own = wire.capabilities_from_dict(self.calls.call("capabilities"))
        return own if not self.read_only else Capabilities(**{**own.__dict__, "read_only": True})

    def stats(self) -> Stats:
        return wire.stats_from_dict(self.calls.call("stats"))

    def diagnose(self, idle_after_s: float = 600.0) -> Diagnosis:
        return wire.diagnosis_from_dict(self.calls.call("diagnose", idle_after_s=idle_after_s))

    def evict(self, num_tokens: int) -> EvictResultView:
        self._refuse_if_read_only("evict")
        return wire.evict_result_from_dict(self.calls.call("evict", num_tokens=num_tokens))

    def flush(self) -> FlushResultView:
        self._refuse_if_read_only("flush")
        return wire.flush_result_from_dict(self.calls.call("flush"))

    def _refuse_if_read_only(self, action: str) -> None:
        if self.read_only:
            from radixtop.adapters.errors import ReadOnly

            raise ReadOnly(f"{self.name} is read-only: {action} refused")


class MirrorAdapter(SGLangInProcessAdapter):
    """The contract over a ``MirrorCache`` (a Python core's tree copied beside the scheduler):
    every read runs on the mirror's own thread here, after a ``sync`` through the probe (so it is
    as of a scheduler step after the read began); SGLang's totals, its close, evict and flush,
    and what the doctor reads of the scheduler are asked of the probe (``probe.CoreOps``)."""

    def __init__(self, mirror: Any, loop: Any, calls: Calls, syncs: Syncs, info: dict[str, Any],
                 read_only: bool, timeout: float) -> None:
        self.calls, self.syncs, self.loop, self.mirror = calls, syncs, loop, mirror
        self._told: dict[str, Any] = {}
        self._local = threading.local()
        geometry = info.get("geometry")
        super().__init__(
            mirror, loop.queue, name=str(info.get("name") or "sglang"), read_only=read_only, timeout=timeout,
            geometry=wire.from_wire(Geometry, geometry) if isinstance(geometry, dict) else None,
            buckets=lambda: self._told.get("buckets"), running_requests=self._holders,
            waiting_requests=self._waiting, session_controller=mirror.controller)

    # ----- every read as of a step after it began -----

    def _synced(self, run: Callable[[], Any]) -> Any:
        if getattr(self._local, "synced", False) or self._in_pass() is not None \
                or threading.current_thread() is self.loop.thread \
                or self.mirror.receiving:  # (the mirror's own thread applies the reply; the probe answers
            return run()                    # no sync until the whole tree on its way is sent: the copy as it is)
        self.syncs.wait(self.timeout)  # (past the timeout: the tree as of the last record)
        self._local.synced = True
        try:
            return run()
        finally:
            self._local.synced = False

    def _call(self, fn: Callable[[], Any], urgent: bool = False) -> Any:
        return self._synced(lambda: super(MirrorAdapter, self)._call(fn, urgent))

    def _call_pass(self, make: Callable[[], Any]) -> Any:
        return self._synced(lambda: super(MirrorAdapter, self)._call_pass(make))

    # ----- what only the scheduler knows -----

    def capabilities(self) -> Capabilities:
        own = super().capabilities()
        if self.loop.incomplete is not None:
            why = f"radixtop's copy of the tree is incomplete ({self.loop.incomplete}); the whole tree is being sent again"
        elif self.mirror.receiving:
            why = ("radixtop's process is receiving the whole tree from the scheduler, a slice a step: what it "
                   "shows is its copy from before (none at its start)")
        else:
            return own
        return dataclasses.replace(own, reason=f"{own.reason}; {why}" if own.reason else why)

    def stats(self) -> Stats:
        """SGLang's totals as the sync before this read carried them (no call of its own: a stats
        read in a batch runs on the mirror's thread, which must not wait for the probe), with the
        mirror's node and session counts."""
        def read() -> Stats:
            if self.syncs.last is None:
                from radixtop.adapters.errors import TargetUnreachable

                raise TargetUnreachable(f"{self.calls.owner} has not answered radixtop's process yet")
            return self._with_counts(dataclasses.replace(wire.stats_from_dict(self.syncs.last), target=self.name))

        return self._call(read, urgent=True)

    def _refuse_if_partial(self, what: str) -> None:
        """A close's plan needs the whole copy: not one being received (a session not there yet
        would read as unknown) or known incomplete. Evict and flush need none (SGLang's own, run
        while the tree is on its way: ``probe.AT_ONCE``)."""
        if self.mirror.receiving or self.loop.incomplete is not None:
            from radixtop.adapters.errors import NotReady

            raise NotReady(f"{what}: radixtop's process is receiving the whole tree from the scheduler, and a "
                           "close's plan needs all of it; try again shortly (evict and flush work now)")

    def plan_close(self, session_id: str) -> ClosePlanView:
        self._need_sessions()
        self._refuse_if_partial(f"plan of the close of session {session_id!r}")
        return super().plan_close(session_id)

    def close_session_planned(self, session_id: str) -> tuple[ClosePlanView, CloseResultView]:
        """The plan on the mirror as of a step after the call began, then SGLang's own close;
        the nodes it freed are the plan's where it freed what the plan says (as in process, where
        both run in one hold)."""
        self._need_sessions()
        refuse_if_read_only(self, f"close of session {session_id!r}")
        self._refuse_if_partial(f"close of session {session_id!r}")
        plan = self.plan_close(session_id)
        freed = int(result_of_call(self.calls, "close", session_id=session_id)["freed_tokens"])
        ids = plan.freed_node_ids if freed == plan.freed_tokens else ()
        return plan, CloseResultView(session_id, plan.policy, plan.state == "closed", ids, freed, freed * self.bpt,
                                     plan.released_holds)

    def evict(self, num_tokens: int) -> EvictResultView:
        check_tokens(num_tokens)
        refuse_if_read_only(self, f"evict of {num_tokens} tokens")
        return wire.evict_result_from_dict(self.calls.call("evict", num_tokens=num_tokens))

    def flush(self) -> FlushResultView:
        refuse_if_read_only(self, "flush")
        return wire.flush_result_from_dict(self.calls.call("flush"))

    def diagnose(self, idle_after_s: float = 600.0) -> Diagnosis:
        """The doctor on the copy as of the scheduler's step that answered ``state`` (its locks
        against the requests running then): run on the mirror's thread when that reply is
        handled, before any record after it is applied (a later record's lock, checked against
        the earlier requests, would read as leaked)."""
        from radixtop.adapters.doctor import check_idle_after, diagnose_pass
        from radixtop.adapters.owned.reads import finished
        from radixtop.adapters.sglang.doctor import doctor_inputs
        from radixtop.gpu_backend.owner.slices import run_to_end

        check_idle_after(idle_after_s)
        done: Future = Future()

        def at_the_reply(reply: Future) -> None:  # (the mirror's thread, in the reply's place among the records)
            try:
                state = result_of(reply.result())
                buckets = state.get("buckets")
                self._told = {**state, "buckets": None if buckets is None
                              else tuple(wire.from_wire(Bucket, b) for b in buckets)}
                slots = self.mirror.token_to_kv_pool_allocator
                slots.size, slots.available = int(state["capacity"]), int(state["available"])
                done.set_result(finished(run_to_end(diagnose_pass(doctor_inputs(self), idle_after_s))))
            except Exception as exc:
                done.set_exception(exc)

        self.calls.start("state").add_done_callback(at_the_reply)
        try:
            return done.result(self.timeout)
        except FutureTimeout:
            raise TargetTimeout(f"{self.calls.owner} did not answer 'state' within {self.timeout:g}s") from None

    def _holders(self) -> list[Any] | None:  # (the mirror's thread: its nodes by id)
        held = self._told.get("holders")
        if held is None:
            return None
        by_id = self.mirror.by_id
        return [SimpleNamespace(last_node=by_id.get(node_id), session_id=sid) for node_id, sid in held]

    def _waiting(self) -> list[Any] | None:
        count, head = self._told.get("waiting"), self._told.get("head")
        if count is None:
            return None
        if not count or head is None:
            return []
        rid, need = head
        first = SimpleNamespace(rid=rid, origin_input_ids=range(need), output_ids=(), prefix_indices=None)
        return [first, *([None] * (count - 1))]


def result_of_call(calls: Calls, op: str, **args: Any) -> dict[str, Any]:
    reply = calls.call(op, **args)
    if not isinstance(reply, dict):
        raise wire.WireError(f"the scheduler's answer to {op!r} is not an object")
    return reply


def load_tokenizer_later(source: dict[str, Any], loaded: Callable[[Any], None]) -> threading.Thread:
    """Load the server's tokenizer (``source``: where the scheduler's came from, as the hello says)
    on a thread of its own, from local files only, and hand it to ``loaded``; until then, and where
    it cannot load (one line says why), previews carry token ids and no text."""
    path = source["path"]

    def run() -> None:
        revision = source.get("revision")
        try:
            tokenizer = load_tokenizer(path, trust_remote_code=bool(source.get("trust_remote_code")),
                                       **({"revision": revision} if isinstance(revision, str) else {}))
        except Exception as exc:  # (ValueError, one line; ImportError without transformers)
            print(f"radixtop beside: previews carry token ids, no text: the server's tokenizer does not load here "
                  f"({type(exc).__name__}: {str(exc)[:300]})", file=sys.stderr, flush=True)
            return
        loaded(tokenizer)

    thread = threading.Thread(target=run, name="radixtop-tokenizer", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m radixtop.adapters.sglang.beside", description=__doc__.split("\n\n")[0])
    ap.add_argument("--handover-fd", type=int, required=True)
    ap.add_argument("--socket-fd", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from radixtop.adapters.http.server.logs import limit_repeats

    limit_repeats()  # a flood of bad requests is said a few times a minute, not into the server's log each
    try:  # the server's work comes first where both want a core (RADIXTOP_BESIDE_NICE, 10 by default)
        os.nice(int(os.environ.get("RADIXTOP_BESIDE_NICE", "10")))
    except (OSError, ValueError) as exc:
        print(f"radixtop beside: RADIXTOP_BESIDE_NICE not applied ({exc})", file=sys.stderr)
    from radixtop.adapters.fleet.watch import watched_from
    from radixtop.adapters.http.server import serve

    try:  # the CPU it takes for reads, on average (a flood of them waits, then is answered 429)
        cpu_share = parse_share(os.environ.get("RADIXTOP_BESIDE_CPU"), BESIDE_CPU_SHARE)
        read_only = switch(os.environ.get("RADIXTOP_READ_ONLY"), "RADIXTOP_READ_ONLY", False)
        fleet = watched_from(os.environ)  # (serve --fleet beside its engine)
    except ValueError as exc:
        print(f"radixtop beside: {exc}", file=sys.stderr)
        return 1
    end = MirrorEnd(socket.socket(fileno=args.handover_fd))
    listening = socket.socket(fileno=args.socket_fd)
    try:
        info = hello_of(end)
        tree = tree_of(info) if info.get("tree") not in ("radix", "unified") else None
    except ProbeGone:
        print("radixtop beside: the probe closed its end before its hello (its scheduler left)", file=sys.stderr)
        return 1
    except (TimeoutError, ValueError) as exc:
        print(f"radixtop beside: {exc}", file=sys.stderr)
        return 1

    timeout = float(os.environ.get("RADIXTOP_TIMEOUT", "10"))
    calls = Calls(end, timeout, str(info.get("owner") or "SGLang's scheduler"))

    def gone() -> None:  # the scheduler exited: so does this process (serve stops on SIGTERM)
        calls.gone()
        os.kill(os.getpid(), signal.SIGTERM)

    syncs = Syncs(calls)  # (a sync's reply comes after every event recorded before it)
    if tree is None:  # a Python core: its tree copied here from the probe's records
        from radixtop.adapters.sglang.mirror import MirrorCache, MirrorLoop
        from radixtop.adapters.sglang.mirror_unified import MirrorUnifiedCache

        def resync() -> None:  # (on the mirror's thread: the reply is not waited for)
            try:
                calls.start("resync")
            except Exception:  # (the scheduler gone: its end's closing says so)
                pass

        page_size, sessions = int(info.get("page_size") or 1), bool(info.get("sessions"))
        if info.get("tree") == "unified":
            mirror: Any = MirrorUnifiedCache(page_size=page_size, sessions=sessions)
        else:  # (SGLang 0.5.16's close frees; radixtop's own engine says which it does)
            mirror = MirrorCache(page_size=page_size, sessions=sessions,
                                 close_policy=str(info.get("close_policy") or "free"))
        mirror.token_to_kv_pool_allocator.size = int(info.get("capacity_tokens") or 0)  # (the pool's, fixed)
        if info.get("ops") is True:  # (radixtop's own engine: its requests come as OP records)
            mirror.history.tells_requests()
        handover: Any = MirrorLoop(mirror, end, on_other=calls.replied, on_gone=gone, on_diverged=resync)
        adapter: Any = MirrorAdapter(mirror, handover, calls, syncs, info, read_only, timeout)
        handover.start()
    else:
        from radixtop.adapters.sglang.events.core import CoreEventsAdapter

        if info.get("ops") is True:  # (``probe.SERVED`` frames: SGLang's requests)
            tree.tells_requests()

        def other(frame: Frame) -> None:  # (in order among the events)
            if frame.kind == SERVED:
                tree.served(frame.payload)
                return
            if frame.kind != CAUSED:
                calls.replied(frame)
                return
            try:
                told = json.loads(frame.payload)
                cause, who = str(told.get("cause") or ""), str(told.get("who") or "")
            except (ValueError, AttributeError):  # (never the hand-over's thread down for it)
                log.warning("radixtop: a CAUSED frame that is not one: %r", bytes(frame.payload[:80]))
                cause, who = "", ""
            tree.caused(cause, who)

        handover = HandoverEvents(tree, end, on_gone=gone, on_other=other)
        sglang = RemoteSGLang(calls, tree.name, read_only, timeout)
        adapter = CoreEventsAdapter(sglang, handover, sync_timeout=timeout, synced=syncs.wait)  # type: ignore[arg-type]
    try:  # up and reading: the probe judges a hang by its own measure from now on (``probe.STARTING_S``)
        end.send(MORE, b"", timeout=1.0)
    except Exception:
        pass
    source = info.get("tokenizer")
    if isinstance(source, dict) and source.get("demo") is True and tree is None:  # radixtop's embedded demo's words
        from radixtop.gpu_backend.demo_text import DEMO_TOKENIZER

        adapter.tokenizer = DEMO_TOKENIZER
    elif isinstance(source, dict) and isinstance(source.get("path"), str):  # the server's, for text previews
        readers = adapter if tree is None else tree
        load_tokenizer_later(source, lambda loaded: setattr(readers, "tokenizer", loaded))
    try:
        serve(adapter, host=args.host, token=os.environ.get("RADIXTOP_TOKEN") or None,
              audit_path=os.environ.get("RADIXTOP_AUDIT") or None,
              read_token=os.environ.get("RADIXTOP_READ_TOKEN") or None, sock=listening,
              log=lambda line: print(line, file=sys.stderr, flush=True), cpu_share=cpu_share,
              proof_key=os.environ.get("RADIXTOP_PROOF_KEY", "").encode() or None, fleet=fleet)
    finally:
        handover.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
