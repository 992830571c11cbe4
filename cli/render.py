"""Output shared by the commands: one JSON document, and a rich Console that shows a target's strings as written."""

from __future__ import annotations

import json
from typing import Any

import typer


def emit_json(doc: Any) -> None:
    """``doc`` as exactly one compact JSON document on stdout (sets as lists)."""
    typer.echo(json.dumps(doc, separators=(",", ":"), default=list))


def plain_console() -> Any:
    """Rich without markup, highlighting or emoji codes: what the commands print quotes the
    target's strings (ids, names, text), which are shown as written, through ``inert``; the
    commands' own styles are Text styles."""
    from rich.console import Console
    from rich.segment import Segment

    from radixtop.adapters.text import inert

    class PlainConsole(Console):
        def _render_buffer(self, buffer):
            """The last guard of the one rule for a target's strings: whatever a command printed
            without ``inert`` still reaches the terminal with its hidden characters as '?' (rich's
            own control segments, its cursor moves, pass)."""
            return super()._render_buffer(
                segment if segment.control else Segment(inert(segment.text, lines=True), segment.style)
                for segment in buffer)

        def on_broken_pipe(self) -> None:
            """Rich exits 1 when the reader goes away; the command's own rule ends it quietly
            with 0 (``main._quiet_on_closed_pipe``)."""
            raise BrokenPipeError

    return PlainConsole(markup=False, highlight=False, emoji=False)


def installed_version() -> str | None:
    """radixtop's version as installed; None from a source tree never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("radixtop")
    except PackageNotFoundError:
        return None
