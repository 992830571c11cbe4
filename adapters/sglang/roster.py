"""The sessions SGLang knows open, followed as they open and close: no read diffs every id.

SGLang keeps them in its own maps: the scheduler's ``SessionController.sessions`` (/open_session,
/close_session, its timeouts) and, on 0.5.17+ ``UnifiedRadixCache`` with sessions, the generation
its session tracker opens for every request that carries a session id; the tombstones of closed
ones in the 0.5.15/0.5.16 cache or in that tracker. ``known(sid)`` reads those maps live, O(1).
Hooks on the methods that change them (on the instances, once per object, as the index's) tell
the ledger each session whose listing moved (``SessionLedger.listing_moved``: O(1) each), so the
sessions' orders re-key only those: the controller's ``open`` and ``_close``, the tracker's
``open_radix_session``, ``release_radix_session`` and ``reset``, the 0.5.16 cache's
``release_radix_session`` and ``reset``. What was open before radixtop came goes on the orders'
first roster (``ids``, at the adapter's construction), which their reads take a chunk a step.

A caller that gives only a function returning ids (``listed``), or an SGLang whose methods are not
there to hook, has its ids diffed whenever their count changes (``catch_up``: O(ids) then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from radixtop.adapters.sglang.index import _wrap
from radixtop.adapters.sglang.trees import SGLangTree

HOOKED = "_radixtop_roster"
"""Set on each object whose methods are wrapped (once per object, as the index's hooks): the
newest roster over it, which its hooks tell."""


def _told(owner: Any, what: str) -> Any:
    """A hook that tells the newest roster over ``owner`` (its method ``what``)."""
    return lambda *a, **k: getattr(getattr(owner, HOOKED), what)(*a, **k)


class OpenSessions:
    """Which sessions SGLang knows open, for one adapter's orders (scheduler thread only)."""

    def __init__(self, tree: SGLangTree, ledger: Any, controller: Any = None,
                 listed: Callable[[], Iterable[str]] | None = None):
        self.tree = tree
        self.ledger = ledger
        self._controller = None
        self._lists: list[Callable[[], Iterable[str]]] = [listed] if listed is not None else []
        if controller is not None:
            if self._follow_controller(controller):
                self._controller = controller
            else:  # no methods to hook: its ids diffed
                self._lists.append(lambda: getattr(controller, "sessions", None) or ())
        self._generations = tree.open_ids if self._follow_tracker() else None
        if self._generations is None and tree.policy is not None:
            self._lists.append(tree.open_ids)
        self._tombs: set[str] = set(tree.closed())  # 8,192 at most: kept as SGLang's own change
        self._follow_tombstones()
        self._listed: set[str] = set()
        self._count: int | None = None
        self.catch_up()

    # ----- the hooks -----

    def _moved(self, sid: Any) -> None:
        if isinstance(sid, str):
            self.ledger.listing_moved(sid)

    def _once(self, owner: Any) -> bool:
        """Whether ``owner`` is still to hook; this roster is the one its hooks tell from now on."""
        first = not hasattr(owner, HOOKED)
        setattr(owner, HOOKED, self)
        return first

    def _follow_controller(self, controller: Any) -> bool:
        if not (callable(getattr(controller, "open", None)) and callable(getattr(controller, "_close", None))):
            return False
        if self._once(controller):
            _wrap(controller, "open", _told(controller, "_opened_by"))
            _wrap(controller, "_close", _told(controller, "_closed_by"))
        return True

    def _follow_tracker(self) -> bool:
        """0.5.17+ ``UnifiedRadixCache``: its session tracker's generations and tombstones."""
        refs = getattr(self.tree.cache, "session_refs", None) if self.tree.policy is not None else None
        names = ("open_radix_session", "release_radix_session", "reset")
        if refs is None or not all(callable(getattr(refs, n, None)) for n in names):
            return False
        if self._once(refs):
            _wrap(refs, "open_radix_session", _told(refs, "_opened"), _told(refs, "_before"))
            _wrap(refs, "release_radix_session", _told(refs, "_closed"), _told(refs, "_before"))
            _wrap(refs, "reset", _told(refs, "_reset"),
                  lambda *a, **k: (refs._session_generations, refs._closed_session_ids))
        return True

    def _follow_tombstones(self) -> None:
        """0.5.15/0.5.16: the cache's close and reset (the tracker's on 0.5.17+)."""
        cache = self.tree.cache
        if self.tree.policy is None or hasattr(cache, "session_refs") or not self._once(cache):
            return
        _wrap(cache, "release_radix_session", _told(cache, "_closed"), _told(cache, "_before"))
        _wrap(cache, "reset", _told(cache, "_reset"), lambda *a, **k: (getattr(cache, "_closed_session_ids", None) or (),))

    def _opened_by(self, result: Any, req: Any, *a: Any, **k: Any) -> None:  # SessionController.open
        self._moved(getattr(req, "session_id", None))

    def _closed_by(self, result: Any, sid: Any, *a: Any, **k: Any) -> None:  # SessionController._close
        self._moved(sid)

    def _before(self, *a: Any, **k: Any) -> str | None:
        """Before SGLang opens or closes: the tombstones checked, and the oldest, which a close
        may push out."""
        self.check_tombstones()
        return next(iter(self.tree.closed()), None)

    def _opened(self, oldest: str | None, sid: Any, *a: Any, **k: Any) -> None:
        self._tombs.discard(sid)  # an open clears its tombstone (0.5.17+)
        self._moved(sid)

    def _closed(self, oldest: str | None, sid: Any, *a: Any, **k: Any) -> None:
        closed = self.tree.closed()
        if sid in closed:
            self._tombs.add(sid)
        if oldest is not None and oldest not in closed:  # its tombstone fell off: listed as open again
            self._tombs.discard(oldest)
            self._moved(oldest)
        self._moved(sid)

    def _reset(self, old: Iterable[Iterable[str]], *a: Any, **k: Any) -> None:
        """A reset: every session SGLang knew (the maps it dropped) moved (a set update each: the
        reset itself is SGLang's pass over its whole tree)."""
        for ids in old:
            self.ledger.listings_moved(ids)
        self._tombs = set(self.tree.closed())

    def check_tombstones(self) -> None:
        """Tombstones that came or went untold (SGLang 0.5.16 clears none but by a reset; a
        register emulated by popping one, as the tests' replayer does): diffed where their count
        differs from those told (8,192 at most, then)."""
        closed = self.tree.closed()
        if len(closed) != len(self._tombs):
            now = set(closed)
            self.ledger.listings_moved(now ^ self._tombs)
            self._tombs = now

    # ----- reads -----

    def known(self, sid: str) -> bool:
        """Whether SGLang knows ``sid`` open now (its own maps, read live)."""
        controller = self._controller
        if controller is not None and sid in controller.sessions:
            return True
        if self._generations is not None and sid in self._generations():
            return True
        return sid in self._listed

    def ids(self) -> Iterator[str]:
        """Every session SGLang knows open (duplicates possible): the orders' first roster, and
        the tests' oracle; O(sessions), never a read's."""
        if self._controller is not None:
            yield from self._controller.sessions
        if self._generations is not None:
            yield from self._generations()
        yield from self._listed

    def catch_up(self) -> None:
        """Ids given by a function only (``listed``, or maps not followed): diffed where their count
        moved since the last read (O(ids) then; none for the maps the hooks follow)."""
        self.check_tombstones()
        if not self._lists:
            return
        groups = [list(ids()) for ids in self._lists]
        count = sum(map(len, groups))
        if count == self._count:
            return
        self._count = count
        now = set().union(*groups)
        if now != self._listed:
            self.ledger.listings_moved(now ^ self._listed)
            self._listed = now
