"""Run by .venv-vllm's Python: vLLM's own ZmqEventPublisher (``vllm.distributed.kv_events``) for
one DP rank, publishing the batches given as JSON on each line of stdin (a list of batches, each a
list of events: {"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...fields}) built with
vLLM's own event classes, a fraction of a second apart. It prints "ready" once bound and "sent"
after each line's last batch, and keeps the publisher (and its replay buffer) until stdin closes.

    python publish.py DP_RANK ENDPOINT REPLAY_ENDPOINT TOPIC
"""

import json
import sys
import time

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher

KINDS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def main() -> None:
    rank, endpoint, replay, topic = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    publisher = ZmqEventPublisher(rank, endpoint=endpoint, replay_endpoint=replay, topic=topic)
    print("ready", flush=True)
    time.sleep(0.5)  # the subscribers' subscriptions reach the publisher
    for line in sys.stdin:
        for events in json.loads(line):
            made = [KINDS[e.pop("type")](**e) for e in events]
            publisher.publish(KVEventBatch(ts=time.time(), events=made))
            time.sleep(0.3)
        print("sent", flush=True)
    publisher.shutdown()


if __name__ == "__main__":
    main()
