"""The audit journal's old path, kept for one release (until 0.3): use ``http.server.audit``.

Code that embeds the server builds its ``AuditLog``; it lives in
``radixtop.adapters.http.server.audit`` now."""

from __future__ import annotations

from radixtop.adapters.http.server.audit import AuditLog, AuditUnavailable, Pending  # noqa: F401
