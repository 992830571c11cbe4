"""What the adapters that run on a cache's owner thread share: calls there with the owner's
failures in the contract's words, and the size of their ranking chunks."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from radixtop.adapters.errors import TargetTimeout, TargetUnreachable, read_only
from radixtop.gpu_backend.owner.queue import OwnerStopped, OwnerTimeout

T = TypeVar("T")

SORT_CHUNK = 1024
"""Children ranked at once; a wider node is ranked in chunks of this many, one a yield."""


def smallest_in_steps(items: list[Any], want: int, key: Callable[[Any], Any]) -> Generator[None, None, list[Any]]:
    """The ``want`` smallest of ``items`` by ``key``, in order, as a pass whose every step keys
    at most about two chunks of ``SORT_CHUNK``: near the top a running ``nsmallest`` a chunk a
    step; deeper (a far page), the items sorted in runs of a chunk a step, then the runs merged
    a chunk of items a step (a running nsmallest of 150,000 redid 150,000 items every step)."""
    if want <= SORT_CHUNK:
        best: list[Any] = []
        for start in range(0, len(items), SORT_CHUNK):
            best = heapq.nsmallest(want, [*best, *items[start : start + SORT_CHUNK]], key=key)
            if len(items) > SORT_CHUNK:
                yield
        return best
    runs = []
    for start in range(0, len(items), SORT_CHUNK):
        runs.append(sorted(((key(item), item) for item in items[start : start + SORT_CHUNK]),
                           key=lambda pair: pair[0]))
        yield
    out: list[Any] = []
    for pair in heapq.merge(*runs, key=lambda pair: pair[0]):
        if len(out) == want:
            break
        out.append(pair[1])
        if len(out) % SORT_CHUNK == 0:
            yield
    return out


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


ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(value: str | None, name: str, default: bool) -> bool:
    """An on/off setting (``name``, from the environment) as it is written: 1/true/yes/on, or
    0/false/no/off, or ``default`` where it is unset or empty; anything else a ValueError in one
    line (a misspelt ``RADIXTOP_READ_ONLY`` must not leave the actions on)."""
    raw = (value or "").strip().lower()
    if not raw:
        return default
    if raw in ON:
        return True
    if raw in OFF:
        return False
    raise ValueError(f"{name} must be 1 (on) or 0 (off), not {raw[:40]!r}")
