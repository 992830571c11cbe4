"""The Textual dashboard: ``app`` (the one App and the CLI's entry points), its screens
(``cache_screen`` for one cache, ``fleet_view`` for a fleet), ``poller`` (reads a target into frozen
snapshots) and ``poll_loop`` (brings them to the screen), the views (``tree_view``,
``sessions_view``, ``detail``, ``header``), the tree's loaded state and its operations
(``tree_state``, ``tree_ops``), the actions' flows and the modals. It sees a cache only through the
adapter contract."""
