"""The `radixtop` command: assembles the commands, each defined in its own module; alone, the dashboard."""

from __future__ import annotations

import typer

from radixtop.cli import actions, dashboard, demo, doctor, fleet, remote, replay, serve

app = typer.Typer(
    name="radixtop",
    help="top for radix KV caches: what a prefix cache holds, who holds it, and what it costs.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def main_callback(ctx: typer.Context) -> None:
    """With no command: the dashboard on the embedded engine running its demo workload."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(dashboard.tui)


for commands in (dashboard, demo, replay, serve, remote, actions, doctor, fleet):
    app.add_typer(commands.app)


def main() -> None:
    """The console script ``radixtop``."""
    app()


if __name__ == "__main__":
    main()
