"""The bundled radix KV cache: radix tree, sessions, eviction, torch KV pool, traces, the engine
loop, and the owner-thread queue that the engine and the SGLang plugin both run reads through."""
