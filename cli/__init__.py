"""radixtop's typer commands; heavy imports (torch, textual, uvicorn) stay inside command bodies."""
