"""Every action's result says what happened (done, partly done, refused) with the figures, and a
dashboard whose target will refuse says so before anything is confirmed (issue 26, item 1)."""

from __future__ import annotations

import pytest
from textual.widgets import Button

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.errors import ReadOnly
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server import reads as server_reads
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.modals import AskScreen, ConfirmScreen
from tests.dashboard.test_dashboard import idle, open_sessions, settle
from tests.dashboard.test_snapshots import screen_lines
from tests.support.engines import build_engine
from tests.support.live_server import running_server


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


def toasts(app) -> list[tuple[str, str]]:
    return [(n.title, n.message) for n in app._notifications]


async def confirm_close(pilot, app, session_id: str) -> None:
    await open_sessions(pilot, app, session_id)
    await pilot.press("c")
    await idle(pilot, app)
    assert isinstance(app.screen, ConfirmScreen)
    await pilot.click("#confirm")
    await idle(pilot, app)


async def test_without_a_token_the_actions_are_hidden_and_a_close_is_never_reported_done(engine):
    """A worker's dashboard opened without a token: the server refuses every action, so Close,
    Evict and Flush leave the footer, and c says why instead of opening the modal."""
    with running_server(create_app(BundledAdapter(engine), "tok", AuditLog(None))) as url:
        adapter = RadixtopClient(url, timeout=5.0)
        app = RadixtopApp(adapter, "s-worker", interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            footer = screen_lines(app)[-1].replace(" ", "")
            assert "Close" not in footer and "Evict" not in footer and "Flush" not in footer, footer
            await open_sessions(pilot, app, "b")
            await pilot.press("c")
            await idle(pilot, app)
            assert not isinstance(app.screen, ConfirmScreen)
            assert any("no token" in message for _, message in toasts(app)), toasts(app)
            assert not any(title in ("closed", "done") for title, _ in toasts(app))
        adapter.release()
    assert BundledAdapter(engine).plan_close("b").state == "open"


async def test_with_a_read_only_token_the_actions_are_hidden_and_their_keys_say_why(engine):
    """A read-only token: the server says so in its capabilities, so the dashboard knows before
    any key: Close, Evict and Flush leave the footer, and c, E and F say why without a modal."""
    with running_server(create_app(BundledAdapter(engine), "tok-actions-0123456789", AuditLog(None),
                                   read_token="tok-reads-0123456789")) as url:
        adapter = RadixtopClient(url, token="tok-reads-0123456789", timeout=5.0)
        app = RadixtopApp(adapter, "s-worker", interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            footer = screen_lines(app)[-1].replace(" ", "")
            assert "Close" not in footer and "Evict" not in footer and "Flush" not in footer, footer
            await open_sessions(pilot, app, "b")
            for key in ("c", "E", "F"):
                await pilot.press(key)
                await idle(pilot, app)
                assert not isinstance(app.screen, (ConfirmScreen, AskScreen)), key
            said = [message for _, message in toasts(app) if "only reads" in message]
            assert said == ["s-worker refuses actions: this token only reads: actions need the action token"] * 3, \
                toasts(app)
            assert not any(title in ("closed", "done", "refused") for title, _ in toasts(app)), toasts(app)
        adapter.release()
    assert BundledAdapter(engine).plan_close("b").state == "open"


async def test_a_close_the_server_refuses_is_reported_refused_and_the_actions_leave(engine, monkeypatch):
    """A read-only token and a server from before capabilities answered for the token (the same
    to every token): the plan (a read) shows, the close is refused: the toast says refused,
    with the server's words, and from then on the footer hides the actions."""
    monkeypatch.setattr(server_reads, "for_token", lambda caps, state, request: caps)
    with running_server(create_app(BundledAdapter(engine), "tok-actions-0123456789", AuditLog(None),
                                   read_token="tok-reads-0123456789")) as url:
        adapter = RadixtopClient(url, token="tok-reads-0123456789", timeout=5.0)
        app = RadixtopApp(adapter, "s-worker", interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            await confirm_close(pilot, app, "b")
            titles = [title for title, _ in toasts(app)]
            assert "refused" in titles and "closed" not in titles and "done" not in titles, toasts(app)
            refused = next(message for title, message in toasts(app) if title == "refused")
            assert "closed none of 1 session(s): nothing freed" in refused
            assert "b: refused: this token only reads" in refused
            await settle(pilot, app)
            footer = screen_lines(app)[-1].replace(" ", "")
            assert "Close" not in footer and "Evict" not in footer, footer
        adapter.release()
    assert BundledAdapter(engine).plan_close("b").state == "open"


class RefusesC(BundledAdapter):
    """Closes every session but c; refuses evict."""

    def close_session(self, session_id: str):
        if session_id == "c":
            raise ReadOnly("c is pinned here")
        return super().close_session(session_id)

    def evict(self, num_tokens: int):
        raise ReadOnly("evict is off here")


async def test_results_say_done_partly_done_or_refused_with_the_figures(engine):
    adapter = RefusesC(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await confirm_close(pilot, app, "b")
        title, message = toasts(app)[-1]
        assert title == "done" and message.startswith("closed 1 of 1 session(s), freed 3 tok · 768 B"), message
        table = await open_sessions(pilot, app, "a")
        await pilot.press("space")
        table.cursor = next(i for i, s in enumerate(table.rows) if s.id == "c")
        await pilot.press("space")
        await pilot.press("c")
        await idle(pilot, app)
        await pilot.press("2", "enter")
        await idle(pilot, app)
        title, message = toasts(app)[-1]
        assert title == "partly done", toasts(app)
        assert message.splitlines()[0].startswith("closed 1 of 2 session(s), freed")
        assert "c: refused: c is pinned here" in message
        await pilot.press("E")
        assert isinstance(app.screen, AskScreen)
        await pilot.press("2", "enter")
        await idle(pilot, app)
        await pilot.click("#confirm")
        await idle(pilot, app)
        title, message = toasts(app)[-1]
        assert title == "refused" and "evict is off here" in message and "nothing changed" in message


async def test_an_evict_that_frees_less_than_asked_says_partly_done(engine):
    adapter = BundledAdapter(engine)
    app = RadixtopApp(adapter, interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        evictable = adapter.stats().evictable_tokens
        await pilot.press("E")
        await pilot.press(*str(evictable + 5), "enter")
        await idle(pilot, app)
        screen = app.screen
        assert isinstance(screen, ConfirmScreen)
        if screen.require_text is not None:
            await pilot.press(*screen.require_text)
            assert not screen.query_one("#confirm", Button).disabled
        await pilot.click("#confirm")
        await idle(pilot, app)
        title, message = toasts(app)[-1]
        assert title == "partly done", toasts(app)
        assert f"evicted {evictable:,} of {evictable + 5:,} tok asked" in message


async def test_an_evict_whose_nodes_the_target_cannot_count_says_unknown_not_0(engine):
    """SGLang's Rust core counts the tokens an evict freed, not the nodes: the toast says the
    nodes are unknown (it said 'in None nodes', and 'in 0 nodes' before the count became None)."""
    import dataclasses

    class UncountedNodes(BundledAdapter):
        def evict(self, num_tokens):
            return dataclasses.replace(super().evict(num_tokens), evicted_nodes=None)

    app = RadixtopApp(UncountedNodes(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await pilot.press("E")
        await pilot.press("1", "enter")
        await idle(pilot, app)
        assert isinstance(app.screen, ConfirmScreen)
        if app.screen.require_text is not None:
            await pilot.press(*app.screen.require_text)
        await pilot.click("#confirm")
        await idle(pilot, app)
        title, message = toasts(app)[-1]
        assert title == "done" and "nodes unknown" in message and "None" not in message, toasts(app)
