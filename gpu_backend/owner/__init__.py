"""The owner-thread machinery: how radixtop's work runs on a cache's one owner thread (radixtop's
engine loop, SGLang's scheduler) between its steps without holding it long.

``queue`` hands calls to the owner and runs them between its steps, ``slices`` runs long passes a
chunk at a time within a slice of its time, ``shards`` keeps large maps whose growth never stalls
it, and ``journal`` keeps the ids a tree changed for readers that follow it. Pure Python: nothing
here loads torch, so the read-only mirrors (KV events) and the SGLang plugin use it too. The words
(step, pass, chunk, slice, hold) are defined in ``docs/architecture.md``.
"""
