"""bench_dashboard's screen measurements: the real ``RadixtopApp`` under ``app.run_test(size=SIZE)``,
instrumented (instance attributes over its methods, a timed adapter), driven by Pilot or by key
events handed to its driver: time to first paint (section 2), key press to screen (section 3) and
the work of one poll (section 4). The report's tables are in ``bench_dashboard``."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from _common import Built, change_tree, log, ms_stats, timed_adapter

if TYPE_CHECKING:
    from bench_dashboard import BenchConfig

pc = time.perf_counter
SIZE = (160, 48)  # the terminal the app runs in (columns, lines)


# ----------------------------------------------------------------------------------------------
# instrumentation (wraps, never edits, the code under test)
# ----------------------------------------------------------------------------------------------

READS = ("stats", "changes", "children", "sessions", "node", "session")  # the adapter reads timed


def instrument(app) -> None:
    """Time the app's per-poll read and render step, and note every screen update the compositor
    hands to the (headless) driver and the node the detail panel last showed (instance attributes
    over the real methods)."""
    app.bench_collect: list[float] = []
    app.bench_apply: list[float] = []
    app.bench_first_rows_at = None
    app.bench_displays: list[float] = []
    app.bench_detail_id = None
    collect, apply, display, show_detail = app.home.poller.collect, app.home.apply_snapshot, app._display, app.home._show_detail

    def timed_display(screen, renderable):
        if renderable is not None:
            app.bench_displays.append(pc())
        display(screen, renderable)

    def noted_detail(d):
        show_detail(d)
        if d.node.id == app.home.selected_node:
            app.bench_detail_id = d.node.id

    app._display, app.home._show_detail = timed_display, noted_detail

    def timed_collect(request):
        t0 = pc()
        snap = collect(request)
        app.bench_collect.append(pc() - t0)
        return snap

    def timed_apply(snap):
        t0 = pc()
        apply(snap)
        t1 = pc()
        app.bench_apply.append(t1 - t0)
        if app.bench_first_rows_at is None and snap.tree is not None and snap.tree.rows:
            app.bench_first_rows_at = t1

    app.home.poller.collect, app.home.apply_snapshot = timed_collect, timed_apply


def hook_screen(app) -> None:
    """Time every screen update (``Screen._on_timer_update``: layout if needed, then the
    compositor renders the dirty widgets and hands the update to the driver), whether its update
    timer or ``pilot.pause()`` runs it. Call once the app runs."""
    screen = app.screen
    app.bench_screen_updates: list[tuple[float, float]] = []
    update = screen._on_timer_update

    def timed_update():
        t0 = pc()
        update()
        app.bench_screen_updates.append((t0, pc() - t0))

    screen._on_timer_update = timed_update  # what pilot.pause() calls
    screen._update_timer._callback = timed_update  # what the screen's update timer calls


# ----------------------------------------------------------------------------------------------
# driving the app
# ----------------------------------------------------------------------------------------------


async def idle(pilot, app) -> None:
    """Until no worker runs and the screen has caught up."""
    for _ in range(1000):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not len(app.workers):
            return
    raise RuntimeError("the app's workers never went idle")


async def press_pilot(pilot, app, key: str, done: Callable[[], bool], timeout: float = 120.0) -> float:
    """Seconds from ``pilot.press(key)`` until ``done()`` holds, no worker runs, and
    ``pilot.pause()`` (which ends with a screen update) has returned."""
    t0 = pc()
    await pilot.press(key)
    while True:
        await app.workers.wait_for_complete()
        await pilot.pause()
        if done() and not len(app.workers):
            return pc() - t0
        if pc() - t0 > timeout:
            raise RuntimeError(f"key {key!r}: the screen did not reflect it within {timeout:.0f} s")


_KEY_CHARS = {"enter": "\r", "down": None}


async def press_direct(pilot, app, key: str, done: Callable[[], bool], timeout: float = 120.0) -> float:
    """The same key event Pilot sends, handed to the driver; then a 1 ms check (no idle-detection
    sleeps) until ``done()`` holds, no worker runs and no message is queued; then one screen update
    (what ``pilot.pause()`` ends with). Seconds from sending the key to the end of that update."""
    from textual import events
    from textual.worker import WorkerError

    from radixtop.inspector.sessions_view import SessionsTable
    from radixtop.inspector.tree_view import CacheTree

    pumps = (app, app.screen, app.query_one(CacheTree), app.query_one(SessionsTable))
    t0 = pc()
    app._driver.send_message(events.Key(key, _KEY_CHARS.get(key, key)))
    while True:
        if len(app.workers):
            try:  # event-driven while a worker runs: polling here would compete with it for the GIL
                await app.workers.wait_for_complete()
            except WorkerError:  # not started yet
                await asyncio.sleep(0.001)
        else:
            await asyncio.sleep(0.001)
        if done() and not len(app.workers) and all(p._message_queue.empty() for p in pumps):
            app.screen._on_timer_update()
            t1 = pc()
            break
        if pc() - t0 > timeout:
            raise RuntimeError(f"key {key!r}: the screen did not reflect it within {timeout:.0f} s")
    await idle(pilot, app)  # untimed: let anything that follows settle before the next key
    return t1 - t0


def row_of(tree, key: tuple[str, int]):
    return next((r for r in tree.rows if r.key == key), None)


async def prime(pilot, app) -> None:
    """First poll by hand (the timer is off): collect, then apply on the UI thread."""
    await idle(pilot, app)
    app.home.apply_snapshot(app.home.poller.collect(app.home.poll_request()))
    await idle(pilot, app)


async def set_view(pilot, app, expand: list[tuple[int, int]], cursor: tuple[str, int] | None) -> None:
    """A known state: the root and ``expand`` [(node id, children loaded)] open, no chains folded,
    order bytes, the cursor on ``cursor``. Set on the app's own TreeState, under its lock."""
    from radixtop.adapters.model import ROOT_ID
    from radixtop.inspector.tree_view import CacheTree

    with app.home.poller.tree_lock:
        st = app.home.poller.tree
        st.expanded, st.loaded, st.chains, st.order = {ROOT_ID}, {}, {}, "bytes"
        st.load(ROOT_ID)
        for node_id, count in expand:
            st.expanded.add(node_id)
            st.load(node_id, count)
        rows = list(st.flatten())
    tree = app.query_one(CacheTree)
    tree.set_rows(rows, app.home.stats.total_bytes, "bytes")
    if cursor is not None:
        if row_of(tree, cursor) is None:
            raise RuntimeError(f"row {cursor} is not in the view")
        tree.move_to_key(cursor)
    else:
        tree.cursor = 0
    tree.focus()
    await idle(pilot, app)


def run_app(session):
    """Run one app session (a coroutine around ``app.run_test``) in a fresh event loop, then collect
    and freeze what survives it. Textual keeps about 9k GC-tracked objects of every finished app in
    process-wide caches; frozen, they stay out of the next sessions' collections, as they would in a
    process that runs one app."""
    try:
        return asyncio.run(session)
    finally:
        gc.collect()
        gc.freeze()


def new_app(built: Built, poll: bool, interval: float = 1.0):
    from radixtop.inspector.app import RadixtopApp

    adapter = timed_adapter(built.engine, READS, name=f"bench {built.label}")
    app = RadixtopApp(adapter, target=f"bench {built.label}", interval=interval, poll=poll)
    instrument(app)
    return app, adapter


# ----------------------------------------------------------------------------------------------
# 2. first paint
# ----------------------------------------------------------------------------------------------


async def one_first_paint(built: Built, interval: float) -> dict[str, float]:
    from radixtop.inspector.tree_view import CacheTree

    t0 = pc()
    app, adapter = new_app(built, poll=True, interval=interval)  # a fresh adapter: nothing cached
    async with app.run_test(size=SIZE) as pilot:
        t_ready = pc()
        tree = app.query_one(CacheTree)
        while not (app.bench_first_rows_at is not None
                   and app.bench_displays and app.bench_displays[-1] > app.bench_first_rows_at):
            if pc() - t0 > 120:
                raise RuntimeError("no first poll within 120 s")
            await asyncio.sleep(0.001)
        t_screen = next(t for t in app.bench_displays if t > app.bench_first_rows_at)
        await pilot.pause()  # and until the app is idle (Pilot's idle detection)
        t_idle = pc()
        line = "".join(seg.text for seg in tree.render_line(1))  # line 0: the column titles
        if "#" not in line:
            raise RuntimeError(f"first tree line has no node: {line!r}")
        attr = [s for cold, s in adapter.attribute_log if cold]
        return {"ready_s": t_ready - t0, "collect_s": app.bench_collect[0], "apply_s": app.bench_apply[0],
                "applied_s": app.bench_first_rows_at - t0, "paint_s": t_screen - t0, "idle_s": t_idle - t0,
                "attribute_s": attr[0] if attr else 0.0, "rows": len(tree.rows)}


def measure_first_paint(cfg: BenchConfig, trees: list[Built]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {b.label: [] for b in trees}
    for k in range(cfg.paint_repeats):
        for b in trees if k % 2 == 0 else trees[::-1]:
            runs[b.label].append(run_app(one_first_paint(b, cfg.interval)))
    out = {}
    for label, rs in runs.items():
        out[label] = {key: ms_stats([r[key] for r in rs], 90) for key in
                      ("ready_s", "collect_s", "attribute_s", "apply_s", "applied_s", "paint_s", "idle_s")}
        out[label]["rows"] = rs[0]["rows"]
    return out


# ----------------------------------------------------------------------------------------------
# 3. key presses
# ----------------------------------------------------------------------------------------------


def views(built: Built) -> dict[str, list[tuple[int, int]]]:
    """V: root, system prompt 0 and the 1k-children node open (first page each).
    V+ (when the tree has one): V and the 100k-children node open."""
    base = [(built.system_ids[0], 100), (built.fanout_ids[1_000], 100)]
    big = max(built.fanout_ids)
    out = {"V": base}
    if big != 1_000:
        out["V+"] = base + [(built.fanout_ids[big], 100)]
    return out


async def key_session(cfg: BenchConfig, built: Built, method: str) -> dict[str, Any]:
    """Every key press in turn, timed with ``method``: "pilot" (``press_pilot``) or "direct"."""
    from radixtop.inspector.tree_view import CacheTree

    press = press_pilot if method == "pilot" else press_direct
    app, adapter = new_app(built, poll=False)
    res: dict[str, Any] = {}
    async with app.run_test(size=SIZE) as pilot:
        hook_screen(app)
        await prime(pilot, app)
        tree = app.query_one(CacheTree)
        st = app.home.poller.tree
        v = views(built)
        p0, p1 = built.system_ids[0], built.system_ids[1]

        # a key bound to nothing: the floor of the method itself
        await set_view(pilot, app, v["V"], None)
        res["noop"] = [await press(pilot, app, "z", lambda: True) for _ in range(cfg.press_repeats)]

        # cursor down, N times from the top of V (scrolls past the first screen); done when the
        # detail panel shows the new row's node
        times = []
        for i in range(cfg.down_presses):
            want = tree.cursor + 1
            times.append(await press(pilot, app, "down", lambda: tree.cursor == want and tree.current is not None
                                     and app.bench_detail_id == tree.current.node.id))
        res["down"] = times

        # expand (first load of its first page) and collapse: a system prompt, then the fan-outs
        async def expand_collapse(node_id: int, key_e: str, key_c: str, base) -> None:
            await set_view(pilot, app, base, ("node", node_id))
            te, tc = [], []
            for _ in range(cfg.press_repeats):
                with app.home.poller.tree_lock:
                    st.loaded.pop(node_id, None)  # so every expand loads its page again
                te.append(await press(pilot, app, "enter", lambda: (r := row_of(tree, ("node", node_id)))
                                      is not None and r.expanded))
                tc.append(await press(pilot, app, "enter", lambda: not row_of(tree, ("node", node_id)).expanded))
            res[key_e], res[key_c] = te, tc

        await expand_collapse(p1, "expand_system", "collapse_system", v["V"])
        base = [(p0, 100)]
        for n, node_id in sorted(built.fanout_ids.items()):
            await expand_collapse(node_id, f"expand_fanout_{n}", f"collapse_fanout_{n}", base)

        # the next page of children ("more" row) under each fan-out
        for n, node_id in sorted(built.fanout_ids.items()):
            view = v["V"] if n == 1_000 else v["V+"]
            await set_view(pilot, app, view, ("more", node_id))
            times = []
            for _ in range(min(cfg.press_repeats, n // 100 - 2)):
                want = len(st.loaded[node_id].children) + 100
                times.append(await press(pilot, app, "enter", lambda: len(st.loaded[node_id].children) == want
                                         and row_of(tree, ("more", node_id)).more == n - want))
            res[f"more_{n}"] = times

        # sort order (o): bytes -> recency -> bytes ..., in V and in V+
        for name, view in v.items():
            await set_view(pilot, app, view, ("node", p0))
            times = []
            for _ in range(cfg.press_repeats):
                want = "recency" if st.order == "bytes" else "bytes"
                times.append(await press(pilot, app, "o", lambda: st.order == want and tree.order == want))
            res[f"order_{name}"] = times

        # fold (x) a chain of single children into one row, and unfold it
        for depth, top in sorted(built.chain_ids.items()):
            await set_view(pilot, app, v["V"], ("node", top))
            reps = cfg.chain_repeats if depth <= 1_000 else cfg.long_chain_repeats
            tf, tu = [], []
            for _ in range(reps):
                tf.append(await press(pilot, app, "x", lambda: any(
                    r.kind == "chain" and r.chain[0].id == top and len(r.chain) == depth for r in tree.rows)))
                tu.append(await press(pilot, app, "x", lambda: row_of(tree, ("node", top)) is not None))
            res[f"fold_chain_{depth}"], res[f"unfold_chain_{depth}"] = tf, tu
    return res


def measure_keys(cfg: BenchConfig, trees: list[Built]) -> dict[str, Any]:
    out: dict[str, Any] = {b.label: {} for b in trees}
    for method in ("pilot", "direct"):
        for b in trees:
            log(f"  keys on {b.label}, {method}")
            raw = run_app(key_session(cfg, b, method))
            out[b.label][method] = {k: ms_stats(v, 90) for k, v in raw.items()}
    return out


# ----------------------------------------------------------------------------------------------
# 4. frame work per refresh
# ----------------------------------------------------------------------------------------------


async def frame_session(cfg: BenchConfig, built: Built) -> dict[str, Any]:
    """The poll timer is off; each poll is ``collect()`` (normally a worker thread) then
    ``apply_snapshot()`` (the UI thread), called here on the app's own thread, one after the
    other, then ``render_line`` for every visible line of the tree and the sessions table."""
    from radixtop.inspector.sessions_view import SessionsTable
    from radixtop.inspector.tree_view import CacheTree

    app, adapter = new_app(built, poll=False)
    # Every poll reads the sessions (their figures are kept with the tree: no pass to force).
    out: dict[str, Any] = {}
    async with app.run_test(size=SIZE) as pilot:
        hook_screen(app)
        await prime(pilot, app)
        tree, table = app.query_one(CacheTree), app.query_one(SessionsTable)
        for vname, view in views(built).items():
            await set_view(pilot, app, view, ("node", built.system_ids[0]))
            app.home.apply_snapshot(app.home.poller.collect(app.home.poll_request()))  # warm: the next polls see no change
            await idle(pilot, app)
            for mode in ("idle", "changed"):
                rec = {k: [] for k in ("collect", "apply", "render", "total", "screen", "hold", "after")}
                rec["after_calls"] = []
                rec.update({f"call_{k}": [] for k in (*READS, "attribute", "other")})
                rec["rows"] = len(tree.rows)
                for _ in range(cfg.frame_repeats):
                    if mode == "changed":
                        change_tree(built.engine, built.system_prompts[0])
                    mark_calls, mark_attr = len(adapter.calls), len(adapter.attribute_log)
                    mark_hold = built.holds.mark()
                    t0 = pc()
                    snap = app.home.poller.collect(app.home.poll_request())
                    t1 = pc()
                    mark_after = len(adapter.calls)
                    app.home.apply_snapshot(snap)
                    t2 = pc()
                    for y in range(tree.size.height):
                        tree.render_line(y)
                    for y in range(table.size.height):
                        table.render_line(y)
                    t3 = pc()
                    await idle(pilot, app)  # untimed: Textual paints; the detail worker the cursor starts
                    t4 = t3 + sum(d for t, d in app.bench_screen_updates if t >= t3)
                    after = adapter.calls[mark_after:]
                    rec["after"].append(sum(secs for _, secs in after))
                    rec["after_calls"].append(len(after))
                    rec["collect"].append(t1 - t0)
                    rec["apply"].append(t2 - t1)
                    rec["render"].append(t3 - t2)
                    rec["total"].append(t3 - t0)
                    rec["screen"].append(t4 - t3)
                    rec["hold"].append(built.holds.since(mark_hold))
                    per = {k: 0.0 for k in READS}
                    for name, secs in adapter.calls[mark_calls:mark_after]:  # collect's own reads
                        per[name] += secs
                    for k in READS:
                        rec[f"call_{k}"].append(per[k])
                    rec["call_attribute"].append(sum(s for _, s in adapter.attribute_log[mark_attr:]))
                    rec["call_other"].append((t1 - t0) - sum(per.values()))
                    if mode == "changed" and not any(c for c, _ in adapter.attribute_log[mark_attr:]):
                        raise RuntimeError("a changed poll did not recompute attribution")
                out[f"{vname}/{mode}"] = rec
                await idle(pilot, app)
    return out


def measure_frame(cfg: BenchConfig, trees: list[Built]) -> dict[str, Any]:
    merged: dict[str, dict[str, Any]] = {b.label: {} for b in trees}
    for k in range(cfg.frame_blocks):
        for b in trees if k % 2 == 0 else trees[::-1]:
            log(f"  frame work on {b.label} (block {k + 1} of {cfg.frame_blocks})")
            for key, rec in run_app(frame_session(cfg, b)).items():
                into = merged[b.label].setdefault(key, {"rows": rec["rows"]})
                for name, xs in rec.items():
                    if name != "rows":
                        into.setdefault(name, []).extend(xs)
    out: dict[str, Any] = {}
    for label, recs in merged.items():
        out[label] = {key: {name: (xs if name in ("rows", "after_calls") else ms_stats(xs, 90))
                            for name, xs in rec.items()} for key, rec in recs.items()}
    return out
