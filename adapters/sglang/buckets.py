"""SGLang's own memory buckets, per component, as its leak check computes them.

SGLang checks its pools when idle, and when busy if asked
(``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY``): per component (``full``, and ``swa`` or
``mamba`` on hybrid models) ``available + evictable + protected + session_held + uncached ==
total``, and on a mismatch logs ``pool memory leak detected! [full] total=..., available=...``
(sgl-project/sglang#35270). The scheduler's ``invariant_checker`` decides which figures go into
each component's check (``_check_full_pool``, ``_check_swa_pool``, ``_check_mamba_pool``, each
calling ``_check_pool_invariant(name, available, evictable, protected, session_held, total,
uncached)``). radixtop runs those same methods, as the busy check does (``uncached`` from
``_get_total_uncached_sizes``), and records the arguments of each ``_check_pool_invariant`` call:
the buckets are SGLang's figures, by SGLang's names, never recomputed here. It runs on the
scheduler thread (the plugin's ``stats``), between batches. Present in 0.5.16 and 0.5.23; where a
later SGLang changes these methods, stats go on without buckets and one warning says why.
"""

from __future__ import annotations

import logging
from typing import Any

from radixtop.adapters.model import Bucket

log = logging.getLogger("radixtop.sglang")


def sglang_buckets(scheduler: Any) -> tuple[Bucket, ...] | None:
    """The buckets of every component SGLang checks, or None where this SGLang has no such check
    (or it failed: logged once per kind of failure, the rest of the stats still served)."""
    checker = getattr(scheduler, "invariant_checker", None)
    observer = getattr(scheduler, "pool_stats_observer", None)
    if checker is None or observer is None or not hasattr(checker, "_check_pool_invariant"):
        return None
    rows: list[Bucket] = []
    cls = type(checker)
    original = cls.__dict__.get("_check_pool_invariant")
    if not isinstance(original, staticmethod):
        _warn_once(f"TypeError: {cls.__name__}._check_pool_invariant is not a staticmethod")
        return None
    check = original.__func__

    def record(pool_name: str, available: int, evictable: int, protected: int, session_held: int,
               total: int, uncached: int | None = 0) -> Any:
        rows.append(Bucket(str(pool_name), int(total), int(available), int(evictable), int(protected),
                           int(session_held), None if uncached is None else int(uncached)))
        return check(pool_name, available, evictable, protected, session_held, total, uncached or 0)

    # The checker is a slotted dataclass: its class's method is swapped for the length of this
    # call, on the scheduler thread (the only thread that runs SGLang's own checks), then put back.
    cls._check_pool_invariant = staticmethod(record)
    try:
        full, swa = _uncached(checker)
        ps = observer.get_pool_stats()
        checker._check_full_pool(ps, uncached=full)
        if getattr(checker, "is_hybrid_swa", False):
            checker._check_swa_pool(ps, uncached=swa)
        if getattr(checker, "is_hybrid_ssm", False) and checker.tree_cache.supports_mamba():
            checker._check_mamba_pool(ps)
    except Exception as exc:  # a shape of SGLang this does not know: no buckets, never a failed read
        _warn_once(f"{type(exc).__name__}: {exc}")
        return None
    finally:
        cls._check_pool_invariant = original
    return tuple(rows) or None


def _uncached(checker: Any) -> tuple[int | None, int | None]:
    """(full, swa) slots the running requests own beyond their cached prefix, by SGLang's own
    ``_get_total_uncached_sizes``; 0 when nothing has run since the last idle (SGLang's busy
    check skips then too); None where it cannot be read."""
    if checker.get_last_batch() is None:
        return 0, 0
    try:
        full, swa = checker._get_total_uncached_sizes()
    except Exception as exc:
        _warn_once(f"uncached: {type(exc).__name__}: {exc}")
        return None, None
    return int(full), int(swa)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    kind = message.split(":", 1)[0]
    if kind not in _warned:
        _warned.add(kind)
        log.warning("radixtop: SGLang's memory buckets could not be read (%s); stats go on without them", message)
