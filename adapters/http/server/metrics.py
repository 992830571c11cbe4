"""Prometheus metrics of a target, read from ``adapter.stats()`` at scrape time.

Labels take a fixed handful of values (a state name), never a session or node id, so the
number of series does not grow with the cache.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixtop.adapters.base import CacheAdapter

TOKEN_STATES = ("capacity", "available", "evictable", "protected", "session_held", "uncached", "unevictable",
                "total")
"""``radixtop_tokens{state}``: SGLang's leak-check words (available + evictable + protected +
session_held + uncached = capacity), their unevictable sum, and what the tree holds. A state the
target cannot tell is left out, never 0."""
BUCKETS = ("total", "available", "evictable", "protected", "session_held", "uncached")
COUNTERS = (
    ("radixtop_prompt_tokens", "prompt_tokens", "Prompt tokens of every request begun."),
    ("radixtop_cached_tokens", "cached_tokens", "Prompt tokens served from the cache."),
    ("radixtop_evicted_tokens", "evicted_tokens", "Tokens evicted."),
    ("radixtop_closes", "closes", "Sessions closed."),
    ("radixtop_freed_by_close_tokens", "freed_by_close_tokens", "Tokens freed by closing sessions."),
)


class StatsCollector(Collector):
    """One ``stats()`` per scrape; its errors propagate (the scrape fails, ``up`` goes to 0)."""

    def __init__(self, adapter: CacheAdapter):
        self.adapter = adapter

    def describe(self) -> list[Metric]:
        return []  # registering must not call the target

    def collect(self) -> Iterator[Metric]:
        st = self.adapter.stats()
        tokens = GaugeMetricFamily("radixtop_tokens", "KV cache tokens by state; available + evictable + "
                                   "protected + session_held + uncached = capacity; unevictable is the last "
                                   "three; total is what the tree holds.", labels=["state"])
        size = GaugeMetricFamily("radixtop_bytes", "KV cache bytes by state (tokens x bytes per token).",
                                 labels=["state"])
        for state in TOKEN_STATES:
            value = st.tokens_of(state)
            if value is not None:  # unknown is left out, never 0
                tokens.add_metric([state], value)
                size.add_metric([state], value * st.bytes_per_token)
        tokens.add_metric(["free"], st.available_tokens)  # "available" before 0.2: until 0.3
        size.add_metric(["free"], st.available_bytes)
        yield tokens
        yield size
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
            pool = GaugeMetricFamily("radixtop_pool_tokens", "The pool by SGLang's leak-check buckets: available + "
                                     "evictable + protected + session_held + uncached = total, per component.",
                                     labels=["component", "bucket"])
            unaccounted = GaugeMetricFamily("radixtop_pool_unaccounted_tokens", "Total less every bucket: "
                                            "0 when SGLang's leak check passes.", labels=["component"])
            for b in st.buckets:
                for bucket in BUCKETS:
                    value = getattr(b, bucket)
                    if value is not None:  # unknown is left out, never 0
                        pool.add_metric([b.component, bucket], value)
                if b.unaccounted is not None:
                    unaccounted.add_metric([b.component], b.unaccounted)
            yield pool
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
