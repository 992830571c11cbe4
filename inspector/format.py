"""Styles for the dashboard: colour by share of memory; units come from adapters.units."""

from __future__ import annotations

from rich.style import Style

from radixtop.adapters.units import age, count, figures_note, human_bytes  # noqa: F401  (re-exported for the widgets)

_CONTROL = (*range(10), *range(11, 32), 127, *range(0x80, 0xA0))
_INERT = str.maketrans({c: "?" for c in map(chr, _CONTROL)})
_INERT_LINE = str.maketrans({c: "?" for c in map(chr, (*_CONTROL, 10))})


def inert(text: str, lines: bool = False) -> str:
    """Text from a target (ids, holders, decoded tokens) with every terminal control code replaced
    by '?'; line breaks kept only where ``lines``. (Shown as rich Text, never as markup.)"""
    return text.translate(_INERT if lines else _INERT_LINE)


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
