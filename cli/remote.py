"""Reads of a radixtop server over its admin API: stats, tree, node, sessions, session, match, why, export, audit."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from radixtop.adapters.model import MAX_PATHS, ROOT_ID
from radixtop.adapters.text import (
    age,
    bucket_line,
    count,
    figures_note,
    human_bytes,
    inert,
    known,
    one_line,
    pool_parts,
)
from radixtop.cli.errors import EXIT_USAGE, fail
from radixtop.cli.options import DEFAULT_URL, Json, Timeout, Token, Url
from radixtop.cli.render import emit_json, plain_console
from radixtop.cli.targets import remote_target

app = typer.Typer()


@app.command()
def stats(url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False) -> None:
    """Cache totals in SGLang's words (available, evictable, protected, session_held, uncached), sessions, counters."""
    with remote_target(url, token, timeout) as t:
        st = t.stats()
    if as_json:
        return emit_json(st.to_dict())
    from rich.table import Table

    model = "" if st.geometry.name in st.target else f" · {inert(st.geometry.name)}"  # a target's name may say it
    table = Table(title=f"{inert(st.target)}{model} · {human_bytes(st.bytes_per_token)}/token",
                  show_header=True)
    for col in ("", "tokens", "bytes", "share"):
        table.add_column(col, justify="right" if col else "left")
    for name, tokens in (*pool_parts(st), ("capacity", st.capacity_tokens)):
        if tokens is None:  # the target cannot tell: said, never 0
            table.add_row(name, "unknown", "unknown", "-")
            continue
        share = f"{tokens / st.capacity_tokens:.1%}" if st.capacity_tokens else "-"
        table.add_row(name, f"{tokens:,}", human_bytes(tokens * st.bytes_per_token), share)
    console = plain_console()
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

    preview = one_line(n.text) if n.text is not None else " ".join(map(str, n.first_tokens[:8]))
    if n.text is None and n.tokens > 8:
        preview += " …"
    holders = (f" held by {', '.join(map(inert, n.holders[:3]))}{'…' if len(n.holders) > 3 else ''}"
               if n.holders else "")  # None (unknown) is said once, above the tree
    lock = f" lock_ref={n.lock_ref}" if n.lock_ref else ""
    label = Text.assemble((f"#{n.id}", "bold"), f" {n.tokens} tok · {human_bytes(n.bytes)} · subtree "
                          f"{human_bytes(n.subtree_bytes)}{lock}{holders} · ", (preview, "dim"))
    if n.left_at is not None:  # (the tree at a past moment: a node that left since)
        import time

        from radixtop.adapters.text import node_left

        label.append(f" · left: {node_left(n, time.time())}", style="yellow")
    return label


def _print_tree(label: Any, doc: dict) -> None:
    """``doc`` (a node's children, nested: ``{"children": [{"node", "children", "more"}...], "more"}``)
    as a tree below ``label``."""
    from rich.text import Text
    from rich.tree import Tree

    def build(parent: Tree, d: dict) -> None:
        for child in d["children"]:
            build(parent.add(_node_label(child["node"])), child)
        if d.get("more"):
            parent.add(Text(f"… {d['more']} more", style="dim"))

    rich_tree = Tree(label)
    build(rich_tree, doc)
    plain_console().print(rich_tree)


@app.command()
def tree(
    node: Annotated[str, typer.Argument(help="Where to start: a node id, or root.")] = "root",
    depth: Annotated[int, typer.Option(min=1, max=64, help="Levels to show.")] = 3,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Children shown per node.")] = 10,
    min_bytes: Annotated[int, typer.Option(min=0, help="Hide subtrees smaller than this.")] = 0,
    order: Annotated[str, typer.Option(help="bytes, recency or tokens.")] = "bytes",
    session: Annotated[str | None, typer.Option(help="Show only the chains this session holds.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="The tree at a past moment (90s, 10m, 2h ago, or 14:03:27 "
                                           "today), from the target's history: what was cached then, the "
                                           "nodes that left since marked with when and why.")] = None,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """The tree as people read it: largest subtrees first, paged."""
    start = _node_id(node)
    if at is not None:
        return _tree_then(start, at, depth, limit, min_bytes, order, session, url, token, timeout, as_json)
    with remote_target(url, token, timeout) as t:
        if session is not None:
            doc = _session_tree(t, session)
        else:
            doc = _subtree(t, start, depth, limit, min_bytes, order)
    if as_json:
        return emit_json(_tree_json(doc))
    from rich.text import Text

    top = doc["node"]
    if top.id == 0:
        label = Text.assemble(("root", "bold"), f" · {human_bytes(top.subtree_bytes)} in the tree")
    else:
        label = _node_label(top)
    shown = doc["children"][0]["node"] if top.id == 0 and doc["children"] else top  # the root has no locks
    unknown = [what for what, gone in (("locks", shown.lock_ref is None), ("holders", shown.holders is None)) if gone]
    if unknown:  # a tree kept from KV events: said once, not as a 0 on every node
        label.append(f" · {' and '.join(unknown)} unknown (this target cannot tell)", style="dim")
    _print_tree(label, doc)


def _tree_then(start: int, moment: str, depth: int, limit: int, min_bytes: int, order: str, session: str | None,
               url: str | None, token: str | None, timeout: float, as_json: bool) -> None:
    """``tree --at``: the tree at a past moment, a page of children a node (``then_children``)."""
    import time

    from rich.text import Text

    from radixtop.adapters.text import when

    if session is not None or order != "bytes":
        raise fail("--at shows the whole tree then, the largest subtree first: without --session or --order",
                   EXIT_USAGE)
    try:
        at = parse_moment(moment, time.time())
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None

    with remote_target(url, token, timeout) as t:
        def walk(node_id: int, level: int) -> dict:
            page = t.then_children(at, node_id, 0, limit)
            kids = [c for c in page.children if c.subtree_bytes >= min_bytes]
            return {"node_id": node_id, "more": page.total - len(kids),
                    "children": [{"node": c, **(walk(c.id, level + 1) if level + 1 < depth and c.num_children
                                                  else {"children": [], "more": c.num_children})} for c in kids]}

        doc = walk(start, 0)
    tokens = sum(c["node"].subtree_tokens for c in doc["children"])
    if as_json:
        return emit_json({"at": at, "node_id": start, "subtree_tokens": tokens, "more": doc["more"],
                          "children": [_tree_json(c) for c in doc["children"]]})
    now = time.time()
    label = Text.assemble(("root" if start == ROOT_ID else f"#{start}", "bold"),
                          f" at {when(at, now)} · {tokens:,} tokens below then"
                          + (f" in the {len(doc['children'])} largest branches shown" if doc["more"] else ""),
                          (" · holders, locks and hits then are not kept: shown for the nodes that left", "dim"))
    _print_tree(label, doc)
    return None


def _node_id(text: str) -> int:
    """``root``, or a node id as typed or as every view prints it (``6`` or ``#6``)."""
    if text == "root":
        return 0
    try:
        value = int(text.removeprefix("#"))
    except ValueError:
        raise fail(f"node id must be an integer or 'root', got {text!r}", EXIT_USAGE) from None
    if value < 0:
        raise fail(f"node id must be >= 0, got {value}", EXIT_USAGE)
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


def _session_tree(t: Any, session_id: str) -> dict:
    """Only the paths from the root to the nodes ``session_id`` holds, read at one moment (one
    ``paths`` read: a live cache cannot change them between two nodes); a node it held that has
    gone since its session was read is simply not on them."""
    detail = t.session(session_id)
    nodes: dict[int, Any] = {}
    for start in range(0, len(detail.node_ids), MAX_PATHS):  # a read per MAX_PATHS nodes it holds
        nodes.update((n.id, n) for n in t.paths(detail.node_ids[start : start + MAX_PATHS]).nodes)
    if ROOT_ID not in nodes:  # it holds nothing (now): the root alone
        nodes[ROOT_ID] = t.node(ROOT_ID, token_limit=1).node
    children: dict[int, list[int]] = {}
    for n in nodes.values():
        if n.parent_id is not None and n.parent_id in nodes:
            children.setdefault(n.parent_id, []).append(n.id)

    def walk(node_id: int) -> dict:
        kids = sorted(children.get(node_id, ()), key=lambda i: -nodes[i].subtree_bytes)
        return {"node": nodes[node_id], "children": [walk(k) for k in kids], "more": 0}

    return walk(ROOT_ID)


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
    with remote_target(url, token, timeout) as t:
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
    if d.group is not None:  # a hybrid model's KV group (vLLM)
        rows.insert(-1, ("group", inert(d.group)))
    if d.lora is not None:  # a LoRA adapter's blocks (vLLM)
        rows.insert(-1, ("lora", inert(d.lora)))
    if n.text is not None:
        rows.append(("text", inert(n.text, lines=True)))
    for k, v in rows:
        table.add_row(k, v)
    plain_console().print(table)


def _sessions_table(views: list[Any], title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in ("session", "state", "tagged", "exclusive", "shared", "fair share", "locked tok", "last activity"):
        table.add_column(col, justify="left" if col in ("session", "state") else "right")
    for s in views:
        table.add_row(inert(s.id), inert(s.state), str(s.tagged_nodes), human_bytes(s.exclusive_bytes),
                      human_bytes(s.shared_bytes), human_bytes(s.fair_share_bytes),
                      "unknown" if s.locked_tokens is None else f"{s.locked_tokens:,}",
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
    with remote_target(url, token, timeout) as t:
        page = t.sessions(sort, offset, limit, contains, reverse)
    if as_json:
        return emit_json(page.to_dict())
    shown = f"{offset + 1}-{offset + len(page.sessions)}" if page.sessions else "none"
    matching = f" matching {inert(repr(page.contains))}" if page.contains else ""
    everyone = (f" ({page.all_sessions:,} in all)" if page.contains and page.all_sessions is not None else "")
    title = (f"sessions {shown} of {page.total:,}{matching}{everyone} by {sort}{' reversed' if reverse else ''}, "
             f"{figures_note(page.figures_age_s, page.refreshing, page.figures_current)}")
    plain_console().print(_sessions_table(list(page.sessions), title))


@app.command()
def session(
    session_id: Annotated[str, typer.Argument()],
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """One session: its memory and the nodes it holds."""
    with remote_target(url, token, timeout) as t:
        d = t.session(session_id)
    if as_json:
        return emit_json(d.to_dict())
    console = plain_console()
    console.print(_sessions_table([d.session], f"session {inert(session_id)}"))
    console.print(f"holds nodes: {', '.join(f'#{i}' for i in d.node_ids) or '-'}")


@app.command()
def match(
    tokens: Annotated[list[str], typer.Argument(help="Token ids, space- or comma-separated.")],
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """The longest cached prefix of a token sequence (read-only: nothing split, nothing touched)."""
    ids = _parse_tokens(tokens)
    with remote_target(url, token, timeout) as t:
        m = t.match(ids)
    if as_json:
        return emit_json(m.to_dict())
    where = f"node #{m.node_id}"
    if m.partial_node_id is not None:
        where += f", then {m.partial_tokens} tokens into node #{m.partial_node_id}"
    typer.echo(f"{m.matched_tokens} of {m.query_tokens} tokens cached ({human_bytes(m.matched_bytes)}); "
               f"match ends at {where}")


@app.command()
def why(
    tokens: Annotated[list[str] | None, typer.Argument(help="The prompt's token ids, space- or comma-separated.")] = None,
    text: Annotated[str | None, typer.Option("--text", help="The prompt as text, tokenized by the target's "
                                             "tokenizer (instead of ids).")] = None,
    session: Annotated[str | None, typer.Option("--session", help="A session's id (instead of a prompt): its "
                                                "requests' hits over time, and what it held that left the tree, "
                                                "when and why.")] = None,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """Why a prompt missed: how much of it is cached now, where it leaves the cached path, and
    what of the rest was cached before, when and why it left (evicted, a session's close, a
    flush, an evict someone asked for). With --session, a session's story instead."""

    from radixtop.adapters.text import session_why_lines, why_lines

    if sum((text is not None, bool(tokens), session is not None)) != 1:
        raise fail("give the prompt's token ids, --text or --session, one of them", EXIT_USAGE)
    if session is not None:
        with remote_target(url, token, timeout) as t:
            return _answer(t.why_session(session), session_why_lines, as_json)
    ids = _parse_tokens(tokens) if tokens else None
    with remote_target(url, token, timeout) as t:
        w = t.why(ids if ids is not None else t.encode(text or ""))
    return _answer(w, why_lines, as_json)


def _answer(view: Any, lines_of: Callable[[Any, float], list[str]], as_json: bool) -> None:
    """A view as JSON, or as its lines (``lines_of(view, now)``)."""
    import time

    if as_json:
        return emit_json(view.to_dict())
    for line in lines_of(view, time.time()):
        typer.echo(line)
    return None


@app.command()
def then(
    moment: Annotated[str | None, typer.Argument(help="How long ago (90s, 10m, 2h) or a time of day today (14:03, "
                                                 "14:03:27; yesterday's where that is still to come); none: as far "
                                                 "back as the target's history reaches.")] = None,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0, as_json: Json = False,
) -> None:
    """The tree at a past moment, told from the tree now: what left since (when, why, whose) and
    what was stored since, the largest branches first."""
    import time

    from radixtop.adapters.text import then_lines

    try:
        at = None if moment is None else parse_moment(moment, time.time())
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    with remote_target(url, token, timeout) as t:
        view = t.then(at)
    return _answer(view, then_lines, as_json)


def parse_moment(text: str, now: float) -> float:
    """``90s``/``10m``/``2h`` ago, or ``HH:MM[:SS]`` today (local; yesterday's where it is still to
    come), as seconds since the epoch; ValueError in one line otherwise."""
    import time

    from radixtop.cli.recording import parse_duration

    raw = text.strip()
    if ":" not in raw:
        try:
            return now - parse_duration(raw)
        except ValueError:
            raise ValueError(f"{text!r} is not a moment (e.g. 90s, 10m, 2h ago, or 14:03:27 today)") from None
    parts = raw.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and len(p) <= 2 for p in parts):
        raise ValueError(f"{text!r} is not a moment (e.g. 90s, 10m, 2h ago, or 14:03:27 today)")
    h, m, sec = (int(p) for p in (parts + ["0"])[:3])
    if not (h < 24 and m < 60 and sec < 60):
        raise ValueError(f"{text!r} is not a moment (e.g. 90s, 10m, 2h ago, or 14:03:27 today)")
    day = time.localtime(now)
    at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, h, m, sec, 0, 0, -1))
    if at > now:  # (yesterday's: the day before on the calendar, whatever its length in hours)
        at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday - 1, h, m, sec, 0, 0, -1))
    return at


def _parse_tokens(parts: list[str]) -> list[int]:
    ids = []
    for part in parts:
        if any(not piece.strip() for piece in part.split(",")):  # '1,,2', '1,2,' and '' hold an empty id
            raise fail(f"empty token id in {part!r}: give ids such as 1,2,3 or 1 2 3", EXIT_USAGE)
        for piece in part.replace(",", " ").split():
            try:
                value = int(piece)
            except ValueError:
                raise fail(f"token ids must be integers, got {piece!r}", EXIT_USAGE) from None
            if value < 0:
                raise fail(f"token ids must be >= 0, got {value}", EXIT_USAGE)
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
        raise fail(f"--format must be ndjson or columns, got {fmt!r}", EXIT_USAGE)
    if fmt == "columns" and output == "-":
        raise fail("--format columns is binary: give --output FILE", EXIT_USAGE)
    try:
        sink = sys.stdout if output == "-" else open(output, "w" if fmt == "ndjson" else "wb")
    except OSError as exc:
        raise fail(f"cannot write {output}: {exc.strerror or exc}", EXIT_USAGE) from None
    try:
        with remote_target(url, token, timeout) as t:
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
    with remote_target(url, token, timeout) as t:
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
    plain_console().print(table)


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
