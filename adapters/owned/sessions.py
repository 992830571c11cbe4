"""Sessions pages and details from a cache's kept figures (``gpu_backend.ledger``): exact as of
the owner step that serves them, for the in-process adapters (bundled and SGLang)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

from radixtop.adapters.errors import unknown_session
from radixtop.adapters.model import SessionsPage, SessionView
from radixtop.gpu_backend.ledger import SessionOrders
from radixtop.gpu_backend.ledger.orders import SessionRow

VIEWS_CHUNK = 256
"""Session rows turned into views per slice."""


def sessions_page_pass(orders: SessionOrders, order: str, offset: int, limit: int, contains: str = "",
                       reverse: bool = False, clock: Callable[[], float] = time.monotonic,
                       ) -> Generator[None, None, SessionsPage]:
    """A sessions page (``CacheAdapter.sessions``) as a pass on the owner thread: its figures
    are the ledger's now, and so is its ranking (age 0, current), except a page ranked at its read
    (a filtered or deep page by fair share or locked tokens, or one the ledger cannot keep): that
    ranking may be reused a while (its age). ``clock``: the clock of the sessions' last activity."""
    rows, total, listed, age = yield from orders.page_pass(order, offset, limit, contains, reverse)
    return SessionsPage(offset, limit, total, order, (yield from views_pass(rows, clock())), age, False,
                        contains.strip(), reverse, listed, figures_current=age == 0.0)


def session_view(row: SessionRow, now: float) -> SessionView:
    sid, closed, tagged, exclusive, shared, fair, locked, seen_at = row
    return SessionView(id=sid, state="closed" if closed else "open", tagged_nodes=tagged,
                       exclusive_bytes=exclusive, shared_bytes=shared, fair_share_bytes=fair,
                       locked_tokens=locked,
                       last_activity_age_s=None if seen_at is None else max(0.0, now - seen_at))


def views_pass(rows: list[SessionRow], now: float) -> Generator[None, None, tuple[SessionView, ...]]:
    views = []
    for start in range(0, len(rows), VIEWS_CHUNK):
        views.extend(session_view(r, now) for r in rows[start : start + VIEWS_CHUNK])
        if start + VIEWS_CHUNK < len(rows):
            yield
    return tuple(views)


def session_row(orders: SessionOrders, session_id: str, clock: Callable[[], float] = time.monotonic) -> SessionView:
    """One session's view now; an unknown one is an error."""
    if not orders.listed(session_id):
        raise unknown_session(session_id)
    return session_view(orders.row(session_id), clock())
