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
