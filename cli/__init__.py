"""The `radixtop` command (typer): the dashboard, serve, replay and the client commands; each opens
a target and hands it to a face. Heavy imports (torch, textual, uvicorn) stay inside command bodies."""
