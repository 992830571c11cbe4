"""The `radixtop` command (typer): each command opens a target (``targets.open_target``) and hands it to a face.

``main`` assembles the commands, each in its own module; errors leave through ``errors`` (one line,
one exit code); heavy imports (torch, textual, uvicorn) stay inside command bodies.
"""
