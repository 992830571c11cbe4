"""The bundled radix KV cache: radix tree, sessions, eviction, torch KV pool and engine loop."""
