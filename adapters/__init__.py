"""The CacheAdapter contract, the one seam between a cache and radixtop's faces, and the adapters.

The contract: the frozen views (``model``), the typed errors (``errors``), the abstract adapter
with its argument checks (``base``), and text for people (``text``); the leak doctor's rules
(``doctor``). The kit of the adapters that run on their cache's owner thread (``owned``), and the
adapters: ``bundled`` (radixtop's own engine), ``http`` (radixtop's admin API: client, shared
wire, server), ``sglang`` (a real SGLang server: in process, the scheduler plugin, its KV events,
its plain HTTP routes), ``fleet`` (many workers through a gateway or an indexer); ``targets``
builds the adapter for a URL.
"""
