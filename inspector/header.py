"""The dashboard header: target, LIVE/PAUSED and READ-ONLY badges, memory bar, sparklines."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from radixtop.adapters.model import Stats
from radixtop.adapters.text import HELD_OR_RUNNING, count, human_bytes, inert, pool_parts

HISTORY = 120
"""Samples kept for the sparklines (two minutes at the default one-second poll)."""


STYLES = {"available": "grey50", "evictable": "dark_orange", "protected": "red", "session_held": "magenta",
          "uncached": "red3", "unevictable": "red", HELD_OR_RUNNING: "red3"}
"""A state's colour, the same in the bar and its legend."""
SHORT = {"available": "avail", "evictable": "evict", "protected": "prot", "session_held": "sess",
         "uncached": "unc", "unevictable": "unev", HELD_OR_RUNNING: "sess+unc"}
"""A state's label on narrow screens."""


def memory_bar(st: Stats, width: int) -> Text:
    """The pool's parts to scale against capacity, in the legend's order: available (what is left
    of the width once the others are drawn, unknown parts included) left, then the used parts."""
    width = max(width, 10)
    used: list[tuple[str, int]] = []
    left = width
    for name, tokens in pool_parts(st)[1:]:
        cells = min(round(width * (tokens or 0) / st.capacity_tokens) if st.capacity_tokens else 0, left)
        used.append((name, cells))
        left -= cells
    text = Text("░" * left, style=STYLES["available"])
    for name, cells in used:
        text.append("█" * cells, style=STYLES[name])
    return text


def short_bytes(n: int) -> str:
    """Bytes in at most five characters, as ``du -h`` writes them: 0B, 512B, 1.5K, 955M, 12G."""
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            if unit == "B":
                return f"{int(value)}B"
            return f"{value:.1f}{unit}" if abs(value) < 10 else f"{value:.0f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


BYTES_WIDTH = 10
"""The widest ``human_bytes`` below 10,000 TiB ("1023.9 MiB"): every figure is padded to it, so
the legend's parts keep their places while the figures change."""


LEGEND_FORMS = ("full", "bytes", "short", "compact")
"""The legend's forms, widest first: tokens and bytes; bytes; short labels; short labels and figures."""


def _figure(form: str, tokens: int | None, bpt: int, token_width: int) -> str:
    """One part's figure in ``form``, padded to the widest it can be (but in the last form, which
    has nothing to switch to)."""
    if form == "compact":
        return "?" if tokens is None else short_bytes(tokens * bpt)
    amount = "unknown" if tokens is None else human_bytes(tokens * bpt)
    if form == "full":
        count_text = "?" if tokens is None else f"{tokens:,}"
        return f"{count_text:>{token_width}} tok {amount:>{BYTES_WIDTH}}"
    return f"{amount:>{BYTES_WIDTH}}"


def _parts_text(st: Stats, form: str) -> Text:
    """The pool's parts (``pool_parts``) and its capacity, in ``form``."""
    token_width = len(f"{max(st.capacity_tokens, 0):,}")
    text = Text()
    for name, tokens in pool_parts(st):
        text.append(f"■ {name if form in ('full', 'bytes') else SHORT[name]} ", style=STYLES[name])
        text.append(_figure(form, tokens, st.bytes_per_token, token_width) + " ")
    text.append("/" if form == "compact" else "of ", style="dim")
    text.append(short_bytes(st.capacity_bytes) if form == "compact" else human_bytes(st.capacity_bytes))
    return text


def _extras(st: Stats, room: int) -> list[str]:
    """What follows the parts, most wanted first: the nodes and the sessions (the sessions alone
    where not both fit in ``room``), HiCache's other tiers, SGLang's other components."""
    nodes = f" · {count(st.node_count, 'nodes')}"
    extras = [nodes]
    if st.open_sessions is not None:
        for sessions in (f" · {st.open_sessions:,} sessions open", f" · {st.open_sessions:,} sessions"):
            if len(nodes) + len(sessions) <= room:
                extras = [nodes, sessions]
                break
            if len(sessions) <= room:
                extras = [sessions]
                break
    extras += [f" · {inert(tier)} {human_bytes(tokens * st.bytes_per_token)}"
               for tier, tokens in (st.tier_tokens or {}).items() if tier != "GPU"]
    extras += [f" · [{inert(b.component)}] {(b.total - b.available - b.evictable) / b.total:.0%} used"
               for b in (st.buckets or ())[1:] if b.total]
    return extras


def legend(st: Stats, width: int) -> Text:
    """The memory bar's legend, in SGLang's words (``pool_parts``), as much of it as fits: tokens
    and bytes on wide screens, bytes only on narrower ones, short labels and figures on 80
    columns. Each figure is padded to the widest it can be, so the form is chosen by the screen's
    width and the pool's capacity, never by the figures: the legend keeps its layout from one
    refresh to the next. The node and session counts, and the other components of SGLang's leak
    check (``swa``, ``mamba``, as a share used), follow where there is room."""
    return legend_and_counts(st, width)[0]


def legend_and_counts(st: Stats, width: int) -> tuple[Text, list[str]]:
    """``legend``, and the counts it had no room for (the title line says them instead)."""
    for form in LEGEND_FORMS:
        text = _parts_text(st, form)
        if text.cell_len <= width:
            break
    for extra in _extras(st, width - text.cell_len):
        if text.cell_len + len(extra) > width:
            break
        text.append(extra)
    shown = text.plain
    counts = [count(st.node_count, "nodes")]
    if st.open_sessions is not None:
        counts.append(f"{st.open_sessions:,} sessions open")
    left_out = [c for c in counts if f" · {c.removesuffix(' open')}" not in shown]
    return text, left_out


def _set(line: Static, content: Text | str) -> None:
    """Update a one-line Static in place: its height is fixed, so no layout pass (a layout of the
    whole screen every poll costs more than everything else the header does), and nothing at
    all when the content is the same."""
    if line.content != content:
        line.update(content, layout=False)


class HeaderBar(Widget):
    """Updated by the app on every poll, even while paused."""

    DEFAULT_CSS = """
    HeaderBar { height: 6; padding: 0 1; background: $panel; }
    HeaderBar #title { height: 1; }
    HeaderBar #bar { height: 1; }
    HeaderBar #legend { height: 1; }
    HeaderBar Horizontal { height: 3; }
    HeaderBar Vertical { width: 1fr; padding: 0 1 0 0; }
    HeaderBar .spark-label { height: 1; color: $text-muted; }
    HeaderBar Sparkline { height: 2; }
    """

    def __init__(self, target: str, read_only: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.read_only = read_only
        self.paused = False
        self.interval = 1.0
        self.stats: Stats | None = None
        self.hit_rate: deque[float] = deque(maxlen=HISTORY)
        self.evictions: deque[float] = deque(maxlen=HISTORY)
        self.close_freed: deque[float] = deque(maxlen=HISTORY)
        self._last: tuple[float, Stats] | None = None
        self._own_evicted = 0
        """Tokens this dashboard's own evict or flush freed since the last sample: an operator's
        action, not the server's pressure, so not in the evicted tok/s series."""
        self.down = False
        """The last poll failed: the figures are the last good ones, not live."""

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Static(id="bar")
        yield Static(id="legend")
        with Horizontal():
            for key, label in (("hit", "hit rate"), ("evict", "evicted tok/s"), ("close", "freed by close tok/s")):
                with Vertical():
                    yield Static(label, id=f"{key}-label", classes="spark-label")
                    yield Sparkline([], id=f"{key}-spark")

    def own_eviction(self, tokens: int) -> None:
        """This dashboard evicted or flushed ``tokens``: leave them out of the evicted rate."""
        self._own_evicted += max(tokens, 0)

    def update_stats(self, st: Stats, now: float) -> None:
        """Take a new Stats sample: rates come from counter increments since the last sample,
        taken at most once per half refresh interval (a poll right after an action comes early:
        a rate over a few milliseconds is a spike, not a rate); the figures show every poll."""
        self.stats = st
        if self._last is not None and now - self._last[0] < 0.5 * self.interval:
            self.render_stats()
            return
        if self._last is not None:
            then, prev = self._last
            dt = max(now - then, 1e-6)
            prompt = st.prompt_tokens - prev.prompt_tokens
            cached = st.cached_tokens - prev.cached_tokens
            if prompt > 0:
                self.hit_rate.append(min(max(cached / prompt, 0.0), 1.0))
            elif self.hit_rate:
                self.hit_rate.append(self.hit_rate[-1])
            self.evictions.append(max(st.evicted_tokens - prev.evicted_tokens - self._own_evicted, 0) / dt)
            self.close_freed.append(max(st.freed_by_close_tokens - prev.freed_by_close_tokens, 0) / dt)
        self._own_evicted = 0
        self._last = (now, st)
        self.render_stats()

    def on_resize(self) -> None:
        self.render_stats()

    def render_stats(self) -> None:
        st = self.stats
        title = Text()
        title.append(" radixtop ", style="bold reverse")
        title.append(f" {inert(self.target)}  ")
        if st is not None and st.target and st.target not in self.target:
            title.append(f"({inert(st.target)})  ", style="dim")  # what is behind a URL
        if self.down:
            title.append(" DOWN ", style="bold white on red")
        elif self.paused:
            title.append(" PAUSED ", style="bold black on yellow")
        else:
            title.append(" LIVE ", style="bold black on green")
        if self.read_only:
            title.append(" ")
            title.append(" READ-ONLY ", style="bold white on blue")
        for b in (st.buckets or ()) if st is not None else ():
            if b.unaccounted:  # SGLang's own leak check fails: said where it cannot be missed
                title.append(" ")
                title.append(f" LEAK [{inert(b.component)}] {b.unaccounted:+,} tok ", style="bold white on red")
        every = f"  every {self.interval:g}s"
        width = max(self.size.width or self.app.size.width - 2, 10)  # the content area (padding excluded)
        legend_text, left_out = legend_and_counts(st, width) if st is not None else (Text(), [])
        for counted in left_out:  # the counts the legend had no room for: here, where they fit
            if title.cell_len + 3 + len(counted) + len(every) <= width:
                title.append(f" · {counted}")
        title.append(every, style="dim")
        _set(self.query_one("#title", Static), title)
        if st is None:
            return
        _set(self.query_one("#bar", Static), memory_bar(st, width))
        _set(self.query_one("#legend", Static), legend_text)
        for key, series, fmt in (("hit", self.hit_rate, "{:.0%}"), ("evict", self.evictions, "{:,.0f}"),
                                 ("close", self.close_freed, "{:,.0f}")):
            spark = self.query_one(f"#{key}-spark", Sparkline)
            data = list(series) if len(series) >= 2 else []  # one sample would draw as a full bar
            if spark.data != data:
                spark.data = data
            label = {"hit": "hit rate", "evict": "evicted tok/s", "close": "freed by close tok/s"}[key]
            now = fmt.format(series[-1]) if series else "-"
            _set(self.query_one(f"#{key}-label", Static), f"{label}  {now}")
