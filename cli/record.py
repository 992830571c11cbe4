"""`radixtop record` (a target's history written to a file as it happens) and `radixtop diff`
(two moments of recordings compared): issue 29's flight recorder on disk (``cli.recording``)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from radixtop.adapters.text import CAUSE_WORDS, human_bytes, inert
from radixtop.cli.errors import EXIT_USAGE, exit_code, fail
from radixtop.cli.options import DEFAULT_URL, Json, Timeout, Token, Url
from radixtop.cli.render import emit_json, installed_version

app = typer.Typer()

POOL_FIGURES = ("available_tokens", "evictable_tokens", "protected_tokens", "unevictable_tokens")
"""The figures of the pool, whose changes are memory (the others count tokens served or freed)."""


@app.command()
def record(
    file: Annotated[Path, typer.Argument(help="The recording to write (a new file, readable by you only).")],
    for_: Annotated[str, typer.Option("--for", help="How long: 90s, 10m, 2h.")] = "10m",
    every: Annotated[str, typer.Option("--every", help="A moment (the figures and the sessions) this often.")] = "10s",
    max_mb: Annotated[int, typer.Option("--max-mb", min=1, max=1 << 20, help="Stop at this size.")] = 256,
    kept: Annotated[bool, typer.Option("--kept", help="Start with what the target's history keeps already "
                                       "(up to its last hour), not from now.")] = False,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0,
) -> None:
    """Record the target's history to FILE as it happens: each node that leaves the tree (when,
    why, its tokens, who held it), each session's request and its hit, and the figures and the
    sessions every --every; for `radixtop diff`. A target that goes down or restarts is a gap
    in the recording, which goes on. Ctrl-C ends it cleanly."""
    from radixtop.cli.recording import Recorder, parse_duration
    from radixtop.cli.targets import remote_target

    try:
        seconds, every_s = parse_duration(for_), parse_duration(every)
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    if every_s < 0.1:
        raise fail("--every must be at least 0.1s", EXIT_USAGE)
    with remote_target(url, token, timeout) as t:
        out = new_recording(t, file)
        recorder = Recorder(t, out, time.monotonic() + seconds, every_s, max_mb << 20, kept)
        previous = signal.signal(signal.SIGTERM, lambda *_: recorder.stop())
        try:
            with out:
                done = recorder.run(installed_version() or "")
        except OSError as exc:  # a full disk: what is written stays, a line says why it stopped
            raise fail(f"the recording {file} stopped: {exc.strerror}") from None
        finally:
            signal.signal(signal.SIGTERM, previous)
    gaps = f"; {len(done.gaps)} gap{'s' * (len(done.gaps) != 1)}: {inert(done.gaps[0])}" if done.gaps else ""
    requests = "requests not told by this target" if done.served is None else f"{done.served:,} requests"
    typer.echo(f"recorded {done.removed:,} removals ({done.removed_tokens:,} tokens), {requests} and "
               f"{done.moments} moments to {file} ({human_bytes(recorder.written)}); {done.reason}{gaps}")


def new_recording(adapter: Any, path: Path, option: str = "") -> IO[str]:
    """``path`` made new for a recording of ``adapter`` (``create_private``), once the target says it
    keeps a history; else one line (``option``: the option that named the file) and its exit code
    (a target without a history: as every command refused by the target; the file: 2)."""
    from radixtop.adapters.errors import Unsupported
    from radixtop.cli.recording import create_private

    where = f"{option}: " if option else ""
    try:
        adapter.history(0, 0, 1)
    except Unsupported as exc:  # (before a file is made)
        raise fail(f"{where}{exc.message}", exit_code(exc)) from None
    try:
        return create_private(path)
    except FileExistsError:
        raise fail(f"{where}{path} exists: a recording is never overwritten", EXIT_USAGE) from None
    except OSError as exc:
        raise fail(f"{where}cannot create {path}: {exc.strerror}", EXIT_USAGE) from None


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="A recording (radixtop record), or a moment of the target's history "
                                          "(10m ago, 14:03:27).")],
    b: Annotated[str | None, typer.Argument(help="A later recording: from A's end to B's; or a later moment "
                                                 "(default: now).")] = None,
    start: Annotated[str | None, typer.Option("--from", help="The first moment: this long after A's start "
                                              "(default: A's first moment; with B, A's last).")] = None,
    stop: Annotated[str | None, typer.Option("--to", help="The second moment: this long after the start of "
                                             "the recording it is in (default: its last).")] = None,
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = 10.0,
    as_json: Json = False,
) -> None:
    """Compare two moments of a recording, or the ends of two recordings, or two moments of the
    target's own history: the figures then and after, the sessions that grew, came and went, and
    what left the tree in between, by cause and by session."""
    from radixtop.cli.recording import RecordingError, parse_duration, read_recording
    from radixtop.cli.recording import diff as compare

    if not Path(a).exists() and _is_moment(a):
        return _diff_moments(a, b, url, token, timeout, as_json)
    try:
        t1 = None if start is None else parse_duration(start)
        t2 = None if stop is None else parse_duration(stop)
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    try:
        first = read_recording(Path(a))
        d = compare(first, None if b is None else read_recording(Path(b)), t1, t2)
    except RecordingError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot read {exc.filename}: {exc.strerror}") from None
    if as_json:
        return emit_json(d)
    for line in diff_lines(d):
        typer.echo(line)
    return None


def _is_moment(text: str) -> bool:
    from radixtop.cli.remote import parse_moment

    try:
        parse_moment(text, time.time())
    except ValueError:
        return False
    return True


def _diff_moments(a: str, b: str | None, url: str, token: str | None, timeout: float, as_json: bool) -> None:
    """``diff`` of two moments of the target's history (A not a file): from the moment A to B (or now)."""
    from radixtop.cli.recording import RecordingError, diff_live
    from radixtop.cli.remote import parse_moment
    from radixtop.cli.targets import remote_target

    now = time.time()
    try:
        t1 = parse_moment(a, now)
        t2 = now if b is None else parse_moment(b, now)
    except ValueError as exc:  # (B: A was a moment)
        raise fail(f"B is not a moment: {exc}", EXIT_USAGE) from None
    with remote_target(url, token, timeout) as t:
        try:
            d = diff_live(t, t1, t2)
        except RecordingError as exc:
            raise fail(str(exc)) from None
    if as_json:
        return emit_json(d)
    for line in diff_lines(d):
        typer.echo(line)
    return None


def diff_lines(d: dict[str, Any]) -> list[str]:
    from radixtop.adapters.text import when

    bpt = d["bytes_per_token"]
    span = d["to"] - d["from"]
    lines = [f"from {time.strftime('%H:%M:%S', time.localtime(d['from']))} to "
             f"{time.strftime('%H:%M:%S', time.localtime(d['to']))} ({span:.0f}s)"]
    for name, f in d["figures"].items():
        if f["from"] is None and f["to"] is None:
            continue
        if f["change"] is None:
            lines.append(f"  {name}: {_n(f['from'])} -> {_n(f['to'])}")
            continue
        extra = f" ({'+' if f['change'] >= 0 else '-'}{human_bytes(abs(f['change']) * bpt)})" \
            if name in POOL_FIGURES and bpt and f["change"] else ""
        lines.append(f"  {name}: {f['from']:,} -> {f['to']:,} ({f['change']:+,}{extra})")
    s = d["sessions"]
    if s is None:
        lines.append("sessions: not known (the target has none, or a moment lacks them)")
    else:
        for row in s["grew"]:
            change = row["exclusive_bytes_change"]
            lines.append(f"  session {inert(row['id'])}: exclusive memory {'+' if change >= 0 else '-'}"
                         f"{human_bytes(abs(change))}")
        if s["new_count"]:
            lines.append(f"  {s['new_count']:,} sessions among the largest only at the second moment: "
                         f"{', '.join(map(inert, s['new']))}{'…' if s['new_count'] > len(s['new']) else ''}")
        if s["gone_count"]:
            lines.append(f"  {s['gone_count']:,} among the largest only at the first: "
                         f"{', '.join(map(inert, s['gone']))}{'…' if s['gone_count'] > len(s['gone']) else ''}")
    left = d["left"]
    if not left["nodes"]:
        lines.append("nothing left the tree in between")
    else:
        causes = ", ".join(f"{c['tokens']:,} {CAUSE_WORDS[cause]} ({c['nodes']:,} nodes)"
                           for cause, c in sorted(left["by_cause"].items(), key=lambda item: -item[1]["tokens"]))
        lines.append(f"left the tree: {left['tokens']:,} tokens in {left['nodes']:,} nodes: {causes}")
        for row in left["by_session"]:
            causes = ", ".join(f"{n:,} {CAUSE_WORDS[cause]}" for cause, n in row["by_cause"].items())
            lines.append(f"  session {inert(row['id'])}: {row['tokens']:,} tokens ({causes})")
    now = time.time()
    lines.extend(f"gap at {when(g['at'], now)}: {inert(g['reason'])}" for g in d["gaps"])
    return lines


def _n(value: Any) -> str:
    return "unknown" if value is None else f"{value:,}"
