"""Snapshot tests of the main screens, fed prepared snapshots (no polling: deterministic)."""

from __future__ import annotations

import html
import re

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.model import (
    ClosePlanView,
    Geometry,
    KeptNodeView,
    NodeDetail,
    NodeView,
    SessionsPage,
    SessionView,
    Stats,
)
from radixtop.adapters.text import human_bytes
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.poller import Snapshot, TreeRows
from radixtop.inspector.tree_state import Row
from tests.support.engines import build_engine

BPT = 131072  # llama-3-8b
GEOMETRY = Geometry("llama-3-8b", 32, 8, 128, "bfloat16", 1, BPT)


def stats(i: int) -> Stats:
    return Stats(
        target="snapshot", capacity_tokens=65536, available_tokens=30000 - 10 * i, evictable_tokens=30536,
        protected_tokens=4200 + 10 * i, session_held_tokens=0, uncached_tokens=800, unevictable_tokens=5000 + 10 * i,
        total_tokens=34736 + 10 * i, bytes_per_token=BPT,
        node_count=1_000_000, open_sessions=48, closed_sessions=120, prompt_tokens=10_000 * i,
        cached_tokens=8_000 * i + 500 * (i % 4), evicted_tokens=400 * (i // 3) * 3,
        closes=i, freed_by_close_tokens=300 * i, version=100 + i, geometry=GEOMETRY,
    )


def node(node_id: int, parent: int, depth: int, tokens: int, subtree: int, children: int, lock: int = 0,
         holders: tuple[str, ...] = ()) -> NodeView:
    first = tuple(range(1000 + node_id, 1000 + node_id + min(tokens, 16)))
    return NodeView(node_id, parent, depth, tokens, first, None, lock, 3, 12.0, 300.0, tokens * BPT,
                    subtree, subtree * BPT, children, holders)


PROMPT = node(1001, 0, 1, 256, 20000, 3, lock=2)
ROWS = [
    Row("node", 0, PROMPT, 0, expanded=True),
    Row("node", 1, node(1002, 1001, 2, 180, 9000, 1, holders=("s7",)), 1001),
    Row("chain", 1, node(1005, 1004, 4, 40, 800, 0, holders=("s9", "s12")), 1001,
        chain=(node(1003, 1001, 2, 20, 900, 1), node(1004, 1003, 3, 30, 880, 1),
               node(1005, 1004, 4, 40, 800, 0, holders=("s9", "s12")))),
    Row("more", 1, parent_id=1001, more=99_997),
    Row("node", 0, node(1010, 0, 1, 256, 9000, 12), 0),
    Row("node", 0, node(1011, 0, 1, 64, 700, 0, holders=("s3",)), 0),
]
SESSIONS = [
    SessionView(f"s{i}", "open" if i % 5 else "closed", i % 4 + 1, (50 - i) * 2 * BPT * 10,
                256 * BPT, (50 - i) * BPT * 25, 4 * (i % 3), float(i)) for i in range(1, 30)
]
DETAIL = NodeDetail(PROMPT, tuple(range(2001, 2065)), 0, 256, 17)


def screen_lines(app) -> list[str]:
    """The screen as lines of plain text, the way a user reads it."""
    svg = app.export_screenshot()
    lines: dict[str, list[str]] = {}
    for line, text in re.findall(r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>', svg):
        lines.setdefault(line, []).append(html.unescape(text).replace("\xa0", " "))
    return ["".join(parts) for _, parts in sorted(lines.items(), key=lambda kv: int(kv[0]))]


def snapshot(i: int, rows=None, sessions=None, figures=(0.0, False, False)) -> Snapshot:
    """Poll ``i``'s snapshot: its stats, and the rows and sessions given; ``figures``: their age,
    whether new ones are being made, whether the cache is unchanged since."""
    age_s, refreshing, current = (*figures, False)[:3]
    page = None if sessions is None else SessionsPage(0, 1000, len(sessions), "exclusive_bytes", tuple(sessions),
                                                      age_s, refreshing, all_sessions=len(sessions),
                                                      figures_current=current)
    tree = None if rows is None else TreeRows(tuple(rows), "bytes", i)
    return Snapshot(stats(i), float(i), tree=tree, sessions=page)


@pytest.fixture
def prepared_app():
    engine = build_engine()
    app = RadixtopApp(BundledAdapter(engine, name="snapshot"), poll=False)
    yield app
    engine.stop()


async def feed(pilot) -> None:
    app = pilot.app
    for i in range(1, 40):
        app.home.apply_snapshot(snapshot(i, ROWS, SESSIONS))
    app.home.selected_node = PROMPT.id
    app.home._show_detail(DETAIL)
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_main_screen(snap_compare, prepared_app, size):
    assert snap_compare(prepared_app, terminal_size=size, run_before=feed)


def test_close_plan_modal(snap_compare, prepared_app):
    async def run_before(pilot):
        await feed(pilot)
        plan = ClosePlanView("s7", "free", "open", (1002,), 180, 180 * BPT, 1,
                             (KeptNodeView(1001, 256, "locked"), KeptNodeView(1003, 20, "shared")))
        pilot.app.home.actions.confirm_closes([plan, ClosePlanView("s9", "free", "open", (), 0, 0, 1,
                                                       (KeptNodeView(1005, 40, "shared"),))])
        await pilot.pause()

    assert snap_compare(prepared_app, terminal_size=(120, 36), run_before=run_before)


async def test_a_refresh_repaints_the_rows_that_changed_and_only_those(prepared_app):
    """A live cache changes a few rows per poll: those lines are repainted (and show the new
    figures), the others are left alone; rows that move repaint everything they moved over."""
    from dataclasses import replace

    from radixtop.inspector.tree_view import CacheTree

    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        tree = app.query_one(CacheTree)
        repainted: list[int] = []
        real = tree.refresh_line
        tree.refresh_line = lambda y: (repainted.append(y), real(y))

        def show(rows):
            app.home.apply_snapshot(snapshot(40, rows))

        show(list(ROWS))
        await pilot.pause()
        assert repainted == []  # nothing changed, nothing repainted

        locked = replace(ROWS[5].node, lock_ref=7, tokens=65)
        show([*ROWS[:5], replace(ROWS[5], node=locked)])
        await pilot.pause()
        assert repainted == [6]  # row 5, below the line of column titles
        line = next(line for line in screen_lines(app) if "#1011" in line)
        assert " 65 " in line and "8.0 MiB" in line  # the new figures are on screen

        repainted.clear()
        show([ROWS[4], *ROWS[:4], replace(ROWS[5], node=locked)])  # the largest root child moved up
        await pilot.pause()
        assert repainted == [1, 2, 3, 4, 5]


async def test_sessions_cursor_keeps_its_place_when_rows_change(prepared_app):
    """The cursor stays on its row position as the figures move: after the session under it is
    closed (it drops down the order), the next one is under the cursor, not the closed one."""
    from dataclasses import replace

    from radixtop.inspector.sessions_view import SessionsTable

    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        table = app.query_one(SessionsTable)
        assert table.current.id == "s1" and table.cursor == 0
        table.focus()
        await pilot.press("down")
        assert table.current.id == "s2"
        # s2 is closed: it frees its memory and falls to the end of the order by exclusive bytes
        closed = [s for s in SESSIONS if s.id != "s2"] + [replace(SESSIONS[1], state="closed", exclusive_bytes=0)]
        app.home.apply_snapshot(snapshot(50, sessions=closed))
        await pilot.pause()
        assert table.cursor == 1 and table.current.id == "s3"
        await pilot.press("end")
        assert table.current.id == "s2" and table.cursor == len(SESSIONS) - 1
        await pilot.press("ctrl+home")
        assert table.cursor == 0 and table.current.id == "s1"


async def test_old_session_figures_say_their_age_in_the_title(prepared_app):
    """A large cache's attribution is reused a while and made again in slices: figures old
    enough to matter say so, and whether a new one is on its way; fresh ones say nothing."""
    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        def show(figures):
            app.home.apply_snapshot(snapshot(1, sessions=SESSIONS, figures=figures))

        show((2.0, False))
        await pilot.pause()
        title = next(line for line in screen_lines(app) if "sessions 29" in line)
        assert "figures 2s old" in title  # always said: the ranking is what the operator acts on
        show((130.0, True))
        await pilot.pause()
        assert any("sessions 29 (48 open) · figures 2m old, refreshing" in line for line in screen_lines(app))
        show((40.0, False))
        await pilot.pause()
        title = next(line for line in screen_lines(app) if "sessions 29" in line)
        assert "figures 40s old" in title and "refreshing" not in title
        show((1080.0, False, True))  # a still cache: exact, however old
        await pilot.pause()
        assert any("sessions 29 (48 open) · unchanged since 18m ago" in line for line in screen_lines(app))


async def test_tree_columns_are_named_and_a_folded_chain_shows_the_whole_chain(prepared_app):
    """The first line names the columns; a folded chain's row has all its tokens and bytes and
    the subtree its parent sorts it by (its top's), not its last node's; one child shows ┄."""
    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(pilot)
        lines = screen_lines(app)
        header = next(line for line in lines if "subtree" in line and "holders" in line)
        assert all(title in header for title in ("node", "tokens", "bytes", "locks", "used"))
        chain = next(line for line in lines if "#1003 ⋯ #1005" in line)
        # tokens 20+30+40 and their bytes; subtree the top's 900 tokens, not the last node's 800
        assert " 90 " in chain and human_bytes(90 * BPT) in chain
        assert human_bytes(900 * BPT) in chain and human_bytes(800 * BPT) not in chain
        assert "2h" not in chain and " 2 " in chain  # holders: a count under "holders", not "2h"
        single = next(line for line in lines if "#1002" in line)
        assert "#1002 ┄" in single


async def test_the_used_column_is_whole_when_a_scrollbar_shows(prepared_app):
    """More rows than the pane holds: a scrollbar shows, and the rows fit the width left beside
    it, so the last column (used: how long since a node was used) is not cut; at 160 columns
    the scrollbar's two cells do not cost the locks, holders and used columns either."""
    from radixtop.inspector.tree_view import CacheTree

    many = [*ROWS, *(Row("node", 0, node(2000 + i, 0, 1, 8, 8, 0), 0) for i in range(80))]
    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        app.home.apply_snapshot(snapshot(1, many, SESSIONS))
        await pilot.pause()
        tree = app.query_one(CacheTree)
        assert tree.scrollbar_size_vertical > 0 and tree.show_vertical_scrollbar  # a scrollbar shows
        lines = screen_lines(app)
        header = next(line for line in lines if "largest subtree first" in line)
        assert "locks holders  used" in header, header
        rows = [line for line in lines if "#20" in line]
        assert len(rows) > 20 and all(" 12s" in line for line in rows), rows[:3]  # access 12 s ago, whole


async def test_the_figures_age_counts_the_time_since_the_table_was_read(prepared_app):
    """The dashboard reads the sessions every few seconds and the stats every poll: between two
    reads of the sessions the title's age keeps counting (it said 'figures 0s old' over rows read
    4 s before), and 'unchanged since' holds only while the cache's version has not moved."""
    from dataclasses import replace

    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        def title() -> str:
            return next(line for line in screen_lines(app) if "sessions 29" in line)

        app.home.apply_snapshot(snapshot(1, sessions=SESSIONS, figures=(2.0, False)))  # read at t=1
        await pilot.pause()
        assert "figures 2s old" in title()
        app.home.apply_snapshot(snapshot(5))  # t=5: a poll of the stats only
        await pilot.pause()
        assert "figures 6s old" in title(), title()
        app.home.apply_snapshot(snapshot(6, sessions=SESSIONS, figures=(0.0, False)))  # a new read
        await pilot.pause()
        assert "figures 0s old" in title(), title()
        # a still cache: exact while its version stays; once it moves, the figures are only old
        app.home.apply_snapshot(snapshot(7, sessions=SESSIONS, figures=(60.0, False, True)))
        still = replace(snapshot(9), stats=replace(stats(9), version=stats(7).version))
        app.home.apply_snapshot(still)
        await pilot.pause()
        assert "unchanged since 62s ago" in title() or "unchanged since 1m ago" in title(), title()
        app.home.apply_snapshot(snapshot(10))  # the version moved
        await pilot.pause()
        assert "figures 1m old" in title() and "unchanged" not in title(), title()
