"""The CacheAdapter contract and its implementations (see the adapter issue)."""
