"""Traces: radixtop's own JSON-lines ops and their replay (``ops``), public traces read and
converted (``formats``: Mooncake, kv-cache-tester), replays that keep figures per session and
compare cache settings (``compare``), and a trace played in real time as the engine's workload
(``playback``)."""
