"""Styles and markup for the dashboard: colour by share of memory, text shown as written inside
markup (the text itself comes from adapters.text)."""

from __future__ import annotations

from rich.style import Style

_SHARE_STYLES = [
    (0.25, Style(color="red", bold=True)),
    (0.10, Style(color="dark_orange")),
    (0.03, Style(color="yellow")),
    (0.005, Style(color="green")),
    (0.0, Style(color="grey62")),
]


def share_style(share: float) -> Style:
    """Hotter colours for nodes whose subtree holds more of the cache."""
    for threshold, style in _SHARE_STYLES:
        if share >= threshold:
            return style
    return _SHARE_STYLES[-1][1]


def literal(text: str) -> str:
    """``text`` shown as written inside Textual markup: every ``[`` escaped (Rich's ``escape``
    leaves a ``[`` that opens no tag, and Textual then reads ``[b][[/]`` as the text ``[[/]``)."""
    return text.replace("[", "\\[")
