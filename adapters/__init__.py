"""The CacheAdapter contract, the one seam between a cache and radixtop's faces.

Here: the frozen views (``model``), the typed errors (``errors``), the abstract adapter with its
argument checks (``base``), units (``units``) and memory attribution per session
(``attribution``); the bundled adapter over radixtop's own engine (``bundled``). The adapters for
other targets are in ``http`` (radixtop's admin API: server and client) and ``sglang`` (a real
SGLang server: in process, the scheduler plugin, its KV events, its plain HTTP routes).
"""
