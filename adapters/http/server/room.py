"""Room kept on disk for the audit journal's outcomes: blocks allocated past the journal's end
(Linux ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``), which later appends fill without asking the
file system for space. On a file system that cannot (no ``fallocate``), nothing is kept and
``reserve`` says so once in the log."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys

logger = logging.getLogger(__name__)

FALLOC_FL_KEEP_SIZE = 0x01
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _libc_fallocate():  # the C function, or None off Linux
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = getattr(libc, "fallocate64", None) or libc.fallocate  # (musl has only the one)
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fallocate.restype = ctypes.c_int
    return fallocate


class Room:
    """Keeps ``length`` bytes allocated from ``offset`` in an open file, its size unchanged."""

    def __init__(self) -> None:
        self._fallocate = _libc_fallocate()

    def reserve(self, fd: int, offset: int, length: int) -> None:
        """Allocate ``[offset, offset + length)`` (what is allocated already costs nothing);
        OSError (ENOSPC) when the file system has not that much room left."""
        if self._fallocate is None or length <= 0:
            return
        if self._fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length) == 0:
            return
        code = ctypes.get_errno()
        if code in _UNSUPPORTED:
            self._fallocate = None  # (so this is said once)
            logger.warning("the audit log's file system cannot keep room for outcomes (%s): on a full "
                           "disk an action that ran may be journaled without its outcome", os.strerror(code))
            return
        raise OSError(code, os.strerror(code))
