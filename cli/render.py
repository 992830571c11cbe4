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

    return Console(markup=False, highlight=False, emoji=False)
