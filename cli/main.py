"""The `radixtop` command: assembles the commands, each defined in its own module; alone, the dashboard."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from radixtop.cli import actions, dashboard, demo, doctor, fleet, record, remote, replay, serve
from radixtop.cli.errors import EXIT_USAGE

app = typer.Typer(
    name="radixtop",
    help="top for radix KV caches: what a prefix cache holds, who holds it, and what it costs.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from radixtop.cli.render import installed_version

        found = installed_version()
        typer.echo(f"radixtop {found}" if found else "radixtop (not installed: version unknown)")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def main_callback(
    ctx: typer.Context,
    _: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                    help="Print radixtop's version and exit.")] = False,
) -> None:
    """With no command: the dashboard on the embedded engine running its demo workload."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(dashboard.tui)


def _reflowed(doc: str | None) -> str | None:
    """A docstring as help text: its paragraphs kept, the line breaks inside them dropped (the
    terminal wraps them to its own width; hard breaks wrapped raggedly)."""
    if not doc:
        return doc
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _quiet_on_closed_pipe(command: Callable[..., Any]) -> Callable[..., Any]:
    """A reader that goes away (``radixtop export | head -1``) ends the command quietly with 0, as
    ``git`` and ``ls`` do: what is left to write goes nowhere."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            raise typer.Exit(0) from None

    return run


for commands in (dashboard, demo, replay, serve, remote, actions, doctor, fleet, record):
    for info in commands.app.registered_commands:
        info.help = info.help or _reflowed(info.callback.__doc__)
        info.callback = _quiet_on_closed_pipe(info.callback)
    app.add_typer(commands.app)


def main(args: list[str] | None = None) -> None:
    """The console script ``radixtop``. A usage error is one line, as every other error is."""
    # typer vends its own copy of click: its exceptions, not the ``click`` package's.
    from typer._click.exceptions import ClickException, UsageError

    try:
        code = app(args=args, prog_name="radixtop", standalone_mode=False)
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "radixtop"
        message = " ".join(exc.format_message().split())
        typer.echo(f"radixtop: {message} (see '{where} --help')", err=True)
        sys.exit(EXIT_USAGE)
    except ClickException as exc:
        typer.echo(f"radixtop: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("radixtop: cancelled; nothing was changed", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
