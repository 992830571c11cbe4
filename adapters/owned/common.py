"""What the adapters that run on a cache's owner thread share: calls there with the owner's
failures in the contract's words, and the size of their ranking chunks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from radixtop.adapters.errors import TargetTimeout, TargetUnreachable, read_only
from radixtop.gpu_backend.owner.queue import OwnerStopped, OwnerTimeout

T = TypeVar("T")

SORT_CHUNK = 1024
"""Children ranked at once; a wider node is ranked in chunks of this many, one a yield."""


def owner_call(run: Callable[[], T], name: str) -> T:
    """``run()``, a call handed to the owner thread, with the owner's failures in the contract's
    words: not taken in time is TargetTimeout, a stopped or dead owner TargetUnreachable, each
    led by the target's ``name``."""
    try:
        return run()
    except OwnerTimeout as exc:
        raise TargetTimeout(f"{name}: {exc}") from None
    except OwnerStopped as exc:
        raise TargetUnreachable(f"{name}: {exc}") from None


def refuse_if_read_only(adapter: Any, action: str) -> None:
    """ReadOnly (in ``errors.read_only``'s one wording) for ``action`` where ``adapter`` is read-only."""
    if adapter.read_only:
        raise read_only(adapter.name, action)
