"""The header's rates: taken over sane windows, without the dashboard's own actions, and no bar
drawn before there is something to draw."""

from __future__ import annotations

from dataclasses import replace

from textual.widgets import Sparkline

from radixtop.inspector.header import HeaderBar
from tests.dashboard.test_snapshots import prepared_app, stats  # noqa: F401  (the fixture)


async def test_rates_need_a_real_window_and_leave_out_the_dashboards_own_evictions(prepared_app):  # noqa: F811
    app = prepared_app
    async with app.run_test(size=(160, 48)) as pilot:
        header = app.query_one(HeaderBar)
        header.interval = 1.0
        first = stats(1)
        header.update_stats(first, 100.0)
        await pilot.pause()
        # one sample (or none): no series yet, drawn as nothing, not as a full bar
        for key in ("hit", "evict", "close"):
            assert app.query_one(f"#{key}-spark", Sparkline).data == []
        # the server evicts 1,000 tokens a second
        header.update_stats(replace(first, evicted_tokens=1_000), 101.0)
        assert header.evictions[-1] == 1_000
        # an action's refresh poll comes 5 ms later: not a sample (1,000 tok in 5 ms is no rate)
        header.update_stats(replace(first, evicted_tokens=1_005), 101.005)
        assert list(header.evictions) == [1_000] and header.stats.evicted_tokens == 1_005
        # the operator evicts 50,000 tokens: the next sample counts only the server's own
        header.own_eviction(50_000)
        header.update_stats(replace(first, evicted_tokens=1_000 + 50_000 + 1_000), 102.0)
        assert list(header.evictions) == [1_000, 1_000]
        header.update_stats(replace(first, evicted_tokens=53_000), 103.0)
        assert list(header.evictions) == [1_000, 1_000, 1_000]  # once only
        await pilot.pause()
        assert app.query_one("#evict-spark", Sparkline).data == [1_000, 1_000, 1_000]


def test_the_legend_keeps_its_layout_when_the_figures_change():
    """SGLang's words in its order, all five every refresh: a running request's uncached slots
    coming and going (or any figure growing) never switches the legend to another layout."""
    from radixtop.inspector.header import legend

    idle = replace(stats(1), uncached_tokens=0, unevictable_tokens=4210, available_tokens=30790)
    busy = replace(stats(1), uncached_tokens=12_345, unevictable_tokens=16_555, available_tokens=18_445)
    for width in (158, 120, 100, 78):
        a, b = str(legend(idle, width)), str(legend(busy, width))
        names = [w for w in a.split() if w in ("available", "evictable", "protected", "session_held", "uncached",
                                               "avail", "evict", "prot", "sess", "unc")]
        assert len(names) == 5, (width, a)  # every state, in SGLang's order
        assert ("tok" in a) == ("tok" in b) and a.split("■")[0] == b.split("■")[0], (width, a, b)
        assert [w for w in b.split() if w in names] == names, (width, b)
        if width >= 120:  # padded figures: every part keeps its place
            assert [i for i, c in enumerate(a) if c == "■"] == [i for i, c in enumerate(b) if c == "■"], (a, b)
    full = str(legend(idle, 158))
    assert full.index("available") < full.index("evictable") < full.index("protected") < full.index(
        "session_held") < full.index("uncached")


def test_a_target_that_cannot_split_the_unevictable_says_unevictable_not_protected():
    from radixtop.inspector.header import legend

    routes = replace(stats(1), protected_tokens=None, session_held_tokens=None, uncached_tokens=None)
    text = str(legend(routes, 158))
    assert "unevictable" in text and "protected" not in text and "unknown" not in text
