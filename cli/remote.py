"""Commands that talk to a radixtop server over its admin API (stats, tree, sessions, close, ...)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from radixtop.adapters.model import POOL_STATES
from radixtop.adapters.text import age, bucket_line, count, figures_note, human_bytes, inert, known, typed_confirmation
from radixtop.cli.options import DEFAULT_URL, Json, Timeout, Token, Url, Yes

app = typer.Typer()

# Exit codes: 0 done, 1 refused or unknown id, 2 usage, 3 target unreachable or timed out.
EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


def _exit(message: str, code: int) -> typer.Exit:
    typer.echo(f"radixtop: {inert(message)}", err=True)  # it may quote a target's words
    return typer.Exit(code)


@contextlib.contextmanager
def target(url: str, token: str | None, timeout: float) -> Iterator[Any]:
    """An RadixtopClient for ``url``; turns every adapter error into one line and an exit code."""
    from radixtop.adapters.errors import AdapterError, BadRequest, TargetTimeout, TargetUnreachable, Unauthorized
    from radixtop.adapters.http.client import RadixtopClient

    try:
        adapter = RadixtopClient(url, token=token, timeout=timeout)
    except BadRequest as exc:  # a URL or token that cannot be sent
        raise _exit(exc.message, EXIT_USAGE) from None
    try:
        yield adapter
    except (TargetUnreachable, TargetTimeout) as exc:
        raise _exit(exc.message, EXIT_UNREACHABLE) from None
    except BadRequest as exc:
        raise _exit(exc.message, EXIT_USAGE) from None
    except Unauthorized:  # say what to do, not which HTTP header was missing
        given = "the token given is not this server's" if token else "no token given"
        raise _exit(f"{url} refused the action: {given}; set RADIXTOP_TOKEN to the token the server "
                    "printed at start (or its plugin's token file)", EXIT_REFUSED) from None
    except AdapterError as exc:
        raise _exit(exc.message, EXIT_REFUSED) from None
    finally:
        adapter.release()


def emit_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, separators=(",", ":"), default=list))


def _console():
    """Rich without markup, highlighting or emoji codes: what the commands print quotes the
    target's strings (ids, names, text), which are shown as written, through ``inert``; the
    commands' own styles are Text styles."""
    from rich.console import Console

    return Console(markup=False, highlight=False, emoji=False)


# ----- reads -----


@app.command()
def stats(url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False) -> None:
    """Cache totals in SGLang's words (available, evictable, protected, session_held, uncached), sessions, counters."""
    with target(url, token, timeout) as t:
        st = t.stats()
    if as_json:
        return emit_json(st.to_dict())
    from rich.table import Table

    table = Table(title=f"{inert(st.target)} · {inert(st.geometry.name)} · {human_bytes(st.bytes_per_token)}/token",
                  show_header=True)
    for col in ("", "tokens", "bytes", "share"):
        table.add_column(col, justify="right" if col else "left")
    split = st.protected_tokens is not None or st.uncached_tokens is not None
    for name in (*POOL_STATES, "capacity") if split else ("available", "evictable", "unevictable", "capacity"):
        tokens = st.tokens_of(name)
        if tokens is None:  # the target cannot tell: said, never 0
            table.add_row(name, "unknown", "unknown", "-")
            continue
        share = f"{tokens / st.capacity_tokens:.1%}" if st.capacity_tokens else "-"
        table.add_row(name, f"{tokens:,}", human_bytes(tokens * st.bytes_per_token), share)
    console = _console()
    console.print(table)
    hit = f"{st.cached_tokens / st.prompt_tokens:.1%}" if st.prompt_tokens else "-"
    console.print(
        f"{count(st.node_count, 'nodes')} · {count(st.open_sessions, 'sessions open')} · "
        f"{count(st.closed_sessions, 'closed')} · "
        f"cache hit (since start) {hit} · {st.closes} closes freed {st.freed_by_close_tokens:,} tokens · "
        f"{st.evicted_tokens:,} tokens evicted · version {st.version}"
    )
    if st.tier_tokens and set(st.tier_tokens) != {"GPU"}:  # HiCache's other tiers
        console.print("tiers: " + " · ".join(f"{inert(tier)} {tokens:,} tokens ({human_bytes(tokens * st.bytes_per_token)})"
                                              for tier, tokens in st.tier_tokens.items()))
    for b in st.buckets or ():  # SGLang's leak check, by its names: what an operator greps its log for
        console.print(bucket_line(b))


def _node_label(n: Any):
    from rich.text import Text

    preview = inert(n.text) if n.text is not None else " ".join(map(str, n.first_tokens[:8]))
    if n.text is None and n.tokens > 8:
        preview += " …"
    holders = (f" held by {', '.join(map(inert, n.holders[:3]))}{'…' if len(n.holders) > 3 else ''}"
               if n.holders else "")  # None (unknown) is said once, above the tree
    lock = f" lock_ref={n.lock_ref}" if n.lock_ref else ""
    return Text.assemble((f"#{n.id}", "bold"), f" {n.tokens} tok · {human_bytes(n.bytes)} · subtree "
                         f"{human_bytes(n.subtree_bytes)}{lock}{holders} · ", (preview, "dim"))


@app.command()
def tree(
    node: Annotated[str, typer.Argument(help="Where to start: a node id, or root.")] = "root",
    depth: Annotated[int, typer.Option(min=1, max=64, help="Levels to show.")] = 3,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Children shown per node.")] = 10,
    min_bytes: Annotated[int, typer.Option(min=0, help="Hide subtrees smaller than this.")] = 0,
    order: Annotated[str, typer.Option(help="bytes, recency or tokens.")] = "bytes",
    session: Annotated[str | None, typer.Option(help="Show only the chains this session holds.")] = None,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """The tree as people read it: largest subtrees first, paged."""
    start = _node_id(node)
    with target(url, token, timeout) as t:
        if session is not None:
            doc = _session_tree(t, session)
        else:
            doc = _subtree(t, start, depth, limit, min_bytes, order)
    if as_json:
        return emit_json(_tree_json(doc))
    from rich.text import Text
    from rich.tree import Tree

    def build(parent: Tree, d: dict) -> None:
        for child in d["children"]:
            build(parent.add(_node_label(child["node"])), child)
        if d.get("more"):
            parent.add(Text(f"… {d['more']} more", style="dim"))

    top = doc["node"]
    if top.id == 0:
        label = Text.assemble(("root", "bold"), f" · {human_bytes(top.subtree_bytes)} in the tree")
    else:
        label = _node_label(top)
    shown = doc["children"][0]["node"] if top.id == 0 and doc["children"] else top  # the root has no locks
    unknown = [what for what, gone in (("locks", shown.lock_ref is None), ("holders", shown.holders is None)) if gone]
    if unknown:  # a tree kept from KV events: said once, not as a 0 on every node
        label.append(f" · {' and '.join(unknown)} unknown (this target cannot tell)", style="dim")
    rich_tree = Tree(label)
    build(rich_tree, doc)
    _console().print(rich_tree)


def _node_id(text: str) -> int:
    """``root``, or a node id as typed or as every view prints it (``6`` or ``#6``)."""
    if text == "root":
        return 0
    try:
        value = int(text.removeprefix("#"))
    except ValueError:
        raise _exit(f"node id must be an integer or 'root', got {text!r}", EXIT_USAGE) from None
    if value < 0:
        raise _exit(f"node id must be >= 0, got {value}", EXIT_USAGE)
    return value


def _subtree(t: Any, node_id: int, depth: int, limit: int, min_bytes: int, order: str) -> dict:
    """The subtree as one read (one moment of the cache), nested as the printer walks it."""
    view = t.subtree(node_id, depth, limit, order, min_bytes)
    stack: list[dict] = []
    top: dict | None = None
    for row in view.rows:
        doc = {"node": row.node, "children": [], "more": row.more}
        del stack[row.level:]
        if stack:
            stack[-1]["children"].append(doc)
        else:
            top = doc
        stack.append(doc)
    assert top is not None
    return top


def _session_tree(t: Any, session_id: str, attempts: int = 5) -> dict:
    """Only the chains from the root to the nodes ``session_id`` holds. Read node by node: where
    one went away meanwhile (a live cache), the whole read starts again."""
    from radixtop.adapters.errors import UnknownNode

    for attempt in range(attempts):
        try:
            return _session_tree_once(t, session_id)
        except UnknownNode:
            if attempt == attempts - 1:
                raise _exit(f"the tree of session {session_id!r} kept changing under {attempts} reads; "
                            "try again", EXIT_REFUSED) from None
    raise AssertionError("unreachable")


def _session_tree_once(t: Any, session_id: str) -> dict:
    detail = t.session(session_id)
    nodes: dict[int, Any] = {}
    children: dict[int, set[int]] = {}
    for node_id in detail.node_ids:
        current = node_id
        while current is not None and current not in nodes:
            view = t.node(current, token_limit=1).node
            nodes[current] = view
            if view.parent_id is not None:
                children.setdefault(view.parent_id, set()).add(current)
            current = view.parent_id

    def walk(node_id: int) -> dict:
        kids = sorted(children.get(node_id, ()), key=lambda i: -nodes[i].subtree_bytes)
        return {"node": nodes[node_id], "children": [walk(k) for k in kids], "more": 0}

    if 0 not in nodes:
        nodes[0] = t.node(0, token_limit=1).node
    return walk(0)


def _tree_json(d: dict) -> dict:
    return {"node": d["node"].to_dict(), "more": d["more"], "children": [_tree_json(c) for c in d["children"]]}


@app.command()
def node(
    node_id: Annotated[str, typer.Argument(help="A node id, or root.")],
    token_offset: Annotated[int, typer.Option(min=0)] = 0,
    token_limit: Annotated[int, typer.Option(min=1, max=10_000)] = 64,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """One node in full: tokens, locks, holders, sizes, ages."""
    with target(url, token, timeout) as t:
        d = t.node(_node_id(node_id), token_offset, token_limit)
    if as_json:
        return emit_json(d.to_dict())
    n = d.node
    from rich.table import Table

    table = Table(show_header=False, box=None, title=f"node #{n.id}")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("parent", "-" if n.parent_id is None else f"#{n.parent_id}"), ("depth", str(n.depth)),
        ("tokens", f"{n.tokens:,} ({human_bytes(n.bytes)})"),
        ("subtree", f"{n.subtree_tokens:,} tokens ({human_bytes(n.subtree_bytes)})"),
        ("path from root", f"{d.path_tokens:,} tokens"), ("children", str(n.num_children)),
        ("lock_ref", known(n.lock_ref)), ("hit_count", known(n.hit_count)),
        ("last access", f"{age(n.access_age_s)} ago"), ("created", f"{age(n.created_age_s)} ago"),
        ("holders", "unknown" if n.holders is None else ", ".join(map(inert, n.holders)) or "-"),
        ("sessions beneath", known(d.sessions_beneath)),
        (f"token ids [{d.token_offset}:{d.token_offset + len(d.token_ids)}]", " ".join(map(str, d.token_ids))),
    ]
    if n.tiers is not None:  # a target with storage tiers (SGLang): where this node's KV is
        rows.insert(-1, ("tiers", inert(" + ".join(n.tiers)) or "-"))
    if n.text is not None:
        rows.append(("text", inert(n.text, lines=True)))
    for k, v in rows:
        table.add_row(k, v)
    _console().print(table)


def _sessions_table(views: list[Any], title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in ("session", "state", "tagged", "exclusive", "shared", "fair share", "locked tok", "last activity"):
        table.add_column(col, justify="left" if col in ("session", "state") else "right")
    for s in views:
        table.add_row(inert(s.id), s.state, str(s.tagged_nodes), human_bytes(s.exclusive_bytes),
                      human_bytes(s.shared_bytes), human_bytes(s.fair_share_bytes), f"{s.locked_tokens:,}",
                      age(s.last_activity_age_s))
    return table


@app.command()
def sessions(
    sort: Annotated[str, typer.Option(help="exclusive_bytes, shared_bytes, fair_share_bytes, locked_tokens, "
                                      "tagged_nodes, last_activity, state or id (biggest, newest, open first; "
                                      "ids A to Z).")] = "exclusive_bytes",
    reverse: Annotated[bool, typer.Option("--reverse", help="The other way round.")] = False,
    contains: Annotated[str, typer.Option("--filter", help="Only sessions whose id contains this (any case), "
                                          "or whose state it names (open, closed).")] = "",
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 20,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Sessions and the memory they hold: exclusive (a close frees it now), shared, fair share;
    sorted and filtered over all the target's sessions."""
    with target(url, token, timeout) as t:
        page = t.sessions(sort, offset, limit, contains, reverse)
    if as_json:
        return emit_json(page.to_dict())
    shown = f"{offset + 1}-{offset + len(page.sessions)}" if page.sessions else "none"
    matching = f" matching {inert(repr(page.contains))}" if page.contains else ""
    everyone = (f" ({page.all_sessions:,} in all)" if page.contains and page.all_sessions is not None else "")
    title = (f"sessions {shown} of {page.total:,}{matching}{everyone} by {sort}{' reversed' if reverse else ''}, "
             f"{figures_note(page.figures_age_s, page.refreshing, page.figures_current)}")
    _console().print(_sessions_table(list(page.sessions), title))


@app.command()
def session(
    session_id: Annotated[str, typer.Argument()],
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """One session: its memory and the nodes it holds."""
    with target(url, token, timeout) as t:
        d = t.session(session_id)
    if as_json:
        return emit_json(d.to_dict())
    console = _console()
    console.print(_sessions_table([d.session], f"session {inert(session_id)}"))
    console.print(f"holds nodes: {', '.join(f'#{i}' for i in d.node_ids) or '-'}")


@app.command()
def match(
    tokens: Annotated[list[str], typer.Argument(help="Token ids, space- or comma-separated.")],
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """The longest cached prefix of a token sequence (read-only: nothing split, nothing touched)."""
    ids = _parse_tokens(tokens)
    with target(url, token, timeout) as t:
        m = t.match(ids)
    if as_json:
        return emit_json(m.to_dict())
    where = f"node #{m.node_id}"
    if m.partial_node_id is not None:
        where += f", then {m.partial_tokens} tokens into node #{m.partial_node_id}"
    typer.echo(f"{m.matched_tokens} of {m.query_tokens} tokens cached ({human_bytes(m.matched_bytes)}); "
               f"match ends at {where}")


def _parse_tokens(parts: list[str]) -> list[int]:
    ids = []
    for part in parts:
        for piece in part.replace(",", " ").split():
            try:
                value = int(piece)
            except ValueError:
                raise _exit(f"token ids must be integers, got {piece!r}", EXIT_USAGE) from None
            if value < 0:
                raise _exit(f"token ids must be >= 0, got {value}", EXIT_USAGE)
            ids.append(value)
    return ids


@app.command()
def export(
    output: Annotated[str, typer.Option("--output", "-o", help="File (default: stdout).")] = "-",
    fmt: Annotated[str, typer.Option("--format", help="ndjson (a line per node) or columns (int64 columns, "
                                     "compact; needs --output).")] = "ndjson",
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 60.0,
) -> None:
    """The whole tree, streamed: JSON lines (a header, then a row per node, parents first), or
    the compact columnar form."""
    if fmt not in ("ndjson", "columns"):
        raise _exit(f"--format must be ndjson or columns, got {fmt!r}", EXIT_USAGE)
    if fmt == "columns" and output == "-":
        raise _exit("--format columns is binary: give --output FILE", EXIT_USAGE)
    try:
        sink = sys.stdout if output == "-" else open(output, "w" if fmt == "ndjson" else "wb")
    except OSError as exc:
        raise _exit(f"cannot write {output}: {exc.strerror or exc}", EXIT_USAGE) from None
    try:
        with target(url, token, timeout) as t:
            if fmt == "columns":
                from radixtop.adapters.http.wire import encode_export_columns

                for chunk in encode_export_columns(t.export_columns()):
                    sink.write(chunk)
            else:
                for row in t.export():
                    sink.write(json.dumps(row, separators=(",", ":"), default=list) + "\n")
    finally:
        if sink is not sys.stdout:
            sink.close()
        else:
            sink.flush()


@app.command()
def audit(
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """The audit journal, newest first: every action, allowed or refused."""
    with target(url, token, timeout) as t:
        entries = t.audit(limit, offset)
    if as_json:
        return emit_json([e.to_dict() for e in entries])
    from datetime import datetime

    from rich.table import Table
    from rich.text import Text

    table = Table(title="audit (newest first)")
    for col in ("time", "client", "action", "target", "allowed", "outcome"):
        table.add_column(col)
    for e in entries:
        outcome = inert(e.error) if e.error else _audit_outcome(e)
        table.add_row(datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S"), inert(e.client), inert(e.action),
                      inert(e.target), "yes" if e.allowed else Text("no", style="red"), outcome)
    _console().print(table)


def _audit_outcome(e: Any) -> str:
    """One short phrase for what an audited action did (the JSON has it all)."""
    r, plan = e.result or {}, e.plan or {}
    if "freed_tokens" in r and e.action == "close":
        return "already closed, freed 0" if r.get("already_closed") else f"freed {r['freed_tokens']:,} tok"
    if "evicted_tokens" in r:
        return f"evicted {r['evicted_tokens']:,} tok"
    if e.action == "flush" and "freed_tokens" in r:
        return f"flushed {r['freed_tokens']:,} tok"
    if "freed_tokens" in plan:
        return f"plan: frees {plan['freed_tokens']:,} tok"
    return ""


# ----- actions: plan, preview, confirm, execute -----


def _confirm(question: str, yes: bool, typed: str | None = None) -> None:
    """Ask before an action: y/N, or for a large or bulk one (``typed``, the dashboard's rule:
    ``units.typed_confirmation``) the value typed back."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise _exit("confirmation needed and stdin is not a terminal; pass --yes", EXIT_REFUSED)
    if typed is None:
        if not typer.confirm(question, default=False):
            raise _exit("cancelled; nothing was changed", EXIT_REFUSED)
        return
    answer = typer.prompt(f"{question} Type {typed} to confirm", default="", show_default=False)
    if answer.strip() != typed:
        raise _exit("cancelled; nothing was changed", EXIT_REFUSED)


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
    with target(url, token, timeout) as t:
        plans, unknown = [], []
        for sid in ids:
            try:
                plans.append(t.plan_close(sid))
            except UnknownSession:
                unknown.append(sid)
            except Unsupported as exc:
                if dry_run:
                    raise
                return _close_blind(t, ids, exc.message, yes, as_json)
        if not as_json or dry_run:
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
        table.add_row(inert(p.session_id), p.state, str(len(p.freed_node_ids)), f"{p.freed_tokens:,}",
                      human_bytes(p.freed_bytes), str(p.released_holds),
                      ", ".join(f"{v} tok {r}" for r, v in kept.items()) or "-")
    _console().print(table)


@app.command()
def evict(
    tokens: Annotated[int, typer.Argument(min=0, help="Tokens to evict (whole least-recently-used leaves).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would evict; change nothing.")] = False,
    yes: Yes = False,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Evict at least N tokens of unlocked leaves, least recently used first (10% of the
    capacity or more: type the count to confirm, as in the dashboard)."""
    with target(url, token, timeout) as t:
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
    typer.echo(f"evicted {r.evicted_tokens:,} tokens ({human_bytes(r.evicted_bytes)}) in {r.evicted_nodes} nodes")


@app.command()
def flush(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would free; change nothing.")] = False,
    yes: Yes = False,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Free everything that no running request locks (type 'flush' to confirm, as in the dashboard)."""
    with target(url, token, timeout) as t:
        st = t.stats()
        if dry_run:
            doc = {"dry_run": True, "would_free_tokens": st.evictable_tokens, "would_free_bytes": st.evictable_bytes}
            if as_json:
                return emit_json(doc)
            typer.echo(f"would free {st.evictable_tokens:,} evictable tokens ({human_bytes(st.evictable_bytes)}); "
                       f"{st.unevictable_tokens:,} unevictable (locked, held or running) stay; nothing changed")
            return
        _confirm(f"Flush {st.evictable_tokens:,} evictable tokens ({human_bytes(st.evictable_bytes)})?", yes,
                 typed_confirmation("flush"))
        r = t.flush()
    if as_json:
        return emit_json(r.to_dict())
    extra = f"; {inert(r.message)}" if r.message else ""
    typer.echo(f"flushed {r.freed_tokens:,} tokens ({human_bytes(r.freed_bytes)}) in {r.freed_nodes} nodes{extra}")
