"""The kit of the adapters that run on their cache's owner thread (the bundled engine's, SGLang's
scheduler in process): reads as passes between the owner's steps (``reads``), memory attributed
to sessions (``attribution``), and calls with the owner's failures mapped (``common``). It builds
on ``gpu_backend.owner`` and the close rules, nothing else of the backend (import-linter)."""
