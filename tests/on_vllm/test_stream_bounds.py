"""A publisher radixtop should not believe everything of (a raw ZMQ PUB socket here, as a hostile
or broken peer would be): a message over the size radixtop takes is dropped at the socket, the
peer is cut off and reconnected, and the stream goes on."""

from __future__ import annotations

import time

import msgspec
import zmq

from radixtop.adapters.events.zmq import KVEventsAdapter
from tests.support.live_server import free_port


def batch(hashes, parent, tokens):
    return msgspec.msgpack.encode([time.time(), [{"type": "BlockStored", "block_hashes": hashes,
                                                  "parent_block_hash": parent, "token_ids": tokens,
                                                  "block_size": 2, "medium": "GPU"}], 0])


def test_a_batch_over_the_cap_is_dropped_and_the_stream_goes_on():
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    adapter = KVEventsAdapter(f"tcp://127.0.0.1:{port}", max_batch_bytes=64 * 1024)
    try:
        deadline = time.monotonic() + 10
        seq = 0
        while adapter.status().last_seq < 0:  # until the subscription has reached the publisher
            assert time.monotonic() < deadline
            pub.send_multipart([b"", seq.to_bytes(8, "big"), batch([seq + 1], None, [seq, seq])])
            seq += 1
            time.sleep(0.05)
        huge = batch([999], None, list(range(200_000)))  # ~600 KB
        assert len(huge) > 64 * 1024
        pub.send_multipart([b"", seq.to_bytes(8, "big"), huge])
        huge_seq, seq = seq, seq + 1
        deadline = time.monotonic() + 20
        while adapter.status().last_seq <= huge_seq:  # the next ones arrive once the SUB has reconnected
            assert time.monotonic() < deadline, adapter.status()
            pub.send_multipart([b"", seq.to_bytes(8, "big"), batch([seq + 1], None, [seq, seq])])
            seq += 1
            time.sleep(0.1)
        assert adapter.stats().total_tokens < 1000  # the huge batch's 200,000 tokens never came in
    finally:
        adapter.release()
        pub.close(0)
        ctx.term()
