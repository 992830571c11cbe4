"""The dashboard driven by Textual's Pilot over real adapters: every key and action."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest
from textual.widgets import Button, Input

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import TargetUnreachable
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.adapters.model import Capabilities
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.detail import DetailPanel
from radixtop.inspector.header import HeaderBar
from radixtop.inspector.modals import AskScreen, ConfirmScreen, HelpScreen
from radixtop.inspector.sessions_view import SessionsTable
from radixtop.inspector.tree_view import CacheTree
from tests.support.engines import build_engine
from tests.support.live_server import free_port, running_server


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def settle(pilot, app, polls: int = 1, timeout: float = 10.0) -> None:
    """Wait until ``polls`` more polls have landed and the workers are idle."""
    target = app.home.polls + polls
    deadline = asyncio.get_running_loop().time() + timeout
    while app.home.polls < target:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the dashboard did not poll")
        await pilot.pause(0.05)
    await app.workers.wait_for_complete()
    await pilot.pause()


async def idle(pilot, app) -> None:
    await app.workers.wait_for_complete()
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


def tree_ids(app) -> list[tuple[str, int | None, int]]:
    return [(r.kind, r.node.id if r.node else None, r.depth) for r in app.query_one(CacheTree).rows]


def node_id_for(engine, path: list[int]) -> int:
    return engine.call(lambda s: s.cache.lookup(path).last_node.id)


def header_title(app) -> str:
    return str(app.query_one(HeaderBar).query_one("#title").content)


def screen_text(app) -> str:
    """Everything on screen as plain text (the way a user reads it)."""
    return app.export_screenshot().replace("&#160;", " ")


async def test_opens_live_with_header_tree_detail_and_sessions(engine):
    app = RadixtopApp(BundledAdapter(engine, name="test cache"), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        header = app.query_one(HeaderBar)
        assert header.stats.capacity_tokens == 256 and not header.paused
        prompt = node_id_for(engine, [1, 2, 3, 4])
        assert tree_ids(app)[0] == ("node", prompt, 0)  # largest subtree first
        assert {s.id for s in app.query_one(SessionsTable).rows} == {"a", "b", "c", "d", "gone"}
        assert "test cache" in screen_text(app) and "LIVE" in screen_text(app)
        assert f"#{prompt}  parent #0" in screen_text(app)  # the detail panel


async def test_cursor_keys_expand_collapse_and_order(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(CacheTree)
        prompt = node_id_for(engine, [1, 2, 3, 4])
        await pilot.press("enter")
        await idle(pilot, app)
        assert [d for _, _, d in tree_ids(app)][:3] == [0, 1, 1]
        await pilot.press("down", "right")  # expand [5,6] (one child: a chain marker)
        await idle(pilot, app)
        assert any(d == 2 for _, _, d in tree_ids(app))
        await pilot.press("end")
        assert tree.cursor == len(tree.rows) - 1
        await pilot.press("home")
        assert tree.cursor == 0
        await pilot.press("pagedown", "pageup", "j", "k")
        assert tree.cursor == 0
        await pilot.press("left")  # collapse the prompt
        await idle(pilot, app)
        assert all(d == 0 for _, _, d in tree_ids(app))
        assert tree.current.node.id == prompt
        await pilot.press("o")
        await idle(pilot, app)
        assert app.home.poller.tree.order == "recency"
        await pilot.press("o")
        await idle(pilot, app)
        assert app.home.poller.tree.order == "bytes"


class GatedAdapter(BundledAdapter):
    """The bundled adapter, whose next read of a node's children waits for ``gate`` (a slow
    target: the keys pressed after it come while it loads)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.gate: threading.Event | None = None

    def children(self, *args, **kwargs):
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.wait(10)
        return super().children(*args, **kwargs)


async def test_quick_tree_keys_apply_in_the_order_pressed(engine):
    """Right then left, pressed while the expand still loads: the prompt ends collapsed, as if
    pressed slowly (left read the row as the screen still showed it, collapsed, and did
    nothing); right, left, right ends expanded. One loader applies the keys in order."""
    adapter = GatedAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        prompt = node_id_for(engine, [1, 2, 3, 4])
        assert app.query_one(CacheTree).current.node.id == prompt
        for keys, expanded in ((("right", "left"), False), (("right", "left", "right"), True)):
            gate = adapter.gate = threading.Event()  # the first expand's load waits
            await pilot.press(*keys)
            gate.set()
            await idle(pilot, app)
            await settle(pilot, app)  # a poll after the keys: the rows as the tree state has them
            assert (prompt in app.home.poller.tree.expanded) == expanded, keys
            assert any(d == 1 for _, _, d in tree_ids(app)) == expanded, keys
            assert app.query_one(CacheTree).current.node.id == prompt


async def test_chain_of_single_children_folds_into_one_row(engine):
    # [5,6] -> [7,8] -> [10,11] is a run of single children under the prompt.
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("enter")
        await idle(pilot, app)
        tree = app.query_one(CacheTree)
        five_six = node_id_for(engine, [1, 2, 3, 4, 5, 6])
        tree.move_to_key(("node", five_six))
        await pilot.press("x")
        await idle(pilot, app)
        chain_rows = [r for r in tree.rows if r.kind == "chain"]
        assert len(chain_rows) == 1 and [n.tokens for n in chain_rows[0].chain] == [2, 2, 2]
        await pilot.press("x")  # unfold
        await idle(pilot, app)
        assert not [r for r in tree.rows if r.kind == "chain"]


async def test_many_children_show_a_page_and_a_more_row(engine):
    def many(s):
        for i in range(250):
            s.request(f"m{i}", [500, 1000 + i], [], None)

    engine.call(many)  # (the pool holds 256 tokens: the oldest few are evicted on the way)
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    app.home.poller.tree.page = 100
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(CacheTree)
        parent = node_id_for(engine, [500])
        tree.move_to_key(("node", parent))
        await pilot.press("enter")
        await idle(pilot, app)
        total = adapter.children(parent, 0, 1).total
        assert total > 200
        more = [r for r in tree.rows if r.kind == "more"]
        assert len(more) == 1 and more[0].more == total - 100
        tree.move_to_key(("more", parent))
        await pilot.press("enter")
        await idle(pilot, app)
        assert [r.more for r in tree.rows if r.kind == "more"] == [total - 200]


async def test_pause_freezes_tree_and_sessions_while_header_moves(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("p")
        assert app.query_one(HeaderBar).paused and "PAUSED" in screen_text(app)
        before = tree_ids(app)
        sessions_before = list(app.query_one(SessionsTable).rows)
        adapter.close_session("b")  # the cache changes underneath
        await settle(pilot, app, polls=2)
        assert tree_ids(app) == before and app.query_one(SessionsTable).rows == tuple(sessions_before)
        assert app.query_one(HeaderBar).stats.closes == 2  # the header kept moving
        await pilot.press("p")
        await settle(pilot, app, polls=2)
        assert {s.id: s.state for s in app.query_one(SessionsTable).rows}["b"] == "closed"


async def test_interval_keys(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=1.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("plus")
        assert app.home.interval == 0.5
        await pilot.press("minus", "minus")
        assert app.home.interval == 2.0


async def open_sessions(pilot, app, session_id: str) -> SessionsTable:
    table = app.query_one(SessionsTable)
    table.focus()
    await pilot.pause()
    table.cursor = next(i for i, s in enumerate(table.rows) if s.id == session_id)
    await pilot.pause()
    return table


async def test_close_shows_the_plan_cancel_is_default_then_confirm(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await open_sessions(pilot, app, "b")
        free_before = adapter.stats().available_tokens
        await pilot.press("c")
        await idle(pilot, app)
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.focused.id == "cancel"
        assert "frees 768 B now" in app.screen.title_text  # 3 tokens x 256 B (tiny model)
        await pilot.press("enter")  # Cancel is the default
        await idle(pilot, app)
        assert not isinstance(app.screen, ConfirmScreen)
        assert adapter.stats().available_tokens == free_before
        await pilot.press("c")
        await idle(pilot, app)
        # The action is bound to the ids captured when the modal opened, whatever the cursor does.
        app.query_one(SessionsTable).cursor = 0
        await pilot.click("#confirm")
        await idle(pilot, app)
        assert adapter.stats().available_tokens == free_before + 3
        assert adapter.plan_close("b").state == "closed"
        assert adapter.plan_close("a").state == "open"


async def test_bulk_close_asks_for_the_count(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        table = await open_sessions(pilot, app, "a")
        await pilot.press("space")
        table.cursor = next(i for i, s in enumerate(table.rows) if s.id == "c")
        await pilot.press("space")
        assert table.marked == {"a", "c"}
        await pilot.press("c")
        await idle(pilot, app)
        screen = app.screen
        assert isinstance(screen, ConfirmScreen) and screen.require_text == "2"
        assert screen.query_one("#confirm", Button).disabled
        await pilot.press("2")  # typed where the modal put the focus: its field
        assert not screen.query_one("#confirm", Button).disabled
        await pilot.press("enter")
        await idle(pilot, app)
        assert adapter.plan_close("a").state == "closed" and adapter.plan_close("c").state == "closed"


async def test_evict_and_flush_ask_then_act(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        evictable = adapter.stats().evictable_tokens
        await pilot.press("E")
        assert isinstance(app.screen, AskScreen)
        await pilot.press("2", "enter")
        await idle(pilot, app)
        assert isinstance(app.screen, ConfirmScreen) and app.screen.require_text is None
        await pilot.click("#confirm")
        await idle(pilot, app)
        assert adapter.stats().evicted_tokens >= 2
        await pilot.press("E")
        await pilot.press("9", "9", "enter")  # >= 10% of capacity: type the count again
        await idle(pilot, app)
        assert app.screen.require_text == "99"
        await pilot.press("escape")
        await idle(pilot, app)
        await pilot.press("F")
        await idle(pilot, app)
        assert app.screen.require_text == "flush"
        for ch in "flush":  # typed as is: the field has the focus
            await pilot.press(ch)
        await pilot.press("enter")
        await idle(pilot, app)
        assert adapter.stats().evictable_tokens == 0 < evictable


async def test_read_only_target_disables_actions_and_says_why(engine):
    adapter = BundledAdapter(engine, read_only=True)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        assert "READ-ONLY" in screen_text(app)
        before = adapter.stats()
        await open_sessions(pilot, app, "b")
        for key in ("c", "E", "F"):
            await pilot.press(key)
            await idle(pilot, app)
            assert not isinstance(app.screen, (ConfirmScreen, AskScreen))
        assert any("read-only" in n.message for n in app._notifications)
        assert adapter.stats().version == before.version


class NoCloseAdapter(BundledAdapter):
    """A target that evicts and flushes but cannot close sessions (as SGLang's routes)."""

    def capabilities(self) -> Capabilities:
        return Capabilities(close=False, reason="no close route here")


async def test_the_footer_hides_what_the_target_cannot_do_and_its_keys_still_say_why(engine):
    """A face hides what a target cannot do: on a read-only target Close, Evict and Flush leave the
    footer; their keys (where --keymap put them too) and the palette's entries still say why. A
    target that cannot close keeps Evict and Flush."""
    from tests.dashboard.test_snapshots import screen_lines

    app = RadixtopApp(BundledAdapter(engine, read_only=True), interval=0.2, keymap={"app.close": "C"})
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        footer = screen_lines(app)[-1].replace(" ", "")
        assert "fFilter" in footer and "?Help" in footer and "pPause" in footer, footer
        assert "Close" not in footer and "Evict" not in footer and "Flush" not in footer, footer
        for key in ("C", "E", "F"):
            await pilot.press(key)
            await idle(pilot, app)
            assert not isinstance(app.screen, (ConfirmScreen, AskScreen))
        app.home.action_flush()  # as the command palette calls it
        await pilot.pause()
        told = [n.message for n in app._notifications if "read-only" in n.message]
        assert told == [f"{app.home.target} is read-only: actions are disabled"] * 4
    app = RadixtopApp(NoCloseAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        footer = screen_lines(app)[-1].replace(" ", "")
        assert "Close" not in footer and "EEvict" in footer and "FFlush" in footer, footer
        await pilot.press("c")
        await idle(pilot, app)
        assert any("cannot close: no close route here" in n.message for n in app._notifications)
        await pilot.press("E")
        assert isinstance(app.screen, AskScreen)


async def test_search_jumps_to_the_longest_cached_prefix(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await pilot.press("slash")
        assert isinstance(app.screen, AskScreen)
        for ch in "1,2,3,4,20,21,99":
            await pilot.press(ch if ch != "," else "comma")
        await pilot.press("enter")
        await idle(pilot, app)
        tree = app.query_one(CacheTree)
        assert tree.current.node.id == node_id_for(engine, [1, 2, 3, 4, 20, 21, 22])
        assert any("6 of 7 tokens cached" in n.message for n in app._notifications)


async def test_choosing_a_session_marks_its_chains(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await open_sessions(pilot, app, "a")
        await pilot.press("enter")
        await idle(pilot, app)
        tree = app.query_one(CacheTree)
        leaf = node_id_for(engine, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
        assert leaf in tree.marked_ids and node_id_for(engine, [1, 2, 3, 4]) in tree.marked_ids
        assert leaf in {r.node.id for r in tree.rows if r.node}  # expanded down to it
        await pilot.press("escape")
        assert not tree.marked_ids


async def test_filter_help_palette_and_keymap(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2, keymap={"app.pause": "P"})
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await pilot.press("f")
        for ch in "gone":
            await pilot.press(ch)
        await pilot.press("enter")
        table = app.query_one(SessionsTable)
        await settle(pilot, app)
        assert [s.id for s in table.rows] == ["gone"]  # filtered by the target, over all sessions
        await pilot.press("s")  # next sort column
        assert table.sort_column == 4
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen) and "app.pause" in app.screen.text
        assert "P " in app.screen.text or " P" in app.screen.text
        await pilot.press("escape")
        await pilot.press("P")  # remapped
        assert app.home.paused
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Pause / resume", "Close sessions", "Evict tokens", "Flush", "Search a prefix"} <= set(commands)


async def test_cursor_and_expansion_survive_refresh_and_a_split(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await pilot.press("enter")
        await idle(pilot, app)
        tree = app.query_one(CacheTree)
        five_six = node_id_for(engine, [1, 2, 3, 4, 5, 6])
        tree.move_to_key(("node", five_six))
        await pilot.press("right")
        await idle(pilot, app)
        seven_eight = node_id_for(engine, [1, 2, 3, 4, 5, 6, 7, 8])
        tree.move_to_key(("node", seven_eight))
        # Split [5,6] at 5 (the tail keeps its id) and add rows above the cursor.
        engine.call(lambda s: s.request("split", [1, 2, 3, 4, 5, 77], [], None))
        engine.call(lambda s: s.request("top", [600] * 20, [], None))
        await settle(pilot, app, polls=2)
        assert tree.current.node.id == seven_eight  # cursor kept
        ids = {r.node.id for r in tree.rows if r.node}
        assert five_six in ids and seven_eight in ids  # still expanded down to it


async def test_target_going_down_shows_a_banner_and_recovers():
    engine = build_engine()
    port = free_port()
    adapter = RadixtopClient(f"http://127.0.0.1:{port}", token="t", timeout=1.0)
    server_app = create_app(BundledAdapter(engine), "t", AuditLog(None))
    app = RadixtopApp(adapter, interval=0.25)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            with running_server(server_app, port=port):
                await settle(pilot, app)
                assert not app.query_one("#banner").display
                assert " LIVE " in header_title(app)
            deadline = asyncio.get_running_loop().time() + 10
            while app.home.down is None and asyncio.get_running_loop().time() < deadline:
                await pilot.pause(0.1)
            assert app.query_one("#banner").display and "cannot reach" in screen_text(app)
            before = [n.message for n in app._notifications]
            await pilot.pause(0.6)  # a few more failed polls: one banner, no repeated notices
            assert " DOWN " in header_title(app) and " LIVE " not in header_title(app)
            assert [n.message for n in app._notifications] == before  # the banner says it, and stays
            with running_server(server_app, port=port):
                deadline = asyncio.get_running_loop().time() + 10
                while app.home.down is not None and asyncio.get_running_loop().time() < deadline:
                    await pilot.pause(0.1)
                assert app.home.down is None and not app.query_one("#banner").display
                assert " LIVE " in header_title(app) and " DOWN " not in header_title(app)
    finally:
        adapter.close()
        engine.stop()


class FailingAdapter(BundledAdapter):
    """The bundled adapter, whose reads fail as an unreachable target's while ``down``."""

    def __init__(self, engine):
        super().__init__(engine)
        self.down = False
        self.reads = 0

    def read_many(self, reads):
        self.reads += 1
        if self.down:
            raise TargetUnreachable("cannot reach the test cache: refused")
        return super().read_many(reads)


async def test_a_failed_poll_backs_off_before_the_next(engine):
    """dolphie's back-off: after a failed poll the next comes after twice the interval, at least
    2 s, doubling while it fails (the banner says when), not at the interval; once one succeeds,
    the interval again."""
    adapter = FailingAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        adapter.down = True
        deadline = asyncio.get_running_loop().time() + 10
        while app.home.down is None:
            assert asyncio.get_running_loop().time() < deadline
            await pilot.pause(0.05)
        failed = adapter.reads
        await pilot.pause(1.5)  # seven intervals
        assert adapter.reads == failed
        assert "reconnecting in 2s" in str(app.query_one("#banner").content)
        deadline = asyncio.get_running_loop().time() + 10
        while adapter.reads == failed:  # the retry, 2 s after the failure: it fails too
            assert asyncio.get_running_loop().time() < deadline
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        assert "reconnecting in 4s" in str(app.query_one("#banner").content)  # twice as long now
        adapter.down = False
        await settle(pilot, app, polls=3)  # the retry (within 4 s), then every 0.2 s again
        assert app.home.down is None and app.home.poll_loop.retry_after == 2.0


async def test_mouse_clicks_move_the_cursor(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(CacheTree)
        await pilot.click(CacheTree, offset=(5, 3))  # border, column titles, row 0, row 1
        assert tree.cursor == 1
        await pilot.click(CacheTree, offset=(5, 3), times=2)
        await idle(pilot, app)
        assert tree.rows[1].expanded or tree.rows[1].node.num_children == 0
        await pilot.click(SessionsTable, offset=(5, 3))  # border, header, row 0, row 1
        assert app.query_one(SessionsTable).cursor == 1


async def test_detail_pages_token_ids():
    engine = build_engine()
    engine.call(lambda s: s.request("long", list(range(5000, 5200)), [], None))
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            tree = app.query_one(CacheTree)
            tree.move_to_key(("node", node_id_for(engine, list(range(5000, 5200)))))
            await idle(pilot, app)
            assert "ids 0-64" in screen_text(app)
            await pilot.press("right_square_bracket")
            await idle(pilot, app)
            assert app.home.detail_offset == 64 and "ids 64-128" in screen_text(app) and "5064" in screen_text(app)
            # a poll that read the first page before the key was pressed lands after it: it must not
            # take the panel back to the page the operator left (this raced in CI)
            panel = app.query_one(DetailPanel)
            shown = list(panel._rows)
            app.home._show_detail(app.home.poller.detail(app.home.selected_node, 0))
            assert panel._rows == shown
            await pilot.press("left_square_bracket", "left_square_bracket")
            await idle(pilot, app)
            assert app.home.detail_offset == 0
    finally:
        engine.stop()


async def test_close_works_over_http_too():
    engine = build_engine()
    with running_server(create_app(BundledAdapter(engine), "tok", AuditLog(None))) as url:
        adapter = RadixtopClient(url, token="tok", timeout=5.0)
        app = RadixtopApp(adapter, interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            await open_sessions(pilot, app, "b")
            await pilot.press("c")
            await idle(pilot, app)
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.click("#confirm")
            await idle(pilot, app)
            assert adapter.plan_close("b").state == "closed"
            assert any("freed 3 tok" in n.message for n in app._notifications)
        adapter.close()
    engine.stop()


def many_sessions_engine(n: int = 2500):
    """A cache with ``n`` sessions (more than the table loads at once), s0 the biggest."""
    from radixtop.gpu_backend.engine import Engine
    from radixtop.gpu_backend.kv_geometry import get_geometry
    from radixtop.gpu_backend.scheduler import Scheduler

    s = Scheduler(get_geometry("tiny"), 64 * n, device="cpu")
    for i in range(n):
        s.request(f"r{i}", [1000 + i] * (2 + (n - i) % 7), [7], f"s{i}")
    return Engine(s, None).start()


async def test_sessions_are_sorted_filtered_and_paged_over_all_of_them():
    """More sessions than the table loads at once: the title says how many, a filter finds a
    session past the first window, End reaches the last row of the whole order, and a sort
    column sorts all of them."""
    from radixtop.inspector.poller import SESSIONS_LOADED
    from tests.dashboard.test_snapshots import screen_lines

    def screen_text(app) -> str:
        return "\n".join(screen_lines(app))

    engine = many_sessions_engine()
    try:
        app = RadixtopApp(BundledAdapter(engine), interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            table = app.query_one(SessionsTable)
            assert table.total == 2500 > SESSIONS_LOADED == len(table.rows)
            # a still cache read every poll: its figures are as of the read (issue 25)
            assert re.search(r"sessions 2,500 \(2,500 open\) · (figures current|unchanged since)", screen_text(app)), \
                screen_text(app)
            # a filter runs over all 2,500 (s2493 is not in the first window of 1,000)
            assert "s2493" not in {s.id for s in table.rows}
            table.focus()
            await pilot.press("f", *"S2493", "enter")
            await settle(pilot, app)
            assert [s.id for s in table.rows] == ["s2493"]
            assert "sessions 1 of 2,500 · filter 'S2493'" in screen_text(app)
            await pilot.press("f", *["backspace"] * 5, "enter")
            await settle(pilot, app)
            assert table.total == 2500
            # End: the last row of the whole order, loaded around the cursor
            await pilot.press("end")
            await settle(pilot, app)
            assert table.cursor == 2499 and table.current is not None
            everyone = BundledAdapter(engine).sessions("exclusive_bytes", 0, 10_000).sessions
            assert table.current.id == everyone[-1].id
            await pilot.press("ctrl+home")
            await settle(pilot, app)
            assert table.cursor == 0 and table.current.id == everyone[0].id
            # sort by id, then reversed: over all sessions
            while table.query.order != "id":
                await pilot.press("s")
            await settle(pilot, app)
            assert table.current.id == min(s.id for s in everyone)
            await pilot.press("r")
            await settle(pilot, app)
            assert table.current.id == max(s.id for s in everyone)
    finally:
        engine.stop()


SORT_KEYS = {  # what each sessions column shows, as a value to compare
    "session": lambda s: s.id, "state": lambda s: s.state == "open", "tagged": lambda s: s.tagged_nodes,
    "exclusive": lambda s: s.exclusive_bytes, "shared": lambda s: s.shared_bytes,
    "fair": lambda s: s.fair_share_bytes, "locked": lambda s: s.locked_tokens,
    "active": lambda s: s.last_activity_age_s,
}


async def test_the_sort_arrow_means_the_same_direction_for_every_column(engine):
    """For every column, sorted and reversed: ▼ over a column whose values fall down the table,
    ▲ over one whose values rise (ids A to Z rise: they get ▲, as sizes falling get ▼)."""
    from radixtop.inspector.sessions_view import COLUMNS

    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(240, 48)) as pilot:  # wide enough for every column
        await settle(pilot, app)
        table = app.query_one(SessionsTable)
        table.focus()
        assert len(table._visible_columns(table.size.width)) == len(COLUMNS)
        seen = set()
        for _ in range(2 * len(COLUMNS)):
            for _reverse in range(2):
                await settle(pilot, app)
                title = COLUMNS[table.sort_column].title
                header = screen_text(app)
                arrow = "▼" if f"{title}▼" in header else "▲" if f"{title}▲" in header else None
                assert arrow is not None, (title, header)
                values = [SORT_KEYS[title](s) for s in table.rows]
                assert len(set(values)) > 1 or title == "state", (title, values)  # (a real order to check)
                wanted = sorted(values, reverse=arrow == "▼")
                assert values == wanted, (title, arrow, values)
                seen.add((title, arrow))
                await pilot.press("r")
            await pilot.press("s")
        assert {t for t, _ in seen} == {c.title for c in COLUMNS}
        assert ("session", "▲") in seen and ("exclusive", "▼") in seen  # the defaults: A to Z, largest first


async def test_hidden_columns_are_not_in_the_sort_cycle(engine):
    """At 80 columns the sessions pane shows a few columns: s cycles through those only (a
    sort by a column you cannot see reads as no order at all)."""
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        table = app.query_one(SessionsTable)
        table.focus()
        visible = table._visible_columns(table.size.width)
        assert len(visible) < 8  # some are hidden at this width
        visited = set()
        for _ in range(2 * len(visible)):
            await pilot.press("s")
            await pilot.pause()
            assert table.sort_column in visible, (table.sort_column, visible)
            visited.add(table.sort_column)
        assert visited == set(visible)


async def test_escape_in_the_filter_box_clears_the_filter_not_the_marks(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        table = app.query_one(SessionsTable)
        table.focus()
        await pilot.press("space")  # mark the top session
        marked = set(table.marked)
        assert marked
        await pilot.press("f", *"gone", "enter")
        await settle(pilot, app)
        assert [s.id for s in table.rows] == ["gone"]
        await pilot.press("f", "escape")
        await settle(pilot, app)
        assert table.filter_text == "" and len(table.rows) == 5  # the filter is gone
        assert table.marked == marked  # the marks are kept
        assert not app.query_one("#filter", Input).display and table.has_focus


async def test_keys_as_people_write_them_quit_and_help(engine):
    """The help lists keys as people write them, after --keymap, and closes on q; ctrl+c quits,
    asking once while an action is in flight."""
    app = RadixtopApp(BundledAdapter(engine), interval=0.2, keymap={"app.pause": "P"})
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.text
        for shown in ("question_mark", "right_square_bracket", "(None)", "ctrl+q"):
            assert shown not in text
        assert "?" in text and "]" in text and "tab" in text and "^c" in text
        assert any(line.replace(" ", "").startswith("[b]P[/]") and "app.pause" in line for line in text.splitlines())
        await pilot.press("q")  # closes the help, not the app
        assert not isinstance(app.screen, HelpScreen) and app.is_running
        # ctrl+c with an action in flight: asks once, then quits
        release = __import__("threading").Event()
        real_evict = app.home.adapter.evict
        app.home.adapter.evict = lambda n: (release.wait(10), real_evict(n))[1]
        app.home.actions.perform("evict", 1)
        await pilot.pause(0.1)
        await pilot.press("ctrl+c")
        assert app.is_running and any("still running" in n.message for n in app._notifications)
        await pilot.press("ctrl+c")
        release.set()
        await pilot.pause(0.2)
    assert app.return_code in (0, None)


async def test_the_help_shows_bracket_keys_as_typed(engine):
    """[ and ] page the detail's token ids: the help shows each as typed, in the keys' column, not
    as markup left over ('[[/]' was shown for [)."""
    from tests.dashboard.test_snapshots import screen_lines

    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await pilot.press("question_mark")
        await pilot.pause()
        lines = screen_lines(app)
        prev = next(line for line in lines if "(detail.prev)" in line)
        nxt = next(line for line in lines if "(detail.next)" in line)
        assert "[/]" not in prev and " [  Previous token ids" in prev, prev
        assert " ]  Next token ids" in nxt, nxt
        assert prev.index("Previous") == nxt.index("Next")  # the same column


async def test_ctrl_c_quits_when_nothing_is_running(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+c")
        await pilot.pause(0.2)
        assert not app.is_running


async def test_c_on_a_tree_row_offers_the_sessions_that_hold_that_node(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(CacheTree)
        tree.focus()
        await pilot.press("enter", "down", "enter")  # expand the prompt and a's turn below it
        await idle(pilot, app)
        table = app.query_one(SessionsTable)
        highlighted = table.current.id  # the sessions table has its own session under its cursor
        index, row = next((i, r) for i, r in enumerate(tree.rows)
                          if r.node is not None and r.node.holders and highlighted not in r.node.holders)
        tree.cursor = index
        await pilot.pause()
        await pilot.press("c")
        await idle(pilot, app)
        screen = app.screen
        assert isinstance(screen, ConfirmScreen) and f"holding node #{row.node.id}" in screen.title_text
        await pilot.press("escape")
        await idle(pilot, app)
        assert all(adapter.plan_close(sid).state == "open" for sid in row.node.holders)  # cancelled
        # a row no session holds: says so, opens nothing
        tree.cursor = next(i for i, r in enumerate(tree.rows) if r.node is not None and not r.node.holders)
        await pilot.press("c")
        await idle(pilot, app)
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("nothing to close" in n.message for n in app._notifications)


async def test_previews_show_text_where_the_target_has_a_tokenizer_and_t_shows_the_ids(engine):
    from radixtop.gpu_backend.demo_text import DEMO_TOKENIZER
    from tests.dashboard.test_snapshots import screen_lines

    app = RadixtopApp(BundledAdapter(engine, tokenizer=DEMO_TOKENIZER), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(CacheTree)
        prompt = tree.rows[0].node  # [1, 2, 3, 4]
        text = DEMO_TOKENIZER.decode([1, 2, 3, 4]).replace("\n", "⏎")
        def row_line() -> str:
            return next(line for line in screen_lines(app) if line[1:].lstrip(" ▸▾").startswith(f"#{prompt.id} "))

        line = row_line()
        assert text[:12] in line and "1 2 3 4" not in line
        detail = "\n".join(screen_lines(app))
        assert "text" in detail and "ids" in detail  # the detail has both
        tree.focus()
        await pilot.press("t")
        await pilot.pause()
        line = row_line()
        assert "1 2 3 4" in line and text[:12] not in line


async def test_at_80_columns_the_footer_keeps_the_actions_and_tab(engine):
    from tests.dashboard.test_snapshots import screen_lines

    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        for focus in ("tree", "detail", "sessions"):
            assert app.focused.id == focus
            footer = screen_lines(app)[-1].replace(" ", "")
            for shown in ("tabPane", "cClose", "EEvict", "FFlush", "fFilter", "?Help"):  # (how to find the rest)
                assert shown in footer, (focus, footer)
            await pilot.press("tab")
            await pilot.pause()
        assert app.focused is app.query_one(CacheTree)  # tab went round: tree, detail, sessions, tree


async def test_a_note_from_another_thread_shows_as_plain_text(engine):
    """The embedded demo's watcher tells the operator, from its own thread, that it restarted the
    demo; what it says may quote the child's last words: text, never markup."""
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        note = "the demo engine exited (killed by signal 9); restarted it [/] [b]x"
        await asyncio.get_running_loop().run_in_executor(None, app.notice_from_thread, note)
        assert [(n.message, n.markup) for n in app._notifications] == [(note, False)]
    app.notice_from_thread("after the app has gone: dropped, not an error")


async def test_the_header_shows_sglangs_buckets_and_a_leak(engine):
    """The legend names SGLang's leak-check buckets; a slot nobody owns puts a LEAK badge on the
    title, with the component and the tokens unaccounted."""
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        legend = str(app.query_one(HeaderBar).query_one("#legend").content)
        assert "■ protected" in legend and "■ uncached" in legend and "■ available" in legend
        assert "LEAK" not in header_title(app)
        engine.call(lambda s: s.pool.allocator.alloc(16))
        await settle(pilot, app)
        assert "LEAK [full] +16 tok" in header_title(app)
