"""The adapter contract's typed errors: every face turns these, and only these, into a message.

``code`` is stable and machine-readable (the HTTP API's error body, the CLI's JSON); ``http_status``
is what the admin API answers with.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base of every error a face may show; ``code`` is stable and machine-readable. A subclass
    names its own: ``class Gone(AdapterError, code="gone", http_status=410)``."""

    code = "error"
    http_status = 500

    def __init_subclass__(cls, code: str | None = None, http_status: int | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if http_status is not None:
            cls.http_status = http_status

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(AdapterError, code="bad_request", http_status=422):
    """Arguments out of their bounds or of the wrong shape: nothing was done."""


class UnknownNode(AdapterError, code="unknown_node", http_status=404):
    """No such node in the tree now: evicted, freed, or never there."""


class UnknownSession(AdapterError, code="unknown_session", http_status=404):
    """No such session: never seen, or long gone."""


class ReadOnly(AdapterError, code="read_only", http_status=403):
    """An action refused because the target (or the token) is read-only."""


class Unsupported(AdapterError, code="unsupported", http_status=501):
    """The target cannot do this at all (see its capability flags)."""


class Unauthorized(AdapterError, code="unauthorized", http_status=401):
    """A wrong or missing token."""


class TargetUnreachable(AdapterError, code="target_unreachable", http_status=503):
    """The target is down, or its owner thread has stopped."""


class NotReady(AdapterError, code="not_ready", http_status=503):
    """The target is up but cannot do this yet (radixtop's copy of the tree is still coming):
    retry shortly."""


class TargetTimeout(AdapterError, code="target_timeout", http_status=504):
    """The target, or its owner thread, did not answer in time."""


ERRORS_BY_CODE: dict[str, type[AdapterError]] = {
    cls.code: cls
    for cls in (AdapterError, BadRequest, UnknownNode, UnknownSession, ReadOnly, Unsupported,
                Unauthorized, TargetUnreachable, NotReady, TargetTimeout)
}


# ----- one wording for each error every adapter raises -----


def read_only(name: str, action: str, why: str = "") -> ReadOnly:
    """``name is read-only (why): action refused``: the refusal of an action by a read-only target."""
    return ReadOnly(f"{name} is read-only{f' ({why})' if why else ''}: {action} refused")


def unknown_node(node_id: int, gone: str = "evicted, freed, or never existed") -> UnknownNode:
    return UnknownNode(f"node {node_id} is not in the tree ({gone})")


def unknown_session(session_id: str) -> UnknownSession:
    return UnknownSession(f"session {session_id!r} is not known (never seen, or long gone)")
