"""The KV-events adapter's module before 0.2: it is ``radixtop.adapters.sglang.events`` now (the
ZMQ subscriber in ``events.zmq``, the tree's adapter in ``events.adapter``); this alias goes in 0.3."""

from radixtop.adapters.sglang.events.adapter import EventTreeAdapter, StreamStatus
from radixtop.adapters.sglang.events.zmq import KVEventsAdapter, KvEventsAdapter, Publisher, discover, rank_endpoint

__all__ = ["EventTreeAdapter", "KVEventsAdapter", "KvEventsAdapter", "Publisher", "StreamStatus", "discover",
           "rank_endpoint"]
