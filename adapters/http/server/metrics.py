"""Prometheus metrics of a target, read from ``adapter.stats()`` at scrape time.

Labels take a fixed handful of values (a state name), never a session or node id, so the
number of series does not grow with the cache. A metric with a label is a partition (its series add
up to something, never include it): what they add up to is a gauge of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixtop.adapters.base import CacheAdapter
from radixtop.adapters.model import POOL_STATES

PARTITION = POOL_STATES
"""``radixtop_tokens{state}`` and ``radixtop_bytes{state}``: SGLang's leak-check words, which add up
to capacity, and nothing else (so ``sum(radixtop_tokens)`` is the capacity). A state the target
cannot tell is left out, never 0."""
FIGURES = (
    ("capacity", "The KV pool's capacity; radixtop_{unit}'s states add up to it."),
    ("tree", "What the radix tree holds (evictable + protected)."),
    ("unevictable", "protected + session_held + uncached: what no eviction can free (known where its parts "
                    "are not, as over SGLang's plain routes)."),
)
"""Gauges beside the partition, each of its own name (never a state of it): ``radixtop_<figure>_tokens``
and ``_bytes``. ``tree`` is ``Stats.total_tokens``."""
COUNTERS = (
    ("radixtop_prompt_tokens", "prompt_tokens", "Prompt tokens of every request begun."),
    ("radixtop_cached_tokens", "cached_tokens", "Prompt tokens served from the cache."),
    ("radixtop_evicted_tokens", "evicted_tokens", "Tokens evicted."),
    ("radixtop_closes", "closes", "Sessions closed."),
    ("radixtop_freed_by_close_tokens", "freed_by_close_tokens", "Tokens freed by closing sessions."),
)
"""Exposed with ``_total`` (the client adds it)."""
_STATS_FIELD = {"capacity": "capacity", "tree": "total", "unevictable": "unevictable"}


class StatsCollector(Collector):
    """One ``stats()`` per scrape; its errors propagate (the scrape fails, ``up`` goes to 0)."""

    def __init__(self, adapter: CacheAdapter):
        self.adapter = adapter

    def describe(self) -> list[Metric]:
        return []  # registering must not call the target

    def collect(self) -> Iterator[Metric]:
        st = self.adapter.stats()
        for unit, per_token in (("tokens", 1), ("bytes", st.bytes_per_token)):
            partition = GaugeMetricFamily(f"radixtop_{unit}", f"The KV pool in {unit} by SGLang's leak-check "
                                          "states: available + evictable + protected + session_held + uncached "
                                          f"= radixtop_capacity_{unit}.", labels=["state"])
            for state in PARTITION:
                value = st.tokens_of(state)
                if value is not None:  # unknown is left out, never 0
                    partition.add_metric([state], value * per_token)
            yield partition
            for figure, documentation in FIGURES:
                value = st.tokens_of(_STATS_FIELD[figure])
                if value is not None:
                    yield GaugeMetricFamily(f"radixtop_{figure}_{unit}", documentation.format(unit=unit),
                                            value=value * per_token)
        sessions = GaugeMetricFamily("radixtop_sessions", "Sessions by state (closed: still "
                                     "remembered).", labels=["state"])
        if st.open_sessions is not None:  # a figure the target cannot tell is left out, never 0
            sessions.add_metric(["open"], st.open_sessions)
        if st.closed_sessions is not None:
            sessions.add_metric(["closed"], st.closed_sessions)
        yield sessions
        if st.node_count is not None:
            yield GaugeMetricFamily("radixtop_nodes", "Nodes in the radix tree.", value=st.node_count)
        if st.buckets is not None:  # SGLang's leak-check buckets, by its names, per component
            pool = GaugeMetricFamily("radixtop_pool_tokens", "Each pool component by SGLang's leak-check "
                                     "buckets: available + evictable + protected + session_held + uncached = "
                                     "radixtop_pool_capacity_tokens.", labels=["component", "bucket"])
            capacity = GaugeMetricFamily("radixtop_pool_capacity_tokens", "Each pool component's size (SGLang's "
                                         "total).", labels=["component"])
            unaccounted = GaugeMetricFamily("radixtop_pool_unaccounted_tokens", "Capacity less every bucket: "
                                            "0 when SGLang's leak check passes.", labels=["component"])
            for b in st.buckets:
                capacity.add_metric([b.component], b.total)
                for bucket in PARTITION:
                    value = getattr(b, bucket)
                    if value is not None:  # unknown is left out, never 0
                        pool.add_metric([b.component, bucket], value)
                if b.unaccounted is not None:
                    unaccounted.add_metric([b.component], b.unaccounted)
            yield pool
            yield capacity
            yield unaccounted
        for name, attribute, documentation in COUNTERS:
            yield CounterMetricFamily(name, documentation, value=getattr(st, attribute))


def metrics_registry(adapter: CacheAdapter) -> CollectorRegistry:
    """A registry of its own per app (two apps in one process do not collide)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(adapter))
    return registry


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(registry), CONTENT_TYPE_LATEST
