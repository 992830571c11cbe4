"""The dashboard at 80x24 (issue 26, item 3): node ids are never cut (the preview is), quit and
help always show in the footer, and the header keeps the node and session counts."""

from __future__ import annotations

import re

import pytest

from radixtop.inspector.tree_state import Row
from tests.dashboard.test_snapshots import ROWS, SESSIONS, node, prepared_app, screen_lines, snapshot  # noqa: F401

DEEP = [Row("node", d, node(35300 + d, 0, d, 10, 100, 1), 0, expanded=True) for d in range(2, 16)]
CHAIN = Row("chain", 8, node(3601, 3600, 9, 5, 50, 0), 0,
            chain=(node(35399, 0, 8, 5, 60, 1), node(3600, 35399, 9, 5, 55, 1), node(3601, 3600, 10, 5, 50, 0)))


async def fed(pilot, rows) -> None:
    for i in range(1, 4):
        pilot.app.home.apply_snapshot(snapshot(i, rows, SESSIONS))
    await pilot.pause()


async def test_at_80x24_no_node_id_is_cut_the_preview_is(prepared_app):  # noqa: F811
    app = prepared_app
    async with app.run_test(size=(80, 24)) as pilot:
        await fed(pilot, ROWS[:3] + DEEP[:6] + [CHAIN] + DEEP[6:])
        text = "\n".join(screen_lines(app))
        shown = [r for r in ROWS[:3] + DEEP[:6] + [CHAIN] + DEEP[6:]][:14]  # the rows the pane holds
        for row in shown:
            ids = [row.chain[0].id, row.node.id] if row.kind == "chain" else [row.node.id]
            for node_id in ids:
                assert re.search(rf"#{node_id}(?!\d)", text), (node_id, text)  # whole: no digit cut off
        assert "#35399 ⋯ #3601" in text
        assert "#1002 ┄ 2002 20" in text and "…" in text  # (a preview is what is cut)


async def test_at_80x24_quit_and_help_always_show_and_the_header_keeps_the_counts(prepared_app):  # noqa: F811
    app = prepared_app
    async with app.run_test(size=(80, 24)) as pilot:
        await fed(pilot, ROWS)
        for focus in ("tree", "detail", "sessions"):
            lines = screen_lines(app)
            footer = lines[-1].replace(" ", "")
            for shown in ("qQuit", "?Help", "cClose", "/Search", "pPause"):
                assert shown in footer, (focus, footer)
            header = "\n".join(lines[:6])
            assert "1,000,000 nodes" in header and "48 sessions" in header, header
            await pilot.press("tab")
            await pilot.pause()


@pytest.mark.parametrize("size", [(60, 20), (100, 30)])
async def test_quit_and_help_show_at_any_width(prepared_app, size):  # noqa: F811
    app = prepared_app
    async with app.run_test(size=size) as pilot:
        await fed(pilot, ROWS)
        footer = screen_lines(app)[-1].replace(" ", "")
        assert "qQuit" in footer and "?Help" in footer, footer
