"""Over a real SGLang server: the in-process adapter (``inproc``) with its trees, index, counters,
buckets and doctor; the scheduler plugin (``plugin``); the KV-event stream (``events``); and the
adapter for SGLang's plain HTTP routes (``routes``)."""
