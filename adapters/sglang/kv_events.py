"""The KV-events adapter's module before 0.2: it is ``radixtop.adapters.events`` now (the ZMQ
subscriber in ``events.zmq``, the tree's adapter in ``events.adapter``; SGLang's publisher discovery in
``sglang.events.discover``); this alias goes in 0.3."""

from radixtop.adapters.events.adapter import EventTreeAdapter, StreamStatus
from radixtop.adapters.events.zmq import KVEventsAdapter, KvEventsAdapter, rank_endpoint
from radixtop.adapters.sglang.events.discover import Publisher, discover

__all__ = ["EventTreeAdapter", "KVEventsAdapter", "KvEventsAdapter", "Publisher", "StreamStatus", "discover",
           "rank_endpoint"]
