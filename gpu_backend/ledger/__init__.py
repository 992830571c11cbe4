"""Every session's memory figures, kept with the tree as it changes (no pass over the tree or the
sessions): ``SessionLedger`` follows each change in O(depth), ``SessionOrders`` ranks the sessions
for a page in O(log n + page)."""

from radixtop.gpu_backend.ledger.figures import SessionLedger
from radixtop.gpu_backend.ledger.orders import KEPT_ORDERS, SessionOrders

__all__ = ["KEPT_ORDERS", "SessionLedger", "SessionOrders"]
