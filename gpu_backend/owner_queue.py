"""The owner-thread queue's name before 0.2, which docs/sglang.md showed to embedders: it is
``radixtop.gpu_backend.owner.queue`` now; this alias goes in 0.3."""

from radixtop.gpu_backend.owner.queue import (
    HOLD_S,
    READ_BUDGET_S,
    OwnerError,
    OwnerQueue,
    OwnerStopped,
    OwnerTimeout,
    gc_paused,
)

__all__ = ["HOLD_S", "READ_BUDGET_S", "OwnerError", "OwnerQueue", "OwnerStopped", "OwnerTimeout", "gc_paused"]
