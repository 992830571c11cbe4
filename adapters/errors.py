"""The adapter contract's typed errors: every face turns these, and only these, into a message.

``code`` is stable and machine-readable (the HTTP API's error body, the CLI's JSON); ``http_status``
is what the admin API answers with.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base of every error a face may show; ``code`` is stable and machine-readable."""

    code = "error"
    http_status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(AdapterError):
    code = "bad_request"
    http_status = 422


class UnknownNode(AdapterError):
    code = "unknown_node"
    http_status = 404


class UnknownSession(AdapterError):
    code = "unknown_session"
    http_status = 404


class ReadOnly(AdapterError):
    code = "read_only"
    http_status = 403


class Unsupported(AdapterError):
    """The target cannot do this at all (see its capability flags)."""

    code = "unsupported"
    http_status = 501


class Unauthorized(AdapterError):
    code = "unauthorized"
    http_status = 401


class TargetUnreachable(AdapterError):
    code = "target_unreachable"
    http_status = 503


class TargetTimeout(AdapterError):
    code = "target_timeout"
    http_status = 504


ERRORS_BY_CODE: dict[str, type[AdapterError]] = {
    cls.code: cls
    for cls in (AdapterError, BadRequest, UnknownNode, UnknownSession, ReadOnly, Unsupported,
                Unauthorized, TargetUnreachable, TargetTimeout)
}


# ----- one wording for each error every adapter raises -----


def read_only(name: str, action: str, why: str = "") -> ReadOnly:
    """``name is read-only (why): action refused``: the refusal of an action by a read-only target."""
    return ReadOnly(f"{name} is read-only{f' ({why})' if why else ''}: {action} refused")


def unknown_node(node_id: int, gone: str = "evicted, freed, or never existed") -> UnknownNode:
    return UnknownNode(f"node {node_id} is not in the tree ({gone})")


def unknown_session(session_id: str) -> UnknownSession:
    return UnknownSession(f"session {session_id!r} is not known (never seen, or long gone)")
