"""Change records: what the probe in SGLang's scheduler captures of a Python-core tree as it
changes (issue 27's split, the Python cores), for the mirror in radixtop's process beside it
(``adapters.sglang.mirror``) to make the same changes to a tree of its own.

On SGLang 0.5.15/0.5.16's ``RadixCache`` (sessions on or off) the ``ChangeRecorder`` wraps, on the cache
instance, the methods that change the tree, as the index does in process (``adapters.sglang.index``):
each wrapper appends one small tuple (a node's id and a few numbers; a new node's tokens as the
bytes of SGLang's own ``array('q')``, one copy) to a list, and nothing else. No node registry, no
sizes, no sessions' figures: those are kept beside. ``take()`` hands the list over once a
scheduler loop; the probe encodes it (``msgspec`` msgpack) and sends it without waiting.

The records and their format: ``adapters.owned.records`` (shared with the bundled cache's
recorder).
"""

from __future__ import annotations

import functools
import logging
from array import array
from collections.abc import Callable
from typing import Any

from radixtop.adapters.owned.records import (  # (the records' vocabulary, as SGLang's recorders use it)
    ADD,
    CLOSE,
    DELETE,
    EVICT,
    FORGET,
    GEN,
    GENS,
    LOCK,
    MARK,
    MATCHED,
    NODE,
    OP,
    RECORDER,
    RELEASED,
    RESET,
    SPLIT,
    STAMP,
    TAG,
    TOMBS,
    TOUCH,
    UNLOCK,
    UNMARK,
    _Recorder,
    pieces,
)

log = logging.getLogger("radixtop.sglang")


def tokens_of(key: Any) -> bytes:
    """A key's token ids as the bytes of an ``array('q')`` (SGLang 0.5.16 keeps them so: one copy)."""
    return _token_bytes(key.raw_token_ids() if hasattr(key, "raw_token_ids") else key.token_ids)


def can_record(cache: Any) -> str | None:
    """Why no recorder can follow ``cache`` (None: one can, ``recorder_for``): SGLang's own
    ``RadixCache`` (or a subclass that keeps its tree) with SGLang's ``TreeNode``s, or a 0.5.17+
    ``UnifiedRadixCache`` on its Python tree core with the full component alone. Not a cache
    SGLang wraps (0.5.16's ``StreamingSession`` forwards to an inner cache whose own calls would
    go unrecorded), not another tree (SWA, Mamba: other fields), not HiCache's host tier, not
    bigram keys, not an external cache linker."""
    if hasattr(cache, "tree_core"):
        return _cannot_record_unified(cache)
    try:
        from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode
    except ImportError as exc:  # (an SGLang without that module: nothing here to follow)
        return f"SGLang's RadixCache cannot be imported ({exc})"
    if not isinstance(cache, RadixCache) or not isinstance(getattr(cache, "root_node", None), TreeNode):
        return f"{type(cache).__name__} is not SGLang's RadixCache"
    if hasattr(cache, "cache_controller") or "HiRadix" in type(cache).__name__:
        return "HiCache's host tier is not recorded yet"
    if getattr(cache, "is_eagle", False):
        return "bigram keys (EAGLE) are not recorded yet"
    return None


def _cannot_record_unified(cache: Any) -> str | None:
    core = cache.tree_core
    try:
        from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore, UnifiedTreeNode
    except ImportError as exc:
        return f"SGLang's unified tree core cannot be imported ({exc})"
    if not isinstance(core, UnifiedTreeCore) or not isinstance(getattr(core, "root_node", None), UnifiedTreeNode):
        return "the tree core is not SGLang's Python one (the Rust core's events are taken instead)"
    components = getattr(cache, "components", None)
    kinds = [int(k) for k in (components or {})]
    if kinds != [FULL]:
        return "a tree with components beside the full KV (SWA, Mamba) is not recorded yet"
    if getattr(core, "enable_hicache", False) or getattr(cache, "cache_controller", None) is not None:
        return "HiCache's host tier is not recorded yet"
    if getattr(core, "enable_external_cache_linker", False) or getattr(cache, "linker", None) is not None:
        return "an external cache linker is not recorded yet"
    if getattr(core, "is_eagle", False):
        return "bigram keys (EAGLE) are not recorded yet"
    return None


def recorder_for(cache: Any, controller: Any = None) -> _Recorder:
    """The recorder of ``cache`` (``can_record`` said it can follow it)."""
    return UnifiedRecorder(cache, controller) if hasattr(cache, "tree_core") else ChangeRecorder(cache, controller)


HEALTH_CHECK = "HEALTH_CHECK"
"""``sglang.srt.constants.HEALTH_CHECK_RID_PREFIX``: /health's own requests, which SGLang leaves out
of its counters (``counters.HEALTH_CHECK``): left out here too."""


def released_request(req: Any) -> tuple[str | None, str, int, int, str, bytes | None, bytes | None] | None:
    """A request SGLang gives back, as the history tells it: its session, its id, its prompt's
    tokens and its hit (``req.cached_tokens``, SGLang's own figure), how it ended (``finish``, or
    ``abort``: ``FINISH_ABORT``, nothing of it cached), its prompt's token ids and its output's as
    the bytes of SGLang's own ``array('q')`` (one copy each, a memcpy); None where it is not one to
    tell: not finished (retracted: it comes back), or /health's own."""
    done, rid = getattr(req, "finished", None), str(getattr(req, "rid", ""))
    if (callable(done) and not done()) or rid.startswith(HEALTH_CHECK):
        return None
    sid, prompt, cached, prompt_ids = _begin_of(req)
    aborted = type(getattr(req, "finished_reason", None)).__name__ == "FINISH_ABORT"
    return (sid, rid, prompt, cached, "abort" if aborted else "finish", prompt_ids,
            None if aborted else _token_bytes(getattr(req, "output_ids", None) or ()))


def _begin_of(req: Any) -> tuple[str | None, int, int, bytes]:
    """A request's begin as the history tells it: its session, its prompt's tokens, its hit
    (SGLang's own ``cached_tokens``) and its prompt's token ids."""
    sid = getattr(req, "session_id", None)
    prompt = getattr(req, "origin_input_ids", None) or ()
    return None if sid is None else str(sid), len(prompt), int(getattr(req, "cached_tokens", 0) or 0), \
        _token_bytes(prompt)


def _token_bytes(ids: Any) -> bytes:
    """Token ids as the bytes of an ``array('q')`` (SGLang keeps a request's so: one copy)."""
    return ids.tobytes() if isinstance(ids, array) and ids.typecode == "q" else array("q", ids).tobytes()


def release_method(cache: Any) -> str:
    """The method SGLang gives each request back through: ``on_release`` (0.5.17+), else 0.5.16's
    ``cache_finished_req``."""
    return "on_release" if callable(getattr(cache, "on_release", None)) else "cache_finished_req"


def hook_requests(recorder: _Recorder, cache: Any, closer: Any = None) -> None:
    """Each request SGLang gives back finished (``released_request``) as two ``OP`` records: its
    begin (its session, its prompt's token ids, its hit: a session's hits over time beside) and its
    finish (its output's token ids) or abort, both at its end: what a recording replays; and each
    session's close (``closer.release_radix_session``: the cache's on 0.5.16, its session tracker's
    on 0.5.23), whoever asked for it. What cannot be told (a request SGLang holds oddly) is not
    told, and never stops the tree's records (``_failed``)."""

    begun = recorder.begun

    def released(result: Any, req: Any, *a: Any, **k: Any) -> None:
        try:
            told = released_request(req)
        except Exception as exc:  # (a request of another shape: not told, the tree's copy goes on)
            _not_told(exc)
            return
        if told is not None:
            sid, rid, prompt, cached, how, prompt_ids, output_ids = told
            if rid in begun:  # (its begin told at its admission: ``hook_admissions``)
                begun.discard(rid)
            else:
                recorder.records.append((OP, "begin", sid, rid, prompt_ids, prompt, cached, 0))
            recorder.records.append((OP, how, sid, rid, output_ids, 0, 0, 0))

    def closed(result: Any, session_id: Any, *a: Any, **k: Any) -> None:
        recorder.records.append((OP, "close", str(session_id), None, None, 0, 0, 0))

    recorder._wrap(cache, release_method(cache), released)
    if closer is not None:
        recorder._wrap(closer, "release_radix_session", closed)


def hook_admissions(recorder: _Recorder, scheduler: Any) -> None:
    """Each request's begin told when SGLang admits it (its first prefill chunk scheduled:
    ``Scheduler.get_new_batch_prefill``, wrapped on the instance, after it returned), not at its
    end: so the history's ops, and a recording's replay, run SGLang's requests as concurrently as
    it ran them (``admitted_begins``). Its finish is told at its end (``hook_requests``); a request
    admitted before this hook was there is told whole at its end, as before."""
    def admitted(plan: Any, *a: Any, **k: Any) -> None:
        try:
            for sid, rid, prompt, cached, prompt_ids in admitted_begins(plan, recorder.begun):
                recorder.records.append((OP, "begin", sid, rid, prompt_ids, prompt, cached, 0))
        except Exception as exc:  # (a batch of another shape: its begins told at their ends)
            _not_told(exc)

    recorder._wrap(scheduler, "get_new_batch_prefill", admitted)


MOST_BEGUN = 65_536
"""Requests told at their admission and not yet given back, kept at most (their ids: a finish
tells no second begin): past it a request is told whole at its end, so a request SGLang never
gives back cannot grow the set in SGLang's process without bound."""


def admitted_begins(plan: Any, begun: set[str]) -> list[tuple[str | None, str, int, int, bytes]]:
    """The begins of the requests ``get_new_batch_prefill``'s ``plan`` admits (each with its
    first chunk: ``extend_batch_idx == 1``; not a retracted one admitted again,
    ``retracted_stain``, nor /health's own), as ``_begin_of`` tells them with their ids; each one's
    id added to ``begun``. Its hit is SGLang's own (``req.cached_tokens``, final once the batch is
    prepared: docs/sglang-internals.md section 8)."""
    batch = getattr(plan, "batch_to_run", None)
    if batch is None:
        return []
    reqs = batch.reqs
    told = []
    for i in range(len(reqs) - len(getattr(batch, "decoding_reqs", None) or ())):
        req = reqs[i]
        if getattr(req, "extend_batch_idx", 0) != 1 or getattr(req, "retracted_stain", False):
            continue
        rid = str(getattr(req, "rid", ""))
        if rid.startswith(HEALTH_CHECK) or rid in begun or len(begun) >= MOST_BEGUN:
            continue
        try:
            sid, prompt, cached, prompt_ids = _begin_of(req)
        except Exception as exc:  # (one of another shape: told whole at its end, the others now)
            _not_told(exc)
            continue
        begun.add(rid)
        told.append((sid, rid, prompt, cached, prompt_ids))
    return told


_said: list[str] = []


def _not_told(exc: Exception) -> None:
    if not _said:  # (once: a log line a request would flood the server's log)
        _said.append(type(exc).__name__)
        log.warning("radixtop: a request SGLang gave back cannot be told (%s: %s); such requests are left "
                    "out of the history", type(exc).__name__, exc)


FULL = 0
"""``ComponentType.FULL``: a unified node's ``component_data`` is a list indexed by it."""


class ChangeRecorder(_Recorder):
    """Records every change of one SGLang ``RadixCache`` (scheduler thread only)."""

    def __init__(self, cache: Any, controller: Any = None) -> None:
        """``controller``: the scheduler's ``SessionController``, whose sessions' opening and
        ending are recorded too (a session opened through SGLang holds no node at first)."""
        why = can_record(cache)
        if why is not None or hasattr(cache, "tree_core"):
            raise TypeError(why or "a UnifiedRadixCache: its recorder is UnifiedRecorder")
        super().__init__()
        self.cache = cache
        self._next_id = type(cache.root_node).counter
        """Every node with an id below this one existed when last looked (a node
        ``_insert_helper`` returns with a higher one is the leaf it added)."""
        self.controller = controller
        self._hook()
        if controller is not None:
            self._hook_controller(controller)
        setattr(cache, RECORDER, self)

    def root(self) -> Any:
        self._next_id = max(self._next_id, type(self.cache.root_node).counter)
        return self.cache.root_node

    def state(self, node: Any) -> tuple:
        key = node.key
        return (NODE, node.id, node.parent.id, tokens_of(key), key.extra_key, node.last_access_time,
                getattr(node, "creation_time", node.last_access_time), node.hit_count, node.lock_ref,
                tuple(getattr(node, "session_ids", None) or ()))

    def ends(self) -> list[tuple]:
        out: list[tuple] = [(RESET, self.cache.root_node.id, True)]
        out.extend(pieces(TOMBS, list(getattr(self.cache, "_closed_session_ids", None) or ())))
        out.extend(self._controller_sessions())
        return out

    # ----- the hooks -----

    def _hook(self) -> None:
        cache, wrap = self.cache, self._wrap

        def split(new: Any, key: Any, child: Any, split_len: int, *a: Any, **k: Any) -> None:
            self._split(new, child, split_len)

        def insert(result: Any, node: Any, *a: Any, **k: Any) -> None:
            last = result[1]
            added = last is not node and last.id >= self._next_id
            if added:
                self._next_id = last.id + 1
                self.records.append((ADD, last.id, last.parent.id, tokens_of(last.key), last.key.extra_key,
                                     last.last_access_time, getattr(last, "creation_time", last.last_access_time),
                                     int(last.hit_count), 0))
            chunked = k.get("chunked", a[3] if len(a) > 3 else False)
            self.records.append((TOUCH, last.id, node.id, node.last_access_time, not chunked, added))
            if self.watch is not None:
                self.watch.append(last)

        def match(result: Any, node: Any, *a: Any, **k: Any) -> None:
            self.records.append((TOUCH, result[1].id, node.id, node.last_access_time, False, False))
            if self.watch is not None:
                self.watch.append(result[1])

        def reset(result: Any, *a: Any, **k: Any) -> None:
            self.records.append((RESET, cache.root_node.id, False))
            self._next_id = max(self._next_id, type(cache.root_node).counter)

        def tag(result: Any, req: Any, *a: Any, **k: Any) -> None:
            sid = getattr(req, "session_id", None)
            if sid is None:
                return
            if self.active is not None:
                self.active.append(sid)
            node = k.get("node", a[1] if len(a) > 1 else None)
            if node is not None:  # (tagged or not: a closed session's request is its activity too)
                self.records.append((TAG, sid, node.id))
                if self.watch is not None:
                    self.watch.append(node)
            else:  # SGLang matched the node itself (it warns): each node the session holds, again
                leaves = (getattr(cache, "_session_leaves", None) or {}).get(sid) or (cache.root_node,)
                self.records.extend((TAG, sid, leaf.id) for leaf in leaves)
                if self.watch is not None:
                    self.watch.extend(leaves)

        wrap(cache, "_split_node", split)
        wrap(cache, "_insert_helper", insert)
        wrap(cache, "_match_prefix_helper", match)
        wrap(cache, "_delete_leaf", self._deleted)
        for name, kind in (("evict", EVICT), ("release_radix_session", CLOSE)):
            self._divert(cache, name, kind)
        wrap(cache, "reset", reset)
        wrap(cache, "inc_lock_ref", self._locked(LOCK))
        wrap(cache, "dec_lock_ref", self._locked(UNLOCK))
        wrap(cache, "_tag_session_leaf", tag)
        hook_requests(self, cache, cache if callable(getattr(cache, "release_radix_session", None)) else None)


class UnifiedRecorder(_Recorder):
    """Records every change of one SGLang 0.5.17+ ``UnifiedRadixCache`` on its Python tree core,
    the full component alone (scheduler thread only).

    The tree core's ``_add_new_node`` (``ADD``, with the node's ``session_ref`` and the key's
    ``cache_salt`` last), ``_split_node`` (``SPLIT``), ``_remove_leaf_from_parent`` (``DELETE``:
    the mirror moves the session marks off the deleted leaf as SGLang's component does),
    ``_touch_node`` and ``_inc_hit_count_and_check`` (``STAMP``: the node's access stamp and hits,
    as they are after), ``_match_post_processor`` (``MATCHED``: the best node and its stamp;
    each ancestor up to the root 1e-5 older, as SGLang stamps them), ``reset`` (``RESET``); the
    full component's locks (``LOCK``, ``UNLOCK``; not the host tier's), its ``register_session_leaf``
    (``TAG``), ``release_session`` (``RELEASED``) and marks (``MARK``, ``UNMARK``) where SGLang calls them
    other than through those; the session tracker's ``open_radix_session`` (``GEN``: the id
    and its generation), ``release_radix_session`` (``CLOSE``) and ``reset`` (``FORGET``).

    SGLang's stamps are a global counter (a numpy float): sent as Python floats, the same values.

    A call that makes other recorded calls of the sessions' (a leaf's removal moves session marks,
    a close releases its leaves) is one record: the mirror makes the same calls from it, as
    SGLang's code does, so what each changes is recorded once. The tree's own changes (a node
    added, split, stamped, locked) are recorded wherever they are made: the mirror's composite
    calls never make them, so none would be lost were SGLang to make one inside such a call."""

    def __init__(self, cache: Any, controller: Any = None) -> None:
        why = can_record(cache)
        if why is not None or not hasattr(cache, "tree_core"):
            raise TypeError(why or "not a UnifiedRadixCache: its recorder is ChangeRecorder")
        super().__init__()
        self.cache = cache
        self.core = cache.tree_core
        self.full = cache.components[FULL]
        self.refs = getattr(cache, "session_refs", None)
        self.controller = controller
        self._inside = 0
        """Calls of composite methods under way: the session calls they make are theirs, not recorded."""
        self._hook()
        if controller is not None:
            self._hook_controller(controller)
        setattr(cache, RECORDER, self)

    def root(self) -> Any:
        return self.core.root_node

    def state(self, node: Any) -> tuple:
        key, data = node.key, node.component_data[FULL]
        return (NODE, node.id, node.parent.id, tokens_of(key), key.extra_key, float(node.last_access_time),
                float(node.creation_time), node.hit_count, data.lock_ref, data.session_ref,
                getattr(key, "cache_salt", None), tuple(data.session_ids or ()))

    def ends(self) -> list[tuple]:
        root = self.core.root_node
        out: list[tuple] = [(RESET, root.id, True, float(root.last_access_time))]
        refs = self.refs
        if refs is not None:
            out.extend(pieces(TOMBS, list(getattr(refs, "_closed_session_ids", None) or ())))
            generations = getattr(refs, "_session_generations", None) or {}
            out.extend(pieces(GENS, list(generations), list(generations.values())))
        out.extend(self._controller_sessions())
        return out

    # ----- the hooks -----

    def _hook(self) -> None:
        core, full, wrap = self.core, self.full, self._wrap
        records = lambda: self.records  # noqa: E731  (stop() replaces the list)

        def added(node: Any, *a: Any, **k: Any) -> None:
            key, data = node.key, node.component_data[FULL]
            records().append((ADD, node.id, node.parent.id, tokens_of(key), key.extra_key, float(node.last_access_time),
                              float(node.creation_time), int(node.hit_count), data.lock_ref, data.session_ref,
                              getattr(key, "cache_salt", None)))
            if self.watch is not None:
                self.watch.append(node)

        def split(result: Any, key: Any, child: Any, split_len: int, *a: Any, **k: Any) -> None:
            records().append((SPLIT, result[0].id, child.id, int(split_len), float(result[0].last_access_time),
                              float(child.last_access_time)))
            if self.watch is not None:
                self.watch.append(child)

        def stamp(result: Any, node: Any, *a: Any, **k: Any) -> None:
            records().append((STAMP, node.id, float(node.last_access_time), int(node.hit_count)))
            if self.watch is not None:
                self.watch.append(node)

        def matched(result: Any, *a: Any, **k: Any) -> None:
            best = result.best_match_node
            node = core._node_arena.get(best)
            if node is not None:
                records().append((MATCHED, best, float(node.last_access_time)))
                if self.watch is not None:
                    self.watch.append(node)

        def reset(result: Any, *a: Any, **k: Any) -> None:
            root = core.root_node
            records().append((RESET, root.id, False, float(root.last_access_time)))

        def lock(kind: int) -> Callable[..., None]:
            def told(_returned: Any, *a: Any, **k: Any) -> None:  # (SGLang passes result=, params=)
                node = k["node"] if "node" in k else a[0]
                if not k.get("lock_host", a[2] if len(a) > 2 else False):
                    records().append((kind, node.id))
                    if self.watch is not None:
                        self.watch.append(node)
            return told

        def mark(kind: int) -> Callable[..., None]:
            def told(result: Any, sid: str, leaf: Any, *a: Any, **k: Any) -> None:
                if not self._inside:
                    records().append((kind, sid, leaf.id))
                    if self.watch is not None:
                        self.watch.append(leaf)
            return told

        def deleting(node: Any, *a: Any, **k: Any) -> list[Any]:
            self.gone.append(node.id)  # type: ignore[union-attr]  (while walked: watch and gone are lists)
            return [node.parent]  # (the session marks it held move up its path)

        def released(sid: Any, *a: Any, **k: Any) -> Any:
            self.active.append(sid)  # type: ignore[union-attr]
            return full._session_leaves.get(sid, ())

        def registered(sid: Any, leaf: Any = None, *a: Any, **k: Any) -> Any:
            self.active.append(sid)  # type: ignore[union-attr]
            return () if leaf is None else (leaf,)

        wrap(core, "_add_new_node", lambda result, *a, **k: added(result))
        wrap(core, "_split_node", split)
        wrap(core, "_touch_node", stamp)
        wrap(core, "_inc_hit_count_and_check", stamp)
        wrap(core, "_match_post_processor", matched)
        wrap(core, "reset", reset)
        wrap(full, "acquire_component_lock", lock(LOCK))
        wrap(full, "release_component_lock", lock(UNLOCK))
        wrap(full, "_mark_session_leaf", mark(MARK))
        wrap(full, "_unmark_session_leaf", mark(UNMARK))
        self._composite(core, "_remove_leaf_from_parent", lambda node, *a, **k: (DELETE, node.id), deleting)
        self._composite(full, "register_session_leaf",
                        lambda sid, leaf=None, *a, **k: (TAG, sid, None if leaf is None else leaf.id), registered)
        self._composite(full, "release_session", lambda sid, *a, **k: (RELEASED, sid), released)
        refs = self.refs
        if refs is not None:
            # (a close's nodes: told by the release_session it makes, where it makes one)
            self._composite(refs, "release_radix_session", lambda sid, *a, **k: (CLOSE, sid, []))
            wrap(refs, "open_radix_session",
                 lambda result, sid, *a, **k: records().append((GEN, sid, result)) if not self._inside else None)
            self._composite(refs, "reset", lambda *a, **k: (FORGET,))
        hook_requests(self, self.cache, refs)

    def _composite(self, owner: Any, name: str, record: Callable[..., tuple],
                   touches: Callable[..., Any] | None = None) -> None:
        """``owner.name`` as one record (made after SGLang's call returned; nothing it calls is
        recorded: the mirror makes those calls itself). ``touches``: the nodes whose paths the
        call may change, told before it (while the whole tree is walked; ``watch``)."""
        original = getattr(owner, name, None)
        if not callable(original):
            return

        @functools.wraps(original)
        def recorded(*a: Any, **k: Any) -> Any:
            if touches is not None and self.watch is not None:
                try:
                    self.watch.extend(touches(*a, **k))
                except Exception as exc:
                    self._failed(name, exc)
            self._inside += 1
            try:
                result = original(*a, **k)
            finally:
                self._inside -= 1
            if not self._inside:
                try:
                    self.records.append(record(*a, **k))
                except Exception as exc:
                    self._failed(name, exc)
            return result

        setattr(owner, name, recorded)

