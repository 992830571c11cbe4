"""Actions on a radixtop server over its admin API (close, evict, flush): plan, preview, confirm, execute."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from radixtop.adapters.text import human_bytes, in_nodes, inert, known, typed_confirmation
from radixtop.cli.errors import EXIT_REFUSED, fail
from radixtop.cli.options import DEFAULT_URL, Json, Timeout, Token, Url, Yes
from radixtop.cli.render import emit_json, plain_console
from radixtop.cli.targets import remote_target

app = typer.Typer()


def _confirm(question: str, yes: bool, typed: str | None = None) -> None:
    """Ask before an action: y/N, or for a large or bulk one (``typed``, the dashboard's rule:
    ``adapters.text.typed_confirmation``) the value typed back."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise fail("confirmation needed and stdin is not a terminal; pass --yes", EXIT_REFUSED)
    if typed is None:
        if not typer.confirm(question, default=False):
            raise fail("cancelled; nothing was changed", EXIT_REFUSED)
        return
    answer = typer.prompt(f"{question} Type {typed} to confirm", default="", show_default=False)
    if answer.strip() != typed:
        raise fail("cancelled; nothing was changed", EXIT_REFUSED)


def _refuse_if_read_only(t: Any, url: str, token: str | None) -> None:
    """One line and exit 1 where the server would refuse this client's every action (no token,
    one that only reads, or a read-only target): before a plan is shown or a question asked."""
    from radixtop.adapters.errors import Unauthorized

    caps = t.capabilities()
    if not caps.read_only:
        return
    if not token:  # said as ``remote_target`` says a refusal for want of one: what to set
        raise Unauthorized(caps.reason)
    raise fail(f"{url} refuses actions: {caps.reason or 'read-only'}", EXIT_REFUSED)


@app.command()
def close(
    session_ids: Annotated[list[str], typer.Argument(help="Sessions to close.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what a close would free; change nothing.")] = False,
    yes: Yes = False,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Close sessions: shows the exact plan first, then asks (the ids you see are the ids closed)."""
    from radixtop.adapters.errors import UnknownSession, Unsupported

    ids = list(dict.fromkeys(session_ids))
    with remote_target(url, token, timeout) as t:
        if not dry_run:
            _refuse_if_read_only(t, url, token)
        plans, unknown = [], []
        for sid in ids:
            try:
                plans.append(t.plan_close(sid))
            except UnknownSession:
                unknown.append(sid)
            except Unsupported as exc:
                if dry_run or not t.capabilities().close:  # no close at all here (vLLM): its one line
                    raise
                return _close_blind(t, ids, exc.message, yes, as_json)
        if plans and (not as_json or dry_run):  # no empty table before the errors
            _print_plans(plans, as_json and dry_run)
        for sid in unknown:
            typer.echo(f"radixtop: session {sid!r} is not known", err=True)
        if dry_run or not plans:
            if unknown:
                raise typer.Exit(EXIT_REFUSED)
            return
        total = sum(p.freed_bytes for p in plans)
        _confirm(f"Close {len(plans)} session(s), freeing {human_bytes(total)} now?", yes,
                 typed_confirmation("close", sessions=len(plans)))
        results = [t.close_session(p.session_id) for p in plans]
    if as_json:
        emit_json({"plans": [p.to_dict() for p in plans], "results": [r.to_dict() for r in results]})
    else:
        for plan, r in zip(plans, results):
            note = "" if r.freed_tokens == plan.freed_tokens else \
                f" (the plan said {plan.freed_tokens}: the cache changed in between)"
            state = "was already closed; " if r.already_closed else ""
            typer.echo(f"closed {inert(r.session_id)}: {state}freed {r.freed_tokens} tokens "
                       f"({human_bytes(r.freed_bytes)}) in {len(r.freed_node_ids)} nodes{note}")
    if unknown:
        raise typer.Exit(EXIT_REFUSED)


def _close_blind(t: Any, ids: list[str], why: str, yes: bool, as_json: bool) -> None:
    """A target that closes but cannot preview (SGLang's plain HTTP surface): say so, ask, and
    report what was seen freed afterwards."""
    typer.echo(f"radixtop: this target cannot show a close plan ({inert(why)}); what a close frees is "
               "seen only after it", err=True)
    _confirm(f"Close {len(ids)} session(s) without a preview?", yes, typed_confirmation("close", sessions=len(ids)))
    results = [t.close_session(sid) for sid in ids]
    if as_json:
        return emit_json({"plans": [], "results": [r.to_dict() for r in results]})
    for r in results:
        typer.echo(f"closed {inert(r.session_id)} ({inert(r.policy)}): {r.freed_tokens} tokens "
                   f"({human_bytes(r.freed_bytes)}) seen freed")


def _print_plans(plans: list[Any], as_json: bool) -> None:
    if as_json:
        return emit_json({"plans": [p.to_dict() for p in plans]})
    from rich.table import Table

    table = Table(title="close plan (what a close frees right now)")
    for col in ("session", "state", "frees nodes", "frees tokens", "frees", "holds dropped", "kept (why)"):
        table.add_column(col)
    for p in plans:
        kept = {}
        for k in p.kept:
            kept[k.reason] = kept.get(k.reason, 0) + k.tokens
        table.add_row(inert(p.session_id), inert(p.state), str(len(p.freed_node_ids)), f"{p.freed_tokens:,}",
                      human_bytes(p.freed_bytes), str(p.released_holds),
                      ", ".join(f"{v} tok {inert(r)}" for r, v in kept.items()) or "-")
    plain_console().print(table)


@app.command()
def evict(
    tokens: Annotated[int, typer.Argument(min=1, help="Tokens to evict, at least 1 (whole least-recently-used "
                                          "leaves).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would evict; change nothing.")] = False,
    yes: Yes = False,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Evict at least N tokens of unlocked leaves, least recently used first (10% of the
    capacity or more: type the count to confirm, as in the dashboard)."""
    with remote_target(url, token, timeout) as t:
        if not dry_run:
            _refuse_if_read_only(t, url, token)
        st = t.stats()
        if dry_run:
            would = min(tokens, st.evictable_tokens)
            doc = {"dry_run": True, "requested_tokens": tokens, "evictable_tokens": st.evictable_tokens,
                   "would_evict_at_least_tokens": would, "would_evict_at_least_bytes": would * st.bytes_per_token}
            if as_json:
                return emit_json(doc)
            typer.echo(f"would evict at least {would:,} tokens ({human_bytes(would * st.bytes_per_token)}) of "
                       f"{st.evictable_tokens:,} evictable now, whole least-recently-used leaves first; "
                       "nothing changed")
            return
        _confirm(f"Evict {tokens:,} tokens ({human_bytes(tokens * st.bytes_per_token)}) "
                 f"of {st.evictable_tokens:,} evictable?", yes,
                 typed_confirmation("evict", tokens, st.capacity_tokens))
        r = t.evict(tokens)
    if as_json:
        return emit_json(r.to_dict())
    typer.echo(f"evicted {r.evicted_tokens:,} tokens ({human_bytes(r.evicted_bytes)}) {in_nodes(r.evicted_nodes)}")


@app.command()
def flush(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would free; change nothing.")] = False,
    yes: Yes = False,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Free everything that no running request locks (type 'flush' to confirm, as in the dashboard)."""
    with remote_target(url, token, timeout) as t:
        if not dry_run:
            _refuse_if_read_only(t, url, token)
        st = t.stats()
        if dry_run:
            doc = {"dry_run": True, "would_free_tokens": st.evictable_tokens, "would_free_bytes": st.evictable_bytes}
            if as_json:
                return emit_json(doc)
            typer.echo(f"would free {st.evictable_tokens:,} evictable tokens ({human_bytes(st.evictable_bytes)}); "
                       f"{known(st.unevictable_tokens)} unevictable (locked, held or running) stay; nothing changed")
            return
        _confirm(f"Flush {st.evictable_tokens:,} evictable tokens ({human_bytes(st.evictable_bytes)})?", yes,
                 typed_confirmation("flush"))
        r = t.flush()
    if as_json:
        return emit_json(r.to_dict())
    extra = f"; {inert(r.message)}" if r.message else ""
    typer.echo(f"flushed {r.freed_tokens:,} tokens ({human_bytes(r.freed_bytes)}) {in_nodes(r.freed_nodes)}{extra}")
