"""vLLM: its prefix cache from its KV events, its figures from its /metrics."""
