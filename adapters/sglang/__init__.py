"""Over a real SGLang server: the in-process adapter and its trees, the scheduler plugin, the
KV-event stream and its decoder, and the adapter for SGLang's plain HTTP routes."""
