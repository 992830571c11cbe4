"""One way out of a command: its exit codes, the one mapping from domain errors to them, one line on stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import typer

from radixtop.adapters.errors import AdapterError, BadRequest, TargetTimeout, TargetUnreachable
from radixtop.adapters.text import inert

EXIT_REFUSED = 1
"""Refused, an unknown id, a missing extra, or the command's own work failed."""
EXIT_USAGE = 2
"""A bad option, value or combination: nothing was done."""
EXIT_UNREACHABLE = 3
"""The target did not answer: unreachable, or timed out."""


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message names the extra that brings it."""


EXIT_CODES: dict[type[Exception], int] = {
    BadRequest: EXIT_USAGE,  # a URL, token or value the target refuses before anything runs
    TargetUnreachable: EXIT_UNREACHABLE,
    TargetTimeout: EXIT_UNREACHABLE,
    AdapterError: EXIT_REFUSED,  # every other typed error: refused, unknown id, read-only, unsupported
    ValueError: EXIT_USAGE,  # a value the command checks itself
    MissingExtra: EXIT_REFUSED,
}
"""The exit code of each kind of error; an error takes its nearest class's, else EXIT_REFUSED."""


def exit_code(exc: BaseException) -> int:
    """The exit code EXIT_CODES gives ``exc``'s class or its nearest base."""
    return next((EXIT_CODES[cls] for cls in type(exc).__mro__ if cls in EXIT_CODES), EXIT_REFUSED)


def fail(message: str, code: int = EXIT_REFUSED, lines: bool = False) -> typer.Exit:
    """Say ``message`` on stderr as one line (control codes made visible: it may quote a target's
    words; line breaks kept only where ``lines``), and return the exit to raise: never a traceback."""
    typer.echo(f"radixtop: {inert(message, lines)}", err=True)
    return typer.Exit(code)


@contextlib.contextmanager
def exits(*kinds: type[Exception], lines: bool = False) -> Iterator[None]:
    """Turn an error of ``kinds`` raised in the block into its line and exit code (``fail``'s ``lines``)."""
    try:
        yield
    except kinds as exc:
        raise fail(exc.message if isinstance(exc, AdapterError) else str(exc), exit_code(exc), lines) from None


@contextlib.contextmanager
def trace_errors(trace: Path | None) -> Iterator[None]:
    """A trace that cannot be read (exit 2), a line it cannot apply (exit 1, the line named), or a
    bad value (exit 2): one line each."""
    from radixtop.gpu_backend.traces.ops import TraceError  # late: the engine's imports are heavy

    try:
        yield
    except OSError as exc:
        raise fail(f"cannot read trace {trace}: {exc.strerror or exc}", EXIT_USAGE) from None
    except TraceError as exc:
        raise fail(f"{trace}: {exc}", EXIT_REFUSED) from None
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
