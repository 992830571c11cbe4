"""Text for people, shared by every face: sizes and ages, confirmations, notes on figures, token
previews, hostile text made inert, a diagnosis as lines (JSON keeps the plain values)."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixtop.adapters.model import POOL_STATES

if TYPE_CHECKING:
    from radixtop.adapters.model import Bucket, Diagnosis, Stats


def human_bytes(n: int | float) -> str:
    """1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def age(seconds: float | None) -> str:
    """Seconds as a short age: 42s, 5m, 2.5h."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def known(value: int | None) -> str:
    """A figure the target may not know: "unknown", never a 0."""
    return "unknown" if value is None else str(value)


def in_nodes(n: int | None) -> str:
    """Where an action's tokens were: 'in 3 nodes', or 'nodes unknown (the target cannot count
    them)': never 'in 0 nodes' for unknown."""
    return "nodes unknown (the target cannot count them)" if n is None else f"in {n:,} node{'s' * (n != 1)}"


def count(n: int | None, what: str) -> str:
    """'1,234 nodes', or 'nodes unknown' where the target cannot tell (never a 0 for unknown)."""
    return f"{what} unknown" if n is None else f"{n:,} {what}"


def bucket_line(b: Bucket) -> str:
    """One component's buckets as SGLang's leak check writes them (``[full] total=…, available=…``:
    what an operator greps the server's log for), then whether they add up."""
    uncached = "unknown" if b.uncached is None else str(b.uncached)
    line = (f"[{inert(b.component)}] total={b.total}, available={b.available}, evictable={b.evictable}, "
            f"protected={b.protected}, session_held={b.session_held}, uncached={uncached}")
    missing = b.unaccounted
    if missing is None:
        return line + " · sum unknown"
    if missing == 0:
        return line + " · adds up"
    if missing > 0:
        return line + f" · {missing} tokens unaccounted: SGLang's leak check fails"
    return line + f" · {-missing} tokens counted twice: SGLang's leak check fails"


LARGE_SHARE = 0.10
"""An evict of this share of the capacity or more is large: every face makes the operator type
the amount (as for a flush, typed 'flush', and a close of several sessions, typed their count)."""


def typed_confirmation(action: str, tokens: int = 0, capacity: int = 0, sessions: int = 1) -> str | None:
    """What the operator must type to confirm an action, or None where yes/no is enough: the
    same rule in the dashboard and the commands."""
    if action == "flush":
        return "flush"
    if action == "evict":
        return str(tokens) if capacity and tokens >= LARGE_SHARE * capacity else None
    if action == "close":
        return str(sessions) if sessions > 1 else None
    raise ValueError(f"unknown action {action!r}")


def figures_note(age_s: float, refreshing: bool, current: bool = False) -> str:
    """How old a sessions page's figures are, always (an operator ranks and acts on them): 'figures
    3s old', 'figures 3m old, refreshing'; 'unchanged since 18m ago' where the cache has not
    changed since they were made (exact now, however old); 'figures current' where they are as of
    the read (a target that keeps them with the tree)."""
    if current:
        return f"unchanged since {age(age_s)} ago" if age_s >= 1.0 else "figures current"
    return f"figures {age(age_s)} old" + (", refreshing" if refreshing else "")


TEXT_TOKENS = 256
"""A node's detail decodes at most this many of its page's ids (on the owner thread: bounded)."""


def load_tokenizer(path: str, **options: Any) -> Any:
    """A Hugging Face tokenizer from local files only (``options``: ``from_pretrained``'s, e.g.
    ``trust_remote_code``, ``revision``). ModuleNotFoundError without transformers; ValueError,
    one line, where it cannot load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, **options)
    except Exception as exc:  # (OSError, ValueError, ... : transformers raises many kinds)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot load the tokenizer {path!r} (from local files only): {first[:200]}") from None


def decode_preview(tokenizer, tokens: tuple[int, ...]) -> str | None:
    """A node's token preview as text, or None (no tokenizer, nothing to decode, or ids it
    cannot decode: the faces then show the ids)."""
    if tokenizer is None or not tokens:
        return None
    try:
        return tokenizer.decode(list(tokens))
    except Exception:  # a tokenizer that cannot decode these ids shows ids instead
        return None


# What a target's string may not bring to the screen: terminal control codes (C0 but the line
# feed, DEL, C1: Unicode's Cc), format characters that hide, join or reorder text (Cf: zero-width
# ones, bidi overrides and isolates, the word joiner, the Arabic letter mark, tag characters, the
# soft hyphen), line and paragraph separators (Zl, Zp: a line break the tables do not count),
# lone surrogates (Cs: they cannot even be printed), and the letters drawn as blanks (the Hangul
# fillers). A string holding them could clear the operator's screen, retitle the terminal,
# disguise an id or push a table's columns out of line.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_BLANK_LETTERS = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0})
_CACHED = 1 << 16
"""Code points whose verdict a table keeps (a string of every code point must not grow it to 1M)."""


class _InertTable(dict):
    """``str.translate``'s table: each code point's verdict, decided by its Unicode category at
    first sight ('?' for a hidden one, the character itself otherwise)."""

    def __init__(self, lines: bool) -> None:
        super().__init__()
        self.lines = lines

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if code == 10:
            verdict = char if self.lines else "?"
        elif code in _BLANK_LETTERS or unicodedata.category(char) in _HIDDEN_CATEGORIES:
            verdict = "?"
        else:
            verdict = char
        if len(self) < _CACHED:
            self[code] = verdict
        return verdict


_INERT = _InertTable(lines=True)
_INERT_LINE = _InertTable(lines=False)


def inert(text: str, lines: bool = False) -> str:
    """Text from a target (ids, names, holders, states, reasons, decoded tokens, its errors) with
    every hidden character (above) replaced by '?'; line breaks kept only where ``lines``. Every
    face shows it so, as plain text, never as markup: the one rule for a target's strings."""
    if text.isascii() and text.isprintable():  # the common case, at C speed
        return text
    return text.translate(_INERT if lines else _INERT_LINE)


def one_line(text: str) -> str:
    """A target's text on one line, as every face shows a preview: line breaks as ⏎ (so they stay
    apart from the '?' of a control code), the rest through ``inert``."""
    return inert(text.replace("\n", "⏎"))


def diagnosis_text(d: Diagnosis) -> str:
    """The diagnosis as plain text (the command's output, the dashboard's panel). The target's
    strings in it (ids, names) are as sent: a face shows them through ``inert``."""
    lines = [f"radixtop doctor · {d.target} · checked {', '.join(d.checked) or 'nothing'}"
             + (f" · {d.nodes_walked:,} nodes walked" if d.nodes_walked is not None else "")]
    kinds_for: dict[str, list[str]] = {}  # one line per reason (a vLLM skips five checks for one)
    for kind, why in d.skipped.items():
        kinds_for.setdefault(why, []).append(kind)
    lines.extend(f"  not checked: {', '.join(kinds)}: {why}" for why, kinds in kinds_for.items())
    lines.extend(f"  read: {note}" for note in d.notes)
    if d.healthy:
        lines.append("healthy: nothing found")
        return "\n".join(lines)
    lines.append(f"{len(d.findings)} finding(s):")
    for f in d.findings:
        lines.append("")
        lines.append(f"[{f.kind}] {f.summary}")
        lines.append(f"  means: {f.meaning}")
        lines.append(f"  fix:   {f.action}")
        if f.figures:
            lines.append("  figures: " + ", ".join(f"{k}={v}" for k, v in f.figures.items()))
    return "\n".join(lines)


HELD_OR_RUNNING = "session_held+uncached"
"""The part a target that knows its locked nodes but not the rest shows (unevictable less protected)."""


def pool_parts(st: Stats) -> tuple[tuple[str, int | None], ...]:
    """The pool in SGLang's leak-check words and order, adding up to capacity: available,
    evictable, protected, session_held, uncached (each None where the target cannot tell). Where
    the target cannot tell the last three apart, their sum as ``unevictable``; where it knows
    only ``protected`` of them, the rest as ``session_held+uncached``. The set of parts depends on
    the target only, never on the figures, so a legend keeps its layout."""
    if st.protected_tokens is None and st.session_held_tokens is None and st.uncached_tokens is None:
        return (("available", st.available_tokens), ("evictable", st.evictable_tokens),
                ("unevictable", st.unevictable_tokens))
    if st.session_held_tokens is None or st.uncached_tokens is None:
        rest = (None if st.unevictable_tokens is None or st.protected_tokens is None
                else st.unevictable_tokens - st.protected_tokens)
        return (("available", st.available_tokens), ("evictable", st.evictable_tokens),
                ("protected", st.protected_tokens), (HELD_OR_RUNNING, rest))
    return tuple((state, st.tokens_of(state)) for state in POOL_STATES)


def when(at: float, now: float) -> str:
    """A moment as the local time of day and how long ago: '14:03:27 (5m ago)'."""
    import time as _time

    return f"{_time.strftime('%H:%M:%S', _time.localtime(at))} ({age(max(0.0, now - at))} ago)"


def lost_line(lost: Any, now: float, end: int | None = None, nodes: int = 1, unit: str = "node") -> str:
    """One ``LostView`` as a line: which tokens, and when and why they left (``end``, ``nodes``:
    the run it starts, of that many nodes gone the same way)."""
    end = lost.end if end is None else end
    span = f"tokens {lost.start:,}-{end:,} ({end - lost.start:,})"
    why = _left(lost, when(lost.at, now))
    held = f"; held by {', '.join(map(inert, lost.holders[:3]))}{'…' if len(lost.holders) > 3 else ''}" \
        if lost.holders else ""
    return f"{span}: {_what(lost.node_id, nodes, unit)}, {why}{held}"


def _what(node_id: int, nodes: int, unit: str) -> str:
    """What left, in a line: a node by its id, or a block by its hash (a KV-event stream's)."""
    if unit == "block":
        return f"block {node_id:#x}" if nodes == 1 else f"{nodes} blocks from {node_id:#x}"
    return f"node #{node_id}" if nodes == 1 else f"{nodes} nodes from #{node_id}"


def _left(gone: Any, moment: str) -> str:
    """Why and when something left the tree (a ``LostView``'s or ``LossView``'s cause and its
    detail), as words."""
    if gone.cause == "closed":
        return f"freed by the close of session {inert(gone.session_id or '?')} at {moment}"
    if gone.cause == "flushed":
        return f"flushed at {moment}"
    if gone.cause == "evict_action":
        return f"evicted on request ({inert(gone.who) or 'an evict'}) at {moment}"
    if gone.cause == "unknown":
        return f"left at {moment} (the target does not say why: an eviction for room or a session's close)"
    pool = (f", the pool {gone.protected_tokens / gone.capacity_tokens:.0%} locked by running requests"
            if gone.protected_tokens is not None and gone.capacity_tokens else "")
    return f"evicted for room at {moment}{pool}"


def node_left(n: Any, now: float) -> str:
    """A node of the tree at a past moment that left since (``NodeView.left_at``), as words: why
    and when; '' for a node still in the tree."""
    if n.left_at is None:
        return ""
    gone = _Gone(n.left_cause, n.left_by, n.left_by)
    return _left(gone, when(n.left_at, now))


@dataclass(frozen=True)
class _Gone:
    """A node's leaving as ``_left`` reads it (no pool told)."""

    cause: str | None
    session_id: str | None
    who: str | None
    protected_tokens: None = None
    capacity_tokens: None = None


CAUSE_WORDS = {"evicted": "evicted for room", "closed": "freed by closes", "flushed": "flushed",
               "evict_action": "evicted on request", "unknown": "left, why not told"}
SESSION_LOSSES_SHOWN = 10
"""A session's latest losses its text shows (``--json`` has up to ``MAX_LOSSES_SHOWN``)."""
HITS_SHOWN = 12


def session_why_lines(v: Any, now: float) -> list[str]:
    """A ``SessionWhyView`` as lines: its requests' hits over time, what it lost, when and why."""
    sid = inert(v.session_id)
    if v.requests is None:
        lines = [f"session {sid}: its requests' hits are not known here (the target does not tell them)"]
    elif not v.requests_kept:
        lines = [f"session {sid}: no request since {when(v.requests_since, now)}"]
    else:
        share = f" ({v.cached_tokens / v.prompt_tokens:.0%})" if v.prompt_tokens else ""
        lines = [f"session {sid}: {v.requests_kept:,} {'request' if v.requests_kept == 1 else 'requests'} "
                 f"since {when(v.requests_since, now)}; {v.cached_tokens:,} of {v.prompt_tokens:,} prompt "
                 f"tokens cached{share}"]
        last = v.requests[-HITS_SHOWN:]
        hits = "  ".join(f"{age(max(0.0, now - r.at))} ago {r.cached_tokens:,}/{r.prompt_tokens:,}" for r in last)
        lines.append(f"  latest hits (cached/prompt tokens), oldest first: {hits}")
    since = when(v.history_since, now)
    if not v.lost_tokens:
        lines.append(f"nothing it held left the tree since {since}")
        return lines
    by_cause = ", ".join(f"{tokens:,} tokens {CAUSE_WORDS[cause]}" for cause, tokens in
                         sorted(v.lost_tokens.items(), key=lambda item: -item[1]))
    lines.append(f"lost since {since}: {by_cause}")
    shown = v.lost[-SESSION_LOSSES_SHOWN:]
    if len(v.lost) > len(shown):
        lines.append(f"  ({len(v.lost) - len(shown):,} earlier losses not shown: --json)")
    for loss in shown:
        what = _what(loss.node_id, loss.nodes, v.lost_unit)
        lines.append(f"  {loss.tokens:,} {'token' if loss.tokens == 1 else 'tokens'} ({what}), "
                     f"{_left(loss, when(loss.at, now))}")
    return lines


BRANCHES_SHOWN = 8
"""Branches of each side (left since, stored since) ``then_lines`` shows (``--json`` has up to
``MAX_BRANCHES_SHOWN``)."""


def then_lines(v: Any, now: float, shown: int = BRANCHES_SHOWN, sessions_shown: int | None = None) -> list[str]:
    """A ``ThenView`` as lines: the tree's tokens then and now, what left since (by cause, its
    largest branches), what was stored since, and the sessions then (``sessions_shown`` of them,
    ``shown`` where not given)."""
    lines = [f"the tree at {when(v.at, now)}: {v.tokens_then:,} tokens cached (now {v.tokens_now:,})"]
    if not v.left_tokens and not v.stored_tokens:
        lines.append("nothing stored or left since: the tree then is the tree now")
        return lines + _sessions_then(v, now, shown if sessions_shown is None else sessions_shown)
    unit = "block" if v.unit == "block" else "node"
    if v.left_tokens:
        by_cause = ", ".join(f"{tokens:,} {CAUSE_WORDS[cause]}" for cause, tokens in
                             sorted(v.left_by_cause.items(), key=lambda item: -item[1]))
        lines.append(f"left since: {v.left_tokens:,} tokens in {v.left_nodes:,} {unit}s ({by_cause})")
        for b in v.left[:shown]:
            causes = ", ".join(CAUSE_WORDS[c] for c, _ in sorted(b.causes.items(), key=lambda item: -item[1]))
            moment = when(b.first_at, now) if b.last_at - b.first_at < 1.0 else \
                f"{when(b.first_at, now)} to {when(b.last_at, now)}"
            held = f"; held by {', '.join(map(inert, b.holders[:3]))}{'…' if len(b.holders) > 3 else ''}" \
                if b.holders else ""
            lines.append(f"  {b.tokens:,} tokens ({_what(b.node_id, b.nodes, v.unit)}{_below(b, v.unit)}), "
                         f"{causes} at {moment}{held}")
        if v.left_branches > min(shown, len(v.left)):
            lines.append(f"  ... {v.left_branches - min(shown, len(v.left)):,} more branches (--json)")
    if v.stored_tokens:
        lines.append(f"stored since: {v.stored_tokens:,} tokens in {v.stored_nodes:,} {unit}s")
        for b in v.stored[:shown]:
            moment = when(b.first_at, now) if b.last_at - b.first_at < 1.0 else \
                f"{when(b.first_at, now)} to {when(b.last_at, now)}"
            lines.append(f"  {b.tokens:,} tokens ({_what(b.node_id, b.nodes, v.unit)}{_below(b, v.unit)}), "
                         f"stored at {moment}")
        if v.stored_branches > min(shown, len(v.stored)):
            lines.append(f"  ... {v.stored_branches - min(shown, len(v.stored)):,} more branches (--json)")
    lines.extend(_sessions_then(v, now, shown if sessions_shown is None else sessions_shown))
    return lines


def _sessions_then(v: Any, now: float, shown: int) -> list[str]:
    return memory_then_lines(v, now, shown) + sessions_then_lines(v, now, shown)


def memory_then_lines(v: Any, now: float, shown: int = BRANCHES_SHOWN) -> list[str]:
    """The sessions' memory of a ``ThenView`` (what each held then, and now), the most exclusive
    first; a line saying why where it is not known."""
    if v.memory is None:
        if v.memory_since is None:
            return ["sessions' memory then: not known here (the target keeps no sessions' figures)"]
        return [f"sessions' memory then: not known (the sessions' figures are kept since {when(v.memory_since, now)})"]
    if not v.memory:
        return ["sessions' memory then: no session held any"]
    lines = [f"sessions' memory then: {v.memory_sessions:,} held some; the most exclusive (then -> now):"]
    for x in v.memory[:shown]:
        same = (x.tagged_nodes, x.exclusive_tokens, x.shared_tokens) == (
            x.tagged_nodes_now, x.exclusive_tokens_now, x.shared_tokens_now)

        def now(text: str) -> str:
            return "" if same else f" -> {text}"

        lines.append(f"  {inert(x.session_id)}: exclusive {_sized(x.exclusive_tokens, v)}"
                     f"{now(_sized(x.exclusive_tokens_now, v))}, shared {_sized(x.shared_tokens, v)}"
                     f"{now(_sized(x.shared_tokens_now, v))}, {x.tagged_nodes:,} tagged node"
                     f"{'s' * (x.tagged_nodes != 1)}{now(f'{x.tagged_nodes_now:,}')}{' (the same now)' * same}")
    if v.memory_sessions > min(shown, len(v.memory)):
        lines.append(f"  ... {v.memory_sessions - min(shown, len(v.memory)):,} more (--json)")
    return lines


def _sized(tokens: int, v: Any) -> str:
    return f"{tokens:,} tok ({human_bytes(tokens * v.bytes_per_token)})" if v.bytes_per_token and tokens else f"{tokens:,} tok"


def sessions_then_lines(v: Any, now: float, shown: int = BRANCHES_SHOWN) -> list[str]:
    """The sessions of a ``ThenView`` as lines (none where the target does not tell its requests)."""
    if v.sessions is None:
        return []
    if not v.sessions:
        return [f"sessions then: none active since {when(v.sessions_since, now)}"]
    lines = [f"sessions then: {v.sessions_active:,} active since {when(v.sessions_since, now)} "
             f"({v.sessions_open:,} open); the most recently active:"]
    for x in v.sessions[:shown]:
        hits = f"{x.cached_tokens:,} of {x.prompt_tokens:,} prompt tokens cached" + (
            f" ({x.cached_tokens / x.prompt_tokens:.0%})" if x.prompt_tokens else "")
        last = f"; its last {x.last_cached_tokens:,}/{x.last_prompt_tokens:,}" if x.requests else ""
        lost = f"; {x.lost_since_tokens:,} tokens it held left since" if x.lost_since_tokens else ""
        lines.append(f"  {inert(x.session_id)} ({x.state}, last active {age(max(0.0, v.at - x.last_at))} before): {x.requests:,} request{'s' * (x.requests != 1)}, "
                     f"{hits}{last}{lost}")
    if v.sessions_active > min(shown, len(v.sessions)):
        lines.append(f"  ... {v.sessions_active - min(shown, len(v.sessions)):,} more (--json)")
    return lines


def _below(b: Any, unit: str) -> str:
    if b.parent_id is None:
        return ", below the root"
    return f", below block {b.parent_id:#x}" if unit == "block" else f", below #{b.parent_id}"


def _runs(lost: Any) -> list[tuple[Any, int, int]]:
    """The lost tokens as runs gone the same way (one close, one eviction: the same cause, session
    and asker, each node next to the one before, within a second): ``(first, end, nodes)``."""
    runs: list[tuple[Any, int, int]] = []
    for one in lost:
        if runs:
            first, end, nodes = runs[-1]
            if end == one.start and (one.cause, one.session_id, one.who, one.holders) == \
                    (first.cause, first.session_id, first.who, first.holders) and abs(one.at - first.at) < 1.0:
                runs[-1] = (first, one.end, nodes + 1)
                continue
        runs.append((one, one.end, 1))
    return runs


def why_lines(w: Any, now: float) -> list[str]:
    """A ``WhyView`` as lines: what is cached, where the prompt leaves the cached path, what of the
    rest was cached before and why it left."""
    where = f"node #{w.node_id}"
    if w.partial_node_id is not None:
        where += f", {w.partial_tokens:,} tokens into node #{w.partial_node_id}"
    lines = [f"{w.cached_tokens:,} of {w.query_tokens:,} tokens cached"]
    if w.cached_tokens >= w.query_tokens:
        return lines
    lines[0] += f"; the prompt leaves the cached path at token {w.diverges_at:,} ({where})"
    lines.extend(lost_line(first, now, end, nodes, w.lost_unit) for first, end, nodes in _runs(w.lost))
    since = when(w.history_since, now)
    rest = w.query_tokens - w.cached_tokens - sum(lost.end - lost.start for lost in w.lost)
    if not w.lost:
        lines.append(f"none of the rest was cached since {since}; every removal since then is kept")
    elif rest:
        lines.append(f"{rest:,} {'token' if rest == 1 else 'tokens'} of the rest "
                     f"{'was' if rest == 1 else 'were'} not cached since {since}")
    return lines
