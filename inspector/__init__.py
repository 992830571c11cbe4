"""The Textual dashboard: ``app`` (the App: applies snapshots, dispatches keys), ``poller`` (reads
a target into frozen snapshots), the views (``tree_view``, ``sessions_view``, ``detail``,
``header``), the tree's loaded state (``tree_state``), the actions' flows and the modals. It sees a
cache only through the adapter contract."""
