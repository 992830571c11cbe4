"""A fleet of caches in one view: many workers (and DP ranks) found through SMG, Dynamo's KV
indexer or a list of URLs, each read through its radixtop admin API or, without one, through what
its engine reports (``model``: the plain rows; ``config``: fleet, map and tokens files;
``sources``: discovery; ``probe``: concurrent bounded reads; ``dump``: Dynamo's duplicated
prefixes)."""
