"""/ searches by text where the target has a tokenizer, over HTTP too; token ids stay available
(issue 26, item 5)."""

from __future__ import annotations

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.modals import AskScreen
from radixtop.inspector.tree_view import CacheTree
from tests.dashboard.test_dashboard import idle, node_id_for, settle
from tests.support.engines import build_engine
from tests.support.live_server import running_server


class Letters:
    """A tokenizer of the test cache's ids: a is 1, b is 2, ... (t is 20)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 96 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(96 + i) if 1 <= i <= 26 else "?" for i in ids)


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


async def search(pilot, app, text: str) -> None:
    await pilot.press("slash")
    assert isinstance(app.screen, AskScreen)
    app.screen.query_one("#ask-input").value = text  # (typed: keys as the user types them)
    await pilot.press("enter")
    await idle(pilot, app)


def test_what_slash_takes():
    from radixtop.inspector.lookups import search_query

    assert search_query("1, 2 3") == [1, 2, 3]
    assert search_query("abcd") == "abcd"
    assert search_query('"2024"') == "2024"  # a number as text
    assert search_query("１２") == "１２"  # full-width digits are text, not ids


@pytest.mark.parametrize("over_http", [False, True])
async def test_search_by_text_where_the_target_has_a_tokenizer(engine, over_http):
    local = BundledAdapter(engine, tokenizer=Letters())
    with running_server(create_app(local, "tok", AuditLog(None))) as url:
        adapter = RadixtopClient(url, token="tok", timeout=5.0) if over_http else local
        app = RadixtopApp(adapter, interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app)
            await search(pilot, app, "abcdtuz")  # [1, 2, 3, 4, 20, 21, 26]
            tree = app.query_one(CacheTree)
            assert tree.current.node.id == node_id_for(engine, [1, 2, 3, 4, 20, 21, 22])
            assert any("6 of 7 tokens cached" in n.message for n in app._notifications)
            await search(pilot, app, "1 2 3 4 5 6")  # ids still
            assert tree.current.node.id == node_id_for(engine, [1, 2, 3, 4, 5, 6])
        adapter.release()


async def test_a_text_search_on_a_target_without_a_tokenizer_says_so(engine):
    app = RadixtopApp(BundledAdapter(engine), interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app)
        await search(pilot, app, "abcd")
        told = [n.message for n in app._notifications if n.title == "search"]
        assert told and "has no tokenizer: search by token ids" in told[-1], told


def test_encode_through_the_adapters_tokenizer_and_its_refusals(engine):
    from radixtop.adapters.errors import BadRequest, Unsupported

    class Broken:
        def encode(self, text: str) -> list[int]:
            raise ValueError("no")

    assert BundledAdapter(engine, tokenizer=Letters()).encode("abc") == [1, 2, 3]
    assert BundledAdapter(engine).encode("") == []  # an empty text is no ids anywhere
    with pytest.raises(Unsupported, match="has no tokenizer"):
        BundledAdapter(engine).encode("abc")
    with pytest.raises(BadRequest, match="cannot encode this text: ValueError"):
        BundledAdapter(engine, tokenizer=Broken()).encode("abc")
