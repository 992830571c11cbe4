"""Reads on a cache's owner thread, for an adapter that runs there (bundled, SGLang in process).

A read takes what it needs of the cache on the owner thread, between two of the owner's steps,
and builds its view on the reader's thread (``OffOwner``). A read that may need more than a
slice of the owner (a page of a node with 100k children, a sessions page, the first attribution
of a large cache) is a pass: a generator ``_<op>_pass(*owner, *args)`` that does a chunk of its
work between yields and returns the view; ``_call_pass(make)`` runs ``make(*owner)`` a slice at a
time between the owner's steps (the caller waits; no hold is longer than a slice).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from radixtop.adapters.base import Read, check_paths, check_reads, subtree_pass
from radixtop.adapters.errors import AdapterError, TargetTimeout, TargetUnreachable
from radixtop.adapters.model import ChildrenPage, NodeView, PathsView, SubtreeView
from radixtop.gpu_backend.owner.slices import LongestOfLate

T = TypeVar("T")

ONE_VIEW_S = 0.0015
"""A ``read_many`` pass runs its reads in one hold of the owner (one view of the cache) while the
next, as long as the longest read of late, would end within this; then it lets the owner take a
step before it (a hold of its own)."""


REREAD_S = 0.002
"""A batch whose reads the owner's turns split, and that the tree changed meanwhile, is read
again in one hold only if its reads took at most this of the owner's time (a dashboard's poll of
a small cache, where a flush in a turn showed '0 nodes' beside the old rows). A larger batch keeps
its results (its reads a few owner steps apart): one hold must stay short."""


class OffOwner:
    """What a read takes of the cache on the owner thread, as plain values, with ``finish`` to
    turn them into the read's view on the reader's thread (building views and decoding their
    text cost more than taking the values: none of it holds the owner). ``finish`` must not
    touch the cache."""

    __slots__ = ("finish",)

    def __init__(self, finish: Callable[[], Any]) -> None:
        self.finish = finish


def finished(result: Any) -> Any:
    """A read's result, its ``OffOwner`` part done here (on the reader's thread)."""
    return result.finish() if isinstance(result, OffOwner) else result


class OwnerReads:
    """``read_many`` and ``subtree`` as passes on the owner thread, for a ``CacheAdapter`` that
    owns its cache's thread. ``read_many`` is one pass over all its reads; it yields before a read
    that would end past ``ONE_VIEW_S``, so a batch that small is one view of the cache, taken in
    one hold; a read without a pass of its own runs inline in it (its own ``_call`` finds
    ``_in_pass()`` set). The adapter calls ``_init_owner_reads()`` in its ``__init__`` and
    provides ``_call_pass``, ``_node_pass`` and ``_children_pass``."""

    _pass_owner: threading.local
    """Per reader thread: the owner's arguments while a read runs inline in a pass."""
    _one_read: LongestOfLate
    """The longest read (or chunk of one) of late: what the next may take."""

    def _init_owner_reads(self) -> None:
        self._pass_owner = threading.local()
        self._one_read = LongestOfLate()

    # ----- what the adapter provides -----

    def _call_pass(self, make: Callable[..., Generator[None, None, T]]) -> T:
        """``make(*owner)``, a pass, run a slice at a time between the owner's steps; its result."""
        raise NotImplementedError

    def _node_pass(self, *owner_and_args: Any) -> Generator[None, None, Any]:
        raise NotImplementedError

    def _children_pass(self, *owner_and_args: Any) -> Generator[None, None, Any]:
        raise NotImplementedError

    # ----- reads -----

    def read_many(self, reads: Sequence[Read]) -> list[Any]:
        """The reads' results, all of one moment of the cache: where the owner's turns between
        them (a batch past ``ONE_VIEW_S``) changed the tree (an action, or the owner's own step),
        the batch is read again at once, in one hold: a poll's stats never say the tree before
        a flush beside its pages after it. (A read of its own chunks, a wide node's page, is
        exact as of its last chunk, and keeps what it ranked: read again, it costs little.)"""
        checked = check_reads(reads)
        one_read = self._one_read

        def batch(*owner: Any) -> Generator[None, None, list[Any]]:
            version = self._tree_version(*owner)
            results, work = yield from self._batch_pass(owner, checked, one_read, hold=False)
            # the version only grows: equal, unchanged. A batch read again must fit in one short
            # hold: one that took more (a first ranking, a 1M-node cache) keeps its results.
            if self._tree_version(*owner) != version and work <= REREAD_S:
                results, _ = yield from self._batch_pass(owner, checked, one_read, hold=True)
            return results

        return [finished(r) for r in self._call_pass(batch)]

    def _batch_pass(self, owner: tuple[Any, ...], checked: Sequence[Read], one_read: LongestOfLate,
                    hold: bool) -> Generator[None, None, tuple[list[Any], float]]:
        """The reads in order, and the owner's time they took, giving the owner its turn before a
        read that would end past the view budget and between a read's own chunks; ``hold``:
        never (the batch is one hold)."""
        results: list[Any] = []
        work = 0.0
        started = time.perf_counter()
        for op, args in checked:
            # a large cache: the owner's turn before a read that would end past the budget
            if not hold and results and time.perf_counter() - started + one_read.seconds > ONE_VIEW_S:
                yield
                started = time.perf_counter()
            read = self._read_pass(owner, op, args)
            while True:  # ``yield from``, each of the read's own chunks timed
                began, began_cpu = time.perf_counter(), time.thread_time()
                try:
                    next(read)
                except StopIteration as done:
                    results.append(done.value)
                    break
                finally:
                    one_read.record(time.perf_counter() - began)
                    # the work on the owner's own CPU clock: on a busy machine a chunk's wall time
                    # is mostly other threads', and a small batch counted long was not read again
                    work += time.thread_time() - began_cpu
                if not hold:
                    yield
                    started = time.perf_counter()
        return results, work

    def _tree_version(self, *owner: Any) -> int | None:
        """The cache's change version (it grows with every change of the tree), read on the owner
        thread; None where the adapter cannot tell (then a batch is never read again). By default
        the bundled engine's: its scheduler, the owner's argument, has the cache."""
        cache = getattr(owner[0], "cache", None) if owner else None
        version = getattr(cache, "version", None)
        return version if isinstance(version, int) else None

    def subtree(self, node_id: int = 0, depth: int = 3, limit: int = 10, order: str = "bytes",
                min_bytes: int = 0) -> SubtreeView:
        """``CacheAdapter.subtree`` in one pass on the owner: one view of the cache while its
        pages are cheap (a page that ranks 100k children in chunks lets the owner take steps between)."""
        return self._read_alone("subtree", (node_id, depth, limit, order, min_bytes))

    def paths(self, node_ids: Sequence[int]) -> PathsView:
        """``CacheAdapter.paths`` in one pass on the owner (its ``_paths_pass``): one view while
        the paths are small (see PathsView)."""
        return self._read_alone("paths", (check_paths(node_ids),))

    def _read_alone(self, op: str, args: tuple[Any, ...]) -> Any:
        """One read as a ``read_many`` pass of its own: its view, or the error it met, raised."""
        result = self.read_many([(op, args)])[0]
        if isinstance(result, AdapterError):
            raise result
        return result

    def _subtree_pass(self, owner: tuple[Any, ...], node_id: int = 0, depth: int = 3, limit: int = 10,
                      order: str = "bytes", min_bytes: int = 0) -> Generator[None, None, SubtreeView]:
        def node_of(i: int) -> Generator[None, None, NodeView]:
            return finished((yield from self._node_pass(*owner, i, 0, 1))).node

        def children_of(i: int, lim: int) -> Generator[None, None, ChildrenPage]:
            return finished((yield from self._children_pass(*owner, i, 0, lim, order)))

        return (yield from subtree_pass(node_of, children_of, node_id, depth, limit, order, min_bytes))

    def _read_pass(self, owner: tuple[Any, ...], op: str, args: tuple[Any, ...]) -> Generator[None, None, Any]:
        """One read of a ``read_many`` pass: its result, or the AdapterError it met."""
        own_pass = getattr(self, f"_{op}_pass", None)
        try:
            if op == "subtree":
                return (yield from self._subtree_pass(owner, *args))
            if own_pass is None:
                self._pass_owner.owner = owner
                try:
                    return getattr(self, op)(*args)
                finally:
                    self._pass_owner.owner = None
            return (yield from own_pass(*owner, *args))
        except (TargetUnreachable, TargetTimeout):
            raise
        except AdapterError as exc:
            return exc
        except Exception as exc:
            mapped = self._read_failed(exc)
            if mapped is None:
                raise
            return mapped

    def _read_failed(self, exc: Exception) -> AdapterError | None:
        """The AdapterError an unexpected exception of a read stands for (None: raise it)."""
        return None

    def _in_pass(self) -> tuple[Any, ...] | None:
        """The owner's arguments while a read runs inline in a pass on this thread; else None."""
        return getattr(self._pass_owner, "owner", None)

