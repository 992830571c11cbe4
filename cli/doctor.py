"""`radixtop doctor`: the leak doctor over a radixtop server's admin API (``adapters.doctor``)."""

from __future__ import annotations

from typing import Annotated

import typer

from radixtop.adapters.text import inert
from radixtop.cli.options import DEFAULT_URL, Json, Timeout, Token, Url
from radixtop.cli.render import emit_json
from radixtop.cli.targets import remote_target

app = typer.Typer()

EXIT_FINDINGS = 1
"""Exit code: the doctor found something (as a refusal: 3 is still an unreachable target)."""
IdleAfter = Annotated[float, typer.Option(
    "--idle-after", min=0, max=1e9,
    help="Seconds: a session unused this long that still holds memory is a finding.")]


@app.command()
def doctor(idle_after: IdleAfter = 600.0, url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 30.0,
           as_json: Json = False) -> None:
    """Find memory nobody can use now: SGLang's buckets that do not add up, locks no running
    request holds, pinned memory that starves admission, closed sessions that still tag nodes,
    idle sessions that still hold memory; each with what it means and what fixes it. Exit 0:
    nothing found; 1: findings (or a refusal); 3: the target is unreachable."""
    from radixtop.adapters.text import diagnosis_text

    with remote_target(url, token, timeout) as t:
        diagnosis = t.diagnose(idle_after)
    if as_json:
        emit_json(diagnosis.to_dict())
    else:
        typer.echo(inert(diagnosis_text(diagnosis), lines=True))  # it quotes the target's ids
    if diagnosis.findings:
        raise typer.Exit(EXIT_FINDINGS)
