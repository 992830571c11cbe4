"""What one dashboard poll costs its target: one ``read_many`` (one step of the owner thread for
the bundled adapter, one request over HTTP), while the tree moves and while it rests; pages read
with the stats are only used when the tree state did not move in between."""

from __future__ import annotations

import asyncio

import pytest

from radixtop.adapters.bundled.adapter import BundledAdapter
from radixtop.adapters.http.client import RadixtopClient
from radixtop.adapters.http.server import create_app
from radixtop.adapters.http.server.audit import AuditLog
from radixtop.inspector.app import RadixtopApp
from tests.support.engines import build_engine
from tests.support.live_server import running_server

PROMPT = [1, 2, 3, 4]


class CountingAdapter(BundledAdapter):
    """The bundled adapter, noting the ops of every read_many and every other read it serves."""

    def __init__(self, engine, **kwargs):
        super().__init__(engine, **kwargs)
        self.batches: list[list[str]] = []
        self.on_read_many = None

    def read_many(self, reads):
        self.batches.append([op for op, _ in reads])
        results = super().read_many(reads)
        if self.on_read_many is not None:
            hook, self.on_read_many = self.on_read_many, None
            hook()
        return results


@pytest.fixture
def engine():
    e = build_engine()
    yield e
    e.stop()


def count_steps(engine) -> list[int]:
    """Counts the calls into the engine's owner thread: commands (``call``) and the passes of
    reads that run in its slices (``owner.call_pass``, one view while they fit in one step)."""
    steps = [0]
    call, call_pass = engine.call, engine.owner.call_pass

    def counted(fn, timeout=10.0):
        steps[0] += 1
        return call(fn, timeout)

    def counted_steps(make, timeout):
        steps[0] += 1
        return call_pass(make, timeout)

    engine.call = counted
    engine.owner.call_pass = counted_steps
    return steps


def grow(engine, k: int) -> None:
    """A new turn under the shared prompt: the prompt's subtree (a row on screen) grows."""
    engine.call(lambda s: s.request(f"grow{k}", [*PROMPT, 5, 6], [70 + k], None))


def subtree_tokens(engine, path: list[int]) -> int:
    return engine.call(lambda s: s.cache.lookup(path).last_node.subtree_tokens)


def shown(app, node_id: int):
    return next(r.node for r in app.home.poller.tree.rows if r.node is not None and r.node.id == node_id)


async def poll_once(pilot, app) -> None:
    """One poll as the poll worker runs it: collect in a thread, apply on the UI thread; then
    what that set off (the cursor's first row selected: its detail loads) ends."""
    app.home.apply_snapshot(await asyncio.to_thread(app.home.poller.collect, app.home.poll_request()))
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def test_a_poll_is_one_step_of_the_owner_while_the_tree_moves_and_while_it_rests(engine):
    adapter = CountingAdapter(engine)
    app = RadixtopApp(adapter, poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_once(pilot, app)  # the first poll knows no version yet: the tree reads its own pages
        prompt = engine.call(lambda s: s.cache.lookup(PROMPT).last_node.id)
        steps = count_steps(engine)
        for k in range(3):
            grow(engine, k)
            batches, before = len(adapter.batches), steps[0]
            await poll_once(pilot, app)
            assert len(adapter.batches) == batches + 1, adapter.batches[batches:]
            assert steps[0] == before + 1  # the poll read in one step of the owner
            ops = adapter.batches[-1]
            assert ops[:2] == ["stats", "changes"] and "node" in ops  # the cursor's node, for the detail
            assert ops.count("children") == len(app.home.poller.tree.expanded) >= 1
            # what it read with the stats is what the tree shows
            assert shown(app, prompt).subtree_tokens == subtree_tokens(engine, PROMPT)
        await poll_once(pilot, app)  # the tree rests: this poll still reads pages (the last one moved) ...
        before = steps[0]
        await poll_once(pilot, app)  # ... and finds nothing shown changed: no pages any more
        assert steps[0] == before + 1 and "children" not in adapter.batches[-1]
        grow(engine, 3)
        await poll_once(pilot, app)  # a change after a rest: one read for the stats, one for the pages
        assert [ops.count("children") for ops in adapter.batches[-2:]] == [0, len(app.home.poller.tree.expanded)]
        assert shown(app, prompt).subtree_tokens == subtree_tokens(engine, PROMPT)


async def test_pages_read_before_an_expand_are_not_used_after_it(engine):
    adapter = CountingAdapter(engine)
    app = RadixtopApp(adapter, poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_once(pilot, app)
        grow(engine, 0)
        await poll_once(pilot, app)  # the tree moved: the next poll reads its pages with the stats
        prompt = shown(app, engine.call(lambda s: s.cache.lookup(PROMPT).last_node.id))
        grow(engine, 1)

        def expand_meanwhile() -> None:  # the user expands the prompt while the poll is out
            with app.home.poller.tree_lock:
                app.home.poller.tree.toggle(prompt)

        adapter.on_read_many = expand_meanwhile
        await poll_once(pilot, app)
        assert prompt.id in app.home.poller.tree.expanded
        # it read its own, with the stats (the header's figures are of the moment of those rows)
        assert adapter.batches[-1] == ["stats"] + ["children"] * len(app.home.poller.tree.expanded)
        below = {r.node.id for r in app.home.poller.tree.rows if r.node is not None and r.parent_id == prompt.id}
        assert below == set(engine.call(lambda s: [c.id for c in s.cache.lookup(PROMPT).last_node.children.values()]))


async def test_over_http_a_poll_is_one_request(engine):
    requests: list[str] = []
    with running_server(create_app(BundledAdapter(engine), "tok", AuditLog(None))) as url:
        adapter = RadixtopClient(url, token="tok", timeout=5.0)
        adapter._client.event_hooks["request"] = [lambda request: requests.append(request.url.path)]
        app = RadixtopApp(adapter, poll=False)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                await poll_once(pilot, app)
                for k in range(3):
                    grow(engine, k)
                    sent = len(requests)
                    await poll_once(pilot, app)
                    assert requests[sent:] == ["/v1/read"]
                prompt = engine.call(lambda s: s.cache.lookup(PROMPT).last_node.id)
                assert shown(app, prompt).subtree_tokens == subtree_tokens(engine, PROMPT)
        finally:
            adapter.close()
