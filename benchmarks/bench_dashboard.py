"""radixtop's dashboard (the real Textual app) driven headless by Textual's Pilot, on caches of ~10k
and ~1M nodes, and the cost of a dashboard to a running engine.

Run from the repository root:

    .venv/bin/python benchmarks/bench_dashboard.py            # full run (10k and 1M nodes; < 10 min)
    .venv/bin/python benchmarks/bench_dashboard.py --quick    # CI smoke run (10k and 100k nodes; < 90 s)

Prints Markdown tables and writes every raw number to ``benchmarks/results/dashboard.json``.
See ``benchmarks/README.md`` for what each figure means.

The caches are built fast: a ``Scheduler`` on a ``meta`` KV pool with the llama-3-8b geometry (shapes,
no memory) and a large capacity, driven directly (``scheduler.request`` for the sessions,
``cache.insert`` with real slots from the pool's allocator for the rest), wrapped in
``Engine(scheduler, None).start()`` (the owner thread, no workload) and a ``BundledAdapter``. Every
measurement runs ``RadixtopApp`` itself under ``app.run_test(size=(160, 48))``; the app and the
adapter are only wrapped to time their calls (instance attributes and a subclass that times each
adapter call), never changed.

Sections:

1. ``trees``: one of ~10k nodes and one of ~1M, with the same 3,000 sessions (the same node ids),
   system prompts, a 1k-children node and a 1k-deep chain; the 1M one adds a node with 100k
   children and a chain 10k deep, and a forest of small trees up to the node count.
2. ``first_paint``: from constructing the app to the first completed poll with rows on screen.
3. ``keys``: key-press-to-screen latency: from ``pilot.press`` until the widgets reflect the key,
   the workers are idle and ``pilot.pause()`` (which repaints the screen) has returned; and the
   same key measured directly (the key event, then 1 ms checks and one screen update), without
   Pilot's idle-detection sleeps (about 88 ms a press).
4. ``frame``: the work of one poll, with the poll timer off: ``collect()`` + ``apply_snapshot()``
   + ``render_line`` of every visible line of the tree and the sessions table, on an unchanged
   tree and right after a tree change, with the same nodes expanded at 10k and at 1M.
5. ``throughput``: ``engine.requests_finished`` over a fixed window for an engine running the demo
   workload flat out on a ~100k-node cache, with a dashboard attached (1 s refresh) and without,
   alternating runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent

from _common import (  # noqa: E402
    TreeConfig,
    build_tree,
    environment,
    finish,
    fmt_ms,
    fmt_nodes,
    log,
    median,
    release,
    rss_mib,
    start_engine,
    verdict,
)
from _dashboard_screen import SIZE, measure_first_paint, measure_frame, measure_keys  # noqa: E402
from _dashboard_throughput import GC, MODES, alternating_run, measure_throughput  # noqa: E402

pc = time.perf_counter


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


# The trees are TreeConfig's (_common.py). Its defaults are this benchmark's small tree: 3,000
# sessions of 1-3 turns, a 1k-children node, a 1k-deep chain, small full trees up to the node count.


@dataclass(frozen=True)
class BenchConfig:
    mode: str
    small: TreeConfig
    large: TreeConfig
    throughput_tree: TreeConfig
    paint_repeats: int  # app starts per tree (first paint)
    down_presses: int  # cursor-down presses per tree
    press_repeats: int  # expand / collapse / sort / next-page presses per tree
    chain_repeats: int  # fold + unfold of the 1k chain
    long_chain_repeats: int  # fold + unfold of the long chain (large tree only)
    frame_repeats: int  # polls per mode per tree per block
    frame_blocks: int  # blocks of (small, large) app sessions, alternating
    tp_pairs: int  # (without, with) pairs of throughput runs, order alternating
    tp_window_s: float
    tp_warmup_s: float  # engine running before the window opens (without the dashboard)
    alt_pairs: int  # (without, with) windows in the one-engine alternating run
    alt_window_s: float
    interval: float = 1.0  # the dashboard's refresh (its default)


def full_config() -> BenchConfig:
    return BenchConfig(
        mode="full",
        small=TreeConfig("10k", 10_000),
        large=TreeConfig("1M", 1_000_000, fanouts=(1_000, 100_000), chains=(1_000, 10_000)),
        throughput_tree=TreeConfig("1M", 1_000_000, fanouts=(1_000, 100_000), extra_capacity=40_000_000),
        paint_repeats=5, down_presses=60, press_repeats=10, chain_repeats=5, long_chain_repeats=3,
        frame_repeats=10, frame_blocks=4, tp_pairs=6, tp_window_s=20.0, tp_warmup_s=2.0,
        alt_pairs=40, alt_window_s=5.0,
    )


def quick_config() -> BenchConfig:
    return BenchConfig(
        mode="quick",
        small=TreeConfig("10k", 10_000),
        large=TreeConfig("100k", 100_000, fanouts=(1_000, 10_000), chains=(1_000, 2_000)),
        throughput_tree=TreeConfig("30k", 30_000, extra_capacity=4_000_000),
        paint_repeats=2, down_presses=12, press_repeats=3, chain_repeats=2, long_chain_repeats=1,
        frame_repeats=6, frame_blocks=1, tp_pairs=1, tp_window_s=6.0, tp_warmup_s=1.0,
        alt_pairs=4, alt_window_s=2.0,
    )


# Goals (see benchmarks/README.md).
GOAL_FIRST_PAINT_S = 1.0  # at 1M nodes
GOAL_FRAME_RATIO = 1.2  # one poll's work at 1M / at 10k, same things expanded
GOAL_THROUGHPUT_SHARE = 0.95  # requests finished with a dashboard attached / without
INSTANT_MS = 100.0  # reference for key presses (not a goal): what still feels instant


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------


def report(cfg: BenchConfig, res: dict[str, Any]) -> str:
    small, large = cfg.small.label, cfg.large.label
    lines = [
        "### Trees (llama-3-8b KV on a meta pool; built with GC off, then collected and frozen)",
        "",
        "| tree | nodes | tokens | sessions (holding / closed) | running | root children | system prompt "
        "children | fan-outs | chains | max depth | build (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for label in (small, large):
        f = res["trees"][label]
        lines.append(
            f"| {label} | {f['nodes']:,} | {f['tokens'] / 1e6:.2f}M | {f['sessions_known']:,} "
            f"({f['sessions_tagging']:,} / {f['closed_sessions']}) | {f['running_requests']} | "
            f"{f['root_children']:,} | {min(f['system_prompt_children'])}-{max(f['system_prompt_children'])} | "
            f"{', '.join(f'{int(v):,}' for v in f['fanouts'].values())} children | "
            f"{', '.join(f'{d:,}' for d in f['chains'])} deep | {f['max_depth']:,} | {f['build_s']:.1f} |")

    fp = res["first_paint"]
    lines += [
        "",
        f"### Time to first paint: app constructed -> first poll applied with rows on screen "
        f"(median of {cfg.paint_repeats} starts; ms)",
        "",
        "| tree | app ready (mounted) | first `collect()` | of which attribution | rows applied | "
        "**first paint** (on screen) | max | app idle (context) | goal | met |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for label in (small, large):
        p = fp[label]
        goal = label == large
        lines.append(
            f"| {label} | {fmt_ms(p['ready_s']['median'])} | {fmt_ms(p['collect_s']['median'])} | "
            f"{fmt_ms(p['attribute_s']['median'])} | {fmt_ms(p['applied_s']['median'])} | "
            f"**{fmt_ms(p['paint_s']['median'])}** | {fmt_ms(p['paint_s']['max'])} | "
            f"{fmt_ms(p['idle_s']['median'])} | {'< 1 s' if goal else '-'} | "
            f"{verdict(p['paint_s']['median'] < GOAL_FIRST_PAINT_S * 1e3) if goal else '-'} |")

    k = res["keys"]
    big_fan = max(int(x) for x in res["trees"][large]["fanouts"])
    long_chain = max(res["trees"][large]["chains"])
    sp = res["trees"][large]["system_prompt_children"]
    rows = [
        ("noop", "a key bound to nothing (`z`): the method's own floor"),
        ("down", f"cursor down (x{cfg.down_presses}, one press each; the detail pane follows)"),
        ("expand_system", f"expand a system prompt ({min(sp)}-{max(sp)} children; loads its first page of 100)"),
        ("collapse_system", "collapse it"),
        ("expand_fanout_1000", "expand the 1k-children node (first page of 100)"),
        (f"expand_fanout_{big_fan}", f"expand the {big_fan // 1000}k-children node (first page of 100)"),
        ("more_1000", "next page of 100 (\"more\" row) under the 1k-children node"),
        (f"more_{big_fan}", f"next page of 100 (\"more\" row) under the {big_fan // 1000}k-children node"),
        ("order_V", "toggle sort order (`o`), view V"),
        ("order_V+", f"toggle sort order (`o`), view V+ (the {big_fan // 1000}k-children node open)"),
        ("fold_chain_1000", "fold (`x`) the 1k-deep chain into one row"),
        ("unfold_chain_1000", "unfold it (`x`)"),
        (f"fold_chain_{long_chain}", f"fold (`x`) the {long_chain // 1000}k-deep chain (walks it)"),
        (f"unfold_chain_{long_chain}", "unfold it (`x`)"),
    ]
    lines += [
        "",
        "### Key press to screen (medians, ms; p90 in brackets). Pilot: `pilot.press` -> widgets reflect it, "
        "workers idle, `pilot.pause()` returned. Direct: the same key event -> reflected, idle, one screen update "
        "(1 ms checks, none of Pilot's idle-detection sleeps)",
        "",
        f"| key press | {small}: Pilot | {small}: direct | {large}: Pilot | {large}: direct | "
        f"{large}/{small} (direct) | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    cell = lambda x: "-" if x is None else f"{fmt_ms(x['median'])} ({fmt_ms(x['p90'])})"  # noqa: E731
    for key, label in rows:
        ap, ad = k[small]["pilot"].get(key), k[small]["direct"].get(key)
        bp, bd = k[large]["pilot"].get(key), k[large]["direct"].get(key)
        if bd is None:
            continue
        ratio = f"{bd['median'] / ad['median']:.2f}x" if ad else "-"
        lines.append(f"| {label} | {cell(ap)} | {cell(ad)} | {cell(bp)} | {cell(bd)} | {ratio} | {bd['n']} |")

    fr = res["frame"]
    lines += [
        "",
        f"### Frame work per refresh: one poll's `collect()` + `apply_snapshot()` + `render_line` of every "
        f"visible line (median of {cfg.frame_repeats * cfg.frame_blocks}; ms)",
        "",
        f"| poll | view | {small}: collect | apply | render | **total** | {large}: collect | apply | render | "
        f"**total** | {large}/{small} | goal | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for mode, what in (("idle", "tree unchanged"), ("changed", "after a tree change")):
        for vname in ("V", "V+"):
            b = fr[large].get(f"{vname}/{mode}")
            if b is None:
                continue
            a = fr[small][f"V/{mode}"]
            ratio = b["total"]["median"] / a["total"]["median"]
            goal = vname == "V"
            vlabel = f"V ({b['rows']} rows)" if vname == "V" else f"V+ at {large} vs V at {small}"
            lines.append(
                f"| {what} | {vlabel} | {fmt_ms(a['collect']['median'])} | {fmt_ms(a['apply']['median'])} | "
                f"{fmt_ms(a['render']['median'])} | **{fmt_ms(a['total']['median'])}** | "
                f"{fmt_ms(b['collect']['median'])} | {fmt_ms(b['apply']['median'])} | "
                f"{fmt_ms(b['render']['median'])} | **{fmt_ms(b['total']['median'])}** | {ratio:.2f}x | "
                f"{f'<= {GOAL_FRAME_RATIO}x' if goal else '-'} | "
                f"{verdict(ratio <= GOAL_FRAME_RATIO) if goal else '-'} |")
    g = res["gc"]["frame"]
    lines += [
        "",
        f"Cyclic GC while the frame work was measured (both trees): {g['collections']:,} collections "
        f"({g['gen2']} of generation 2), {g['total_ms']:,.0f} ms in all, the longest {g['max_ms']:.0f} ms.",
    ]
    lines += [
        "",
        "Where a poll's `collect()` goes (median ms per poll; `children` sums every page reloaded; "
        "attribution runs inside `sessions`/`node`; engine hold is the time the reads held the owner thread):",
        "",
        "| poll | tree / view | stats | changes | children | sessions | of which attribution | node | other "
        "(flatten, copies) | engine hold | reads after apply (calls) | Textual screen updates after it (context) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in ("idle", "changed"):
        for label, vname in ((small, "V"), (large, "V"), (large, "V+")):
            r = fr[label].get(f"{vname}/{mode}")
            if r is None:
                continue
            m = lambda x: fmt_ms(r[x]["median"])  # noqa: E731
            lines.append(f"| {mode} | {label} / {vname} | {m('call_stats')} | {m('call_changes')} | "
                         f"{m('call_children')} | {m('call_sessions')} | {m('call_attribute')} | {m('call_node')} | "
                         f"{m('call_other')} | {m('hold')} | {m('after')} ({median(r['after_calls']):.0f}) | "
                         f"{m('screen')} |")
    lines += ["", throughput_table(cfg, res["throughput"])]
    return "\n".join(lines)


def alternating_table(cfg: BenchConfig, alt: dict[str, Any]) -> str:
    ws = alt["windows"]
    pct = lambda xs: ", ".join(f"{x:.1%}" for x in xs)  # noqa: E731
    return "\n".join([
        f"### Engine throughput with the dashboard attached and stopped in turn ({cfg.interval:g} s refresh): "
        f"one engine, demo workload flat out on a {fmt_nodes(alt['tree_nodes_before'])}-node cache "
        f"({fmt_nodes(alt['tree_nodes_after'])} at the end), "
        f"{len(ws)} windows of {cfg.alt_window_s:g} s in blocks of (without, with, with, without)",
        "",
        "| measure | value | goal | met |",
        "|---|---:|---|---|",
        f"| **with / without** (mean over the {len(alt['block_ratios'])} blocks) | "
        f"**{alt['ratio_mean']:.1%}** | >= {GOAL_THROUGHPUT_SHARE:.0%} | "
        f"{verdict(alt['ratio_mean'] >= GOAL_THROUGHPUT_SHARE)} |",
        f"| 90% interval of that mean (bootstrap over the blocks) | "
        f"{alt['ratio_mean_ci90'][0]:.1%} .. {alt['ratio_mean_ci90'][1]:.1%} | - | - |",
        f"| that mean less the bound on the generation-2 cost left out "
        f"({alt['gen2_left_out_share']:.2%}: collections {alt['collections_per_s']['without']:.1f} / "
        f"{alt['collections_per_s']['with']:.1f} per s without / with, full passes between blocks "
        f"{alt['collect_between_ms_per_s']:.0f} ms per s of window) | "
        f"{alt['ratio_mean_less_left_out']:.1%} | >= {GOAL_THROUGHPUT_SHARE:.0%} | "
        f"{verdict(alt['ratio_mean_less_left_out'] >= GOAL_THROUGHPUT_SHARE)} |",
        f"| with / without, median of the blocks | {alt['ratio_block_median']:.1%} | - | - |",
        f"| with / without, median of the {len(alt['pair_ratios'])} adjacent pairs "
        f"(90% interval {alt['ratio_median_ci90'][0]:.1%} .. {alt['ratio_median_ci90'][1]:.1%}) | "
        f"{alt['ratio_median']:.1%} | - | - |",
        f"| with / without (all windows: requests / seconds) | {alt['ratio_total']:.1%} | - | - |",
        f"| requests/s without / with | {alt['without_requests_per_s']:,.0f} / {alt['with_requests_per_s']:,.0f} | - | - |",
        f"| prompt tokens/s, with / without (all windows) | {alt['ratio_tokens']:.1%} | - | - |",
        f"| engine thread time left for requests, with / without (its CPU less the dashboard's reads "
        f"and attribution slices: {alt['engine_ms_for_requests_per_s']['without']:.0f} / "
        f"{alt['engine_ms_for_requests_per_s']['with']:.0f} ms per s) | "
        f"{alt['ratio_engine_time_for_requests']:.1%} | - | - |",
        f"| engine hold by the dashboard's reads (ms per s, windows with it; most in one window) | "
        f"{alt['hold_ms_per_s_with']:.1f}; {max(w['hold_ms'] for w in ws):,.0f} ms | - | - |",
        f"| passes in slices between the engine's steps (ms per s) without / with; most in one "
        f"window; sessions reads (their work) | {alt['slices_ms_per_s']['without']:.1f} / "
        f"{alt['slices_ms_per_s']['with']:.1f}; {alt['slices_ms_most_in_a_window']:,.0f} ms; "
        f"{alt['sessions_reads']['n']} ({alt['sessions_reads']['work_s'] * 1e3:,.0f} ms) | - | - |",
        f"| admin API event-loop thread CPU (ms per s) without / with | "
        f"{alt['api_cpu_ms_per_s']['without']:.1f} / {alt['api_cpu_ms_per_s']['with']:.1f} | - | - |",
        f"| engine thread CPU (ms per s) without / with | "
        f"{alt['engine_cpu_ms_per_s']['without']:.0f} / {alt['engine_cpu_ms_per_s']['with']:.0f} | - | - |",
        f"| dashboard process CPU (ms per s, windows with it) | {alt['dashboard_cpu_ms_per_s']:.0f} | - | - |",
        f"| GC pauses in the engine's process within the windows (ms per s) without / with | "
        f"{alt['gc_ms_per_s']['without']:.0f} / {alt['gc_ms_per_s']['with']:.0f} | - | - |",
        f"| dashboard polls (all windows with it) | {alt['polls']} | - | - |",
        "",
        f"Per block: {pct(alt['block_ratios'])}.",
        "",
        f"Per pair: {pct(alt['pair_ratios'])}.",
    ])


def throughput_table(cfg: BenchConfig, tp: dict[str, Any]) -> str:
    by_mode = {m: [r for r in tp["runs"] if r["mode"] == m] for m in MODES}
    med = lambda rs, key: median([r[key] for r in rs])  # noqa: E731
    gc_rate = lambda rs: median([r["gc"]["total_ms"] / r["window_s"] for r in rs])  # noqa: E731
    per_run = lambda rs: ", ".join(f"{r['requests_per_s']:,.0f}" for r in rs)  # noqa: E731
    label = {"without": "without", "process": "**dashboard in its own process** (what `radixtop` runs)",
             "inprocess": "dashboard in the engine's process (reference)"}
    lines = [
        f"### Engine throughput with a dashboard attached ({cfg.interval:g} s refresh) and without: demo workload "
        f"flat out on a ~{fmt_nodes(tp['runs'][0]['tree_nodes'])}-node cache, {cfg.tp_window_s:.0f} s windows, "
        f"{cfg.tp_pairs} rounds of the three runs (order rotating)",
        "",
        "| run | requests/s (median) | per run | engine thread CPU (s/s) | process CPU (s/s) | GC pauses (ms/s) | "
        "polls | engine hold per poll (ms) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        rs = by_mode[mode]
        if not rs:
            continue
        polls = f"{med(rs, 'polls'):.0f}" if mode != "without" else "-"
        hold = f"{med(rs, 'engine_hold_ms_per_poll'):.1f}" if mode != "without" else "-"
        lines.append(f"| {label[mode]} | {med(rs, 'requests_per_s'):,.0f} | {per_run(rs)} | "
                     f"{med(rs, 'engine_cpu_per_s'):.2f} | {med(rs, 'process_cpu_per_s'):.2f} | "
                     f"{gc_rate(rs):.0f} | {polls} | {hold} |")
    lines += [
        "",
        "| measure | value | per round | goal | met |",
        "|---|---:|---|---|---|",
        f"| **with / without**, dashboard in its own process (median of the per-round ratios) | "
        f"**{tp['ratio']:.1%}** | {', '.join(f'{x:.1%}' for x in tp['ratio_per_pair'])} | "
        f">= {GOAL_THROUGHPUT_SHARE:.0%} | {verdict(tp['ratio'] >= GOAL_THROUGHPUT_SHARE)} |",
        f"| with / without, dashboard in the engine's process (reference) | {tp['inprocess_ratio']:.1%} | "
        f"{', '.join(f'{x:.1%}' for x in tp['inprocess_ratio_per_pair'])} | - | - |",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def dashboard_environment() -> dict[str, Any]:
    import rich
    import textual
    import torch

    return environment(
        torch=torch.__version__,
        textual=textual.__version__,
        rich=getattr(rich, "__version__", "?"),
        terminal=f"{SIZE[0]}x{SIZE[1]} (app.run_test, headless)",
        gc="trees built with GC disabled, then collected and frozen; GC enabled while measuring",
        timer="time.perf_counter",
        threads="app (main thread, asyncio), its thread workers, engine owner thread: one process, one GIL",
    )


class _SkipTreeSections(Exception):
    """--only-throughput: sections 1-4 are left out."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k and 100k nodes, fewer repeats (< 90 s)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "dashboard.json", help="JSON results path")
    ap.add_argument("--skip-throughput", action="store_true", help="leave out section 5")
    ap.add_argument("--only-throughput", action="store_true", help="run section 5 alone")
    ap.add_argument("--only-alternating", action="store_true",
                    help="run only section 5's one-engine measurement (dashboard stopped and continued in turn)")
    ap.add_argument("--pairs", type=int, default=None, help="(without, with) pairs in the alternating run")
    args = ap.parse_args(argv)
    cfg = quick_config() if args.quick else full_config()
    if args.pairs is not None:
        cfg = replace(cfg, alt_pairs=args.pairs)

    t_all = pc()
    import logging

    logging.getLogger("gpu_backend.engine").setLevel(logging.ERROR)
    results: dict[str, Any] = {"mode": cfg.mode, "config": asdict(cfg), "environment": dashboard_environment(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "goals": {"first_paint_s": GOAL_FIRST_PAINT_S, "frame_ratio": GOAL_FRAME_RATIO,
                                         "throughput_share": GOAL_THROUGHPUT_SHARE, "instant_ms": INSTANT_MS}}
    trees = []
    for tc in () if args.only_throughput or args.only_alternating else (cfg.small, cfg.large):
        log(f"mode {cfg.mode}: building the {tc.label} tree")
        b = build_tree(tc)
        start_engine(b)
        trees.append(b)
        log(f"  {b.facts['nodes']:,} nodes in {b.build_s:.1f} s (RSS {rss_mib():.0f} MiB)")
    results["trees"] = {b.label: b.facts for b in trees}
    try:
        if args.only_throughput or args.only_alternating:
            raise _SkipTreeSections
        log(f"first paint: {cfg.paint_repeats} starts per tree")
        results["gc"] = {}
        mark = GC.mark()
        results["first_paint"] = measure_first_paint(cfg, trees)
        results["gc"]["first_paint"], mark = GC.since(mark), GC.mark()
        log("key presses")
        results["keys"] = measure_keys(cfg, trees)
        results["gc"]["keys"], mark = GC.since(mark), GC.mark()
        log("frame work per refresh")
        results["frame"] = measure_frame(cfg, trees)
        results["gc"]["frame"] = GC.since(mark)
    except _SkipTreeSections:
        pass
    finally:
        for b in trees:
            release(b)
        trees.clear()
    if not args.skip_throughput:
        log(f"throughput, one engine: {cfg.alt_pairs} pairs of {cfg.alt_window_s:g} s windows, "
            f"the dashboard stopped and continued in turn")
        results["alternating"] = alternating_run(cfg)
        alt = results["alternating"]
        log(f"  with / without: {alt['ratio_mean']:.1%} (mean of blocks; 90% interval "
            f"{alt['ratio_mean_ci90'][0]:.1%} .. {alt['ratio_mean_ci90'][1]:.1%})")
    if not args.skip_throughput and not args.only_alternating:
        log(f"throughput: {cfg.tp_pairs} rounds of {cfg.tp_window_s:.0f} s runs")
        results["throughput"] = measure_throughput(cfg)
    results["wall_s"] = pc() - t_all
    table = (report(cfg, results) if "throughput" in results and "frame" in results
             else throughput_table(cfg, results["throughput"]) if "throughput" in results
             else "(throughput skipped: no report)" if "alternating" not in results else "")
    if "alternating" in results:
        table = alternating_table(cfg, results["alternating"]) + ("\n\n" + table if table else "")
    finish(args.out, results, table,
           f"_{cfg.mode} run, {results['wall_s']:.0f} s wall (tree builds included); JSON: {args.out}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
