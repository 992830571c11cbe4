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

    class PlainConsole(Console):
        def on_broken_pipe(self) -> None:
            """Rich exits 1 when the reader goes away; the command's own rule ends it quietly
            with 0 (``main._quiet_on_closed_pipe``)."""
            raise BrokenPipeError

    return PlainConsole(markup=False, highlight=False, emoji=False)
