"""The dashboard header: target, LIVE/PAUSED and READ-ONLY badges, memory bar, sparklines."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from radixtop.adapters.model import Stats
from radixtop.inspector.format import count, human_bytes, inert

HISTORY = 120
"""Samples kept for the sparklines (two minutes at the default one-second poll)."""


def memory_bar(st: Stats, width: int) -> Text:
    """protected | evictable | free, to scale, against capacity."""
    width = max(width, 10)
    text = Text()
    used = 0
    for tokens, style in ((st.protected_tokens, "red"), (st.evictable_tokens, "dark_orange")):
        cells = min(round(width * tokens / st.capacity_tokens) if st.capacity_tokens else 0, width - used)
        text.append("█" * cells, style=style)
        used += cells
    text.append("░" * (width - used), style="grey50")
    return text


def legend(st: Stats, width: int) -> Text:
    """The memory bar's legend, as much of it as fits: tokens and bytes on wide screens, bytes
    only on narrower ones, short labels on 80 columns. Where the target has SGLang's leak-check
    buckets, the legend uses them, by SGLang's names (protected is then split into protected,
    session_held and uncached), for its first component; the others follow as a share used."""
    bpt = st.bytes_per_token
    parts: tuple[tuple[str, str, int], ...] = (
        ("protected", "red", st.protected_tokens), ("evictable", "dark_orange", st.evictable_tokens),
        ("free", "grey50", st.free_tokens))
    if st.buckets:
        b = st.buckets[0]
        parts = (("protected", "red", b.protected), ("session_held", "magenta", b.session_held),
                 ("uncached", "red3", b.uncached), ("evictable", "dark_orange", b.evictable),
                 ("available", "grey50", b.available))
        parts = tuple(p for p in parts if p[2] is None or p[2] or p[0] in ("protected", "evictable", "available"))
    short = {"protected": "prot", "evictable": "evict", "free": "free", "session_held": "sess",
             "uncached": "unc", "available": "avail"}
    for form in ("full", "bytes", "short", "shortest"):
        text = Text()
        for name, style, tokens in parts:
            text.append(f"■ {name if form in ('full', 'bytes') else short[name]} ", style=style)
            if tokens is None:
                text.append("unknown  ")
                continue
            amount = human_bytes(tokens * bpt)
            text.append(f"{tokens:,} tok {amount}  " if form == "full" else f"{amount}  ")
        text.append("of ", style="dim")
        text.append(human_bytes(st.capacity_bytes))
        if form != "shortest":
            text.append(f" · {count(st.node_count, 'nodes')}")
        if st.open_sessions is not None:
            text.append(f" · {st.open_sessions:,} sessions" + (" open" if form != "shortest" else ""))
        for tier, tokens in (st.tier_tokens or {}).items():
            if tier != "GPU" and form != "shortest":  # HiCache's other tiers beside the device pool
                text.append(f" · {inert(tier)} {human_bytes(tokens * bpt)}")
        for other in (st.buckets or ())[1:]:
            used = other.total - other.available - other.evictable
            text.append(f" · [{inert(other.component)}] {used / other.total:.0%} used" if other.total else "")
        if text.cell_len <= width:
            break
    return text


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
        title.append(f"  every {self.interval:g}s", style="dim")
        _set(self.query_one("#title", Static), title)
        if st is None:
            return
        width = max((self.size.width or self.app.size.width) - 2, 10)
        _set(self.query_one("#bar", Static), memory_bar(st, width))
        _set(self.query_one("#legend", Static), legend(st, width))
        for key, series, fmt in (("hit", self.hit_rate, "{:.0%}"), ("evict", self.evictions, "{:,.0f}"),
                                 ("close", self.close_freed, "{:,.0f}")):
            spark = self.query_one(f"#{key}-spark", Sparkline)
            data = list(series) if len(series) >= 2 else []  # one sample would draw as a full bar
            if spark.data != data:
                spark.data = data
            label = {"hit": "hit rate", "evict": "evicted tok/s", "close": "freed by close tok/s"}[key]
            now = fmt.format(series[-1]) if series else "-"
            _set(self.query_one(f"#{key}-label", Static), f"{label}  {now}")
