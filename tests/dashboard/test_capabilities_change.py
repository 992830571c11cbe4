"""A target's capabilities can change while the dashboard watches it: a KV-event stream has no
sessions until its first ``session_id`` arrives (a late subscriber replays to it a poll or two
after the first read). The dashboard reads them again and shows the sessions then."""

from __future__ import annotations

import time

from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.wire import Batch, Stored
from radixtop.inspector.app import RadixtopApp
from radixtop.inspector.sessions_view import SessionsTable
from tests.dashboard.test_dashboard import settle
from tests.dashboard.test_snapshots import screen_lines


def stored(hashes, parent, tokens, session=None) -> Batch:
    return Batch(time.time(), 0, [Stored(tuple(hashes), parent, tuple(tokens), 1, "GPU", session_id=session)])


async def test_sessions_that_appear_after_the_first_poll_are_shown():
    adapter = EventTreeAdapter(name="events", bytes_per_token=2, capacity_tokens=100)
    adapter.apply_batch(0, stored([1, 2], None, [7, 8]))  # no session_id yet
    app = RadixtopApp(adapter, target="events", interval=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, polls=2)
        assert "sessions: not available here" in "\n".join(screen_lines(app))
        adapter.apply_batch(1, stored([3], 2, [9], session="alice-1"))
        table = app.query_one(SessionsTable)
        for _ in range(20):  # (the detail panel names the holder at once: the table is what is waited for)
            await settle(pilot, app)
            if table.page is not None:
                break
        text = "\n".join(screen_lines(app))
        assert [s.id for s in table.page.sessions] == ["alice-1"] and "not available here" not in text, text
