"""``why`` over a tree that keeps its history (``gpu_backend.history.CacheHistory``): the prompt's
cached path read from the live tree, then what of the rest was cached before (issue 29)."""

from __future__ import annotations

import heapq
import time
from array import array
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any

from radixtop.adapters.errors import BadRequest
from radixtop.adapters.model import (
    MAX_BRANCH_HOLDERS,
    MAX_BRANCHES_SHOWN,
    MAX_HISTORY_PAGE_TOKENS,
    MAX_LOSSES_SHOWN,
    MAX_SERVED_SHOWN,
    MAX_SESSIONS_THEN,
    BranchView,
    GhostView,
    HistoryPage,
    LossView,
    LostView,
    ServedEntry,
    ServedView,
    SessionMemoryThen,
    SessionThenView,
    SessionWhyView,
    ThenView,
    WhyView,
)
from radixtop.gpu_backend.history import (
    BEGIN,
    CLOSE,
    CLOSED,
    REGISTER,
    ROOT,
    STORE_CHUNK,
    CacheHistory,
    Ghost,
    Lost,
    moment_end,
    tree_then,
)


def lost_view(lost: Lost) -> LostView:
    g = lost.ghost
    protected, capacity = g.pool if g.pool is not None else (None, None)
    return LostView(lost.start, lost.end, g.cause, g.at, g.node_id, g.session_id,  # type: ignore[arg-type]
                    g.holders, protected, capacity, g.who)


def live_path(node: Any, end: int, root: Any) -> list[tuple[int, int]]:
    """``(id, end)`` of each node from ``root`` down to ``node`` (whose path ends at token ``end``),
    walked up by ``parent`` and ``key`` (no pass over the tree: the path's nodes only)."""
    path: list[tuple[int, int]] = []
    while node is not None:
        path.append((node.id, end))
        if node is root:
            break
        end -= len(node.key)
        node = node.parent
    path.reverse()
    return path


def why_view(history: CacheHistory, tokens: Sequence[int], live: list[tuple[int, int]], cached: int,
             node_id: int, partial_node_id: int | None, partial_tokens: int, page_size: int = 1,
             unit: str = "node") -> WhyView:
    lost = history.explain(tokens, live, cached, page_size)
    return WhyView(len(tokens), cached, cached, node_id, partial_node_id, partial_tokens,
                   tuple(lost_view(one) for one in lost), history.reaches_back_to(), unit)  # type: ignore[arg-type]


STORY_SLICE = 20_000
"""Removals (or requests) a slice of a session's ``why`` copies on the owner thread: the longest
slice 1.0 ms at the bounds (``bench_history.py``: 150,000 removals and 50,000 requests, whose
copy in one hold took 2.3 ms)."""


def session_story(history: CacheHistory) -> Generator[None, None, tuple[Any, ...]]:
    """What a session's ``why`` needs of the history, copied on the owner thread a slice at a time
    (a pass: C-speed copies of ``STORY_SLICE`` each, read from where the last stopped, by their
    numbers: what the bounds drop between two slices is gone, what comes is read too); the rest
    is done off it (``session_why_view``)."""
    ghosts = yield from _in_slices(history.ghosts_after)
    requests = None if history.served_since is None else (yield from _in_slices(history.requests_after))
    return ghosts, requests, history.reaches_back_to(), history.served_since


def _in_slices(read_after: Callable[[int, int], Any]) -> Generator[None, None, list[Any]]:
    """Every item of a journal (``read_after(after, limit)``: the items numbered past ``after`` and
    the first one's number), ``STORY_SLICE`` a slice, a yield between two."""
    items: list[Any] = []
    after = 0
    while True:
        got, first = read_after(after, STORY_SLICE)
        items.extend(got)
        if len(got) < STORY_SLICE:
            return items
        after = first + len(got) - 1
        yield


def session_why_view(session_id: str, ghosts: list[Ghost], requests: list[tuple[Any, ...]] | None,
                     history_since: float, requests_since: float | None, unit: str = "node") -> SessionWhyView:
    """``session_id``'s requests among ``requests`` and the ghosts it held (or its own close freed),
    a loss each group that left together (the same cause, closing session and asker, within a second of the first)."""
    served = None if requests is None else [r for r in requests if r[1] == session_id and r[4] == BEGIN]
    losses: list[LossView] = []
    by_cause: dict[str, int] = {}
    for g in ghosts:
        if session_id not in g.holders and not (g.cause == "closed" and g.session_id == session_id):
            continue  # (a close empties the holders of what it frees: its own chain is the session's)
        by_cause[g.cause] = by_cause.get(g.cause, 0) + g.length
        last = losses[-1] if losses else None
        if last is not None and (last.cause, last.session_id, last.who) == (g.cause, g.session_id, g.who) \
                and g.at - last.at < 1.0:
            losses[-1] = replace(last, nodes=last.nodes + 1, tokens=last.tokens + g.length)
            continue
        protected, capacity = g.pool if g.pool is not None else (None, None)
        losses.append(LossView(g.at, g.cause, 1, g.length, g.node_id, g.session_id,  # type: ignore[arg-type]
                               protected, capacity, g.who))
    return SessionWhyView(
        session_id,
        None if served is None else tuple(ServedView(r[0], r[2], r[3]) for r in served[-MAX_SERVED_SHOWN:]),
        None if served is None else len(served),
        None if served is None else sum(r[2] for r in served),
        None if served is None else sum(r[3] for r in served),
        requests_since, tuple(losses[-MAX_LOSSES_SHOWN:]), by_cause, history_since, unit)  # type: ignore[arg-type]


def answer_session(session_id: str, story: tuple[Any, ...], known: Callable[[str], object],
                   unit: str = "node") -> SessionWhyView:
    """``session_why_view`` of a ``session_story``; where it finds nothing of the session, ``known``
    (the target's ``session`` read) says whether the target knows it at all (UnknownSession)."""
    view = session_why_view(session_id, *story, unit=unit)
    if not view.requests_kept and not view.lost:
        known(session_id)
    return view


def journal_read(history: CacheHistory, after: int, served_after: int, limit: int) -> tuple[Any, ...]:
    """The owner thread's part of a page of the journal: C-speed copies (``history_page``)."""
    return (history.epoch, *history.page(after, limit, served_after), history.removed_count,
            history.served_count, history.reaches_back_to())


def history_page(read: tuple[Any, ...]) -> HistoryPage:
    """A ``journal_read`` as a view, off the owner thread; its removals cut at
    ``MAX_HISTORY_PAGE_TOKENS`` tokens (one node at least), its ops too (one op at least)."""
    epoch, ghosts, first, served, served_first, count, served_count, since = read
    views, tokens = [], 0
    for seq, g in enumerate(ghosts, first):
        tokens += g.length
        if views and tokens > MAX_HISTORY_PAGE_TOKENS:
            break
        protected, capacity = g.pool if g.pool is not None else (None, None)
        views.append(GhostView(seq, g.at, g.cause, g.node_id, None if g.parent_id == ROOT else g.parent_id,  # type: ignore[arg-type]
                               tuple(array("q", g.tokens)), g.session_id, g.holders, protected, capacity, g.who))
    entries, tokens = [], 0
    for seq, r in enumerate(served or (), served_first):
        ids = r[6]  # (read once: the owner thread may drop an op's tokens meanwhile, the bound)
        tokens += 0 if ids is None else len(ids)
        if entries and tokens > MAX_HISTORY_PAGE_TOKENS:
            break
        entries.append(_entry(seq, *r[:6], ids, r[7]))
    return HistoryPage(epoch, tuple(views), first, count, None if served is None else tuple(entries),
                       served_first, served_count, since)


def _entry(seq: int, at: float, session_id: str | None, prompt: int, cached: int, op: str, request_id: str | None,
           tokens: Sequence[int] | None, asked: int) -> ServedEntry:
    return ServedEntry(seq, at, session_id, prompt, cached, op, request_id,  # type: ignore[arg-type]
                       None if tokens is None else tuple(tokens), asked)


CHUNKS_A_SLICE = 4
"""Chunks of changes a slice of ``then_pass`` copies at most (8,192 changes each: about 0.1 ms)."""


def then_pass(history: CacheHistory, at: float | None, tokens_now: Callable[[], int],
              ledger: Any = None, bytes_per_token: int = 0) -> Generator[None, None, tuple[Any, ...]]:
    """What the tree at ``at`` needs of the history, copied on the owner thread a slice at a time
    (the removals since, ``STORY_SLICE`` a slice, and the changes since, a chunk a slice); the last
    slice reads the tree's tokens now with both journals' ends (``then_view`` off it). ``ledger``:
    the tree's ``SessionLedger``, whose figures told to the history give the sessions' memory then
    (``memory_pass``)."""
    at, reach = check_moment(history, at)
    start = history.first_after(at)  # (before any slice: what the bounds drop from here on is seen)
    marks = ledger is not None and ledger.journal is history
    first_mark = memory_start(history, at) if marks else None
    ops, ops_since = None, history.served_since
    if ops_since is not None:  # (the sessions then: their ops up to the moment)
        ops = yield from _in_slices(history.requests_after)
        yield
    memory = None
    if first_mark is not None:
        memory = yield from memory_pass(history, ledger, first_mark)
    ghosts, changes, _ = yield from changes_from(history, at, start)
    since = history.marks_since if ledger is not None else None  # (none: the target keeps no sessions' figures)
    return ghosts, changes, tokens_now(), reach, at, ops, ops_since, (memory, since, bytes_per_token)


def memory_start(history: CacheHistory, at: float) -> int | None:
    """The number of the first mark after ``at`` (read before any slice, so that marks the
    bounds drop meanwhile are seen); None where the marks do not reach back to ``at``."""
    if history.marks_since is None or at < history.marks_since:
        return None
    return history.marks_first_after(at)


def memory_pass(history: CacheHistory, ledger: Any, number: int) -> Generator[None, None, tuple[Any, ...] | None]:
    """The sessions' figures at a moment, copied on the owner thread: the ledger's figures now (its
    three maps, one a slice: 0.2 ms each at 50,000 sessions; all three again in one where a reset
    came between) and every mark from ``number`` (``memory_start``: the figures a session had until
    it moved), a chunk of marks (8,192) a slice, to the journal's end in the last. A session's first
    mark from there is its figures then; one with none kept its figures since, so its figures read
    now (in any slice) are its figures then. None where the bounds drop marks from ``number`` on
    while they are read."""
    resets = ledger.resets
    now: list[dict[str, int]] = []
    for name in ("tags", "exclusive", "path"):  # (read anew each slice: a reset makes new maps)
        now.append(dict(getattr(ledger, name)))
        yield
    if ledger.resets != resets:  # (a reset between: the maps now of one tree)
        now = [dict(ledger.tags), dict(ledger.exclusive), dict(ledger.path)]
    marks: list[Any] = []
    while True:
        piece = history.marks_from(number, history.mark_chunk)
        if piece is None:  # (dropped since it was found)
            return None
        if piece[1] == number and number <= history.marked_count:  # (never a loop on the owner thread)
            raise RuntimeError(f"the marks journal gave nothing from {number} of {history.marked_count}")
        marks.append(piece[0])
        number = piece[1]
        if number > history.marked_count:
            return tuple(now), marks
        yield


def memory_then(memory: tuple[Any, ...]) -> dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """Each session that held anything then or now: its figures then and now (tagged nodes,
    exclusive tokens, path tokens), from a ``memory_pass``."""
    (tags, exclusive, path), marks = memory
    then: dict[str, tuple[int, int, int]] = {}
    for _, sids, nums in marks:
        for i, sid in enumerate(sids):
            if sid not in then:
                then[sid] = (nums[3 * i], nums[3 * i + 1], nums[3 * i + 2])
    figures = {}
    for sid in then.keys() | tags.keys() | exclusive.keys() | path.keys():
        now = (tags.get(sid, 0), exclusive.get(sid, 0), path.get(sid, 0))
        was = then.get(sid, now)
        if any(was) or any(now):
            figures[sid] = (was, now)
    return figures


def check_moment(history: CacheHistory, at: float | None) -> tuple[float, float]:
    """``at`` (None: as far back as the history reaches) and the history's reach, or BadRequest
    where the history does not reach back to it or it is to come."""
    now = max(history.clock(), time.time())  # (a stream's clock is its last batch's)
    reach = history.then_reaches_back_to()
    if at is None:
        at = reach
    if at != at or at > now + 1.0:
        raise BadRequest(f"a moment to look back to, not {at!r}: it is {now:.3f} now")
    if at < reach:
        raise BadRequest(f"the history reaches back to {_clock(reach)} ({now - reach:,.0f}s ago) only: "
                         "ask for a later moment")
    return at, reach


def changes_from(history: CacheHistory, at: float,
                 start: tuple[int, int]) -> Generator[None, None, tuple[list[Ghost], list[Any], tuple[int, int]]]:
    """The removals and the changes from ``start`` (their numbers) to both journals' ends, read in
    slices on the owner thread (``STORY_SLICE`` removals and ``CHUNKS_A_SLICE`` chunks of changes
    a slice), and the numbers past them (where the next read starts)."""
    removal, change = start
    ghosts: list[Ghost] = []
    changes: list[Any] = []
    while True:
        got, first = history.ghosts_after(removal - 1, STORY_SLICE)
        if first > removal:
            raise BadRequest(f"the history dropped changes after {_clock(at)} while they were read (its "
                             "bounds): ask for a later moment")
        ghosts.extend(got)
        removal += len(got)
        for _ in range(CHUNKS_A_SLICE):  # (more than one where it is behind: a busy tree catches up)
            piece = history.stores_from(change, STORE_CHUNK)
            if piece is None:
                raise BadRequest(f"the history dropped changes after {_clock(at)} while they were read (its "
                                 "bounds): ask for a later moment")
            changes.append(piece[0])
            change = piece[1]
            if change > history.stored_count:
                break
        if removal > history.removed_count and change > history.stored_count:
            return ghosts, changes, (removal, change)
        yield


def then_view(read: tuple[Any, ...], unit: str = "node") -> ThenView:
    """The tree at the moment of a ``then_pass`` (off the owner thread): its branches that left
    since and that were stored since, the largest first."""
    ghosts, changes, tokens_now, reach, at, ops, ops_since, (memory, memory_since, bpt) = read
    diff = tree_then(changes, ghosts)
    left_by: dict[int, Ghost] = {g.node_id: g for g in diff.left}
    left, left_branches = _branches({i: (g.parent_id, g.length, g.at) for i, g in left_by.items()}, left_by)
    stored, stored_branches = _branches(diff.new, {})
    by_cause: dict[str, int] = {}
    for g in diff.left:
        by_cause[g.cause] = by_cause.get(g.cause, 0) + g.length
    left_tokens, stored_tokens = diff.left_tokens, diff.new_tokens
    sessions, open_then = (None, None) if ops is None else sessions_then(ops, ghosts, at)
    return ThenView(at, tokens_now - stored_tokens + left_tokens, tokens_now, left_tokens, len(diff.left),
                    by_cause, tuple(left), left_branches, stored_tokens, len(diff.new), tuple(stored),
                    stored_branches, reach, unit,  # type: ignore[arg-type]
                    None if sessions is None else tuple(sessions[:MAX_SESSIONS_THEN]),
                    None if sessions is None else len(sessions), open_then, ops_since,
                    *_memory_views(memory, memory_since), bpt or None)


def _memory_views(memory: tuple[Any, ...] | None,
                  since: float | None) -> tuple[tuple[SessionMemoryThen, ...] | None, int | None, float | None]:
    """``ThenView.memory``, ``memory_sessions`` and ``memory_since``: the sessions holding most
    then (by exclusive memory, then by the memory on their paths)."""
    if memory is None:
        return None, None, since
    held = [(sid, was, now) for sid, (was, now) in memory_then(memory).items() if any(was)]
    held.sort(key=lambda item: (-item[1][1], -item[1][2], item[0]))
    views = tuple(SessionMemoryThen(sid, was[0], was[1], was[2] - was[1], now[0], now[1], now[2] - now[1])
                  for sid, was, now in held[:MAX_SESSIONS_THEN])
    return views, len(held), since


def sessions_then(ops: list[Any], ghosts: list[Ghost], at: float) -> tuple[list[SessionThenView], int]:
    """The sessions with an op by ``at`` as they were then (their requests, open or closed), what
    each held that left since, the most recently active first; and how many were open then."""
    state: dict[str, list[Any]] = {}  # sid -> [closed, requests, prompt, cached, last_at, last prompt, last hit]
    end = moment_end(at)  # (the moment as of the end of its millisecond, as the tree then)
    for op in ops:
        if op[0] >= end:
            break
        sid = op[1]
        if sid is None:
            continue
        s = state.get(sid)
        if s is None:
            s = state[sid] = [False, 0, 0, 0, op[0], 0, 0]
        s[4] = op[0]
        kind = op[4]
        if kind == CLOSE:
            s[0] = True
        elif kind == BEGIN:
            s[0] = False
            s[1] += 1
            s[2] += op[2]
            s[3] += op[3]
            s[5], s[6] = op[2], op[3]
        elif kind == REGISTER:
            s[0] = False
    lost: dict[str, int] = {}
    for g in ghosts:  # (the removals since the moment)
        owners = set(g.holders)
        if g.cause == CLOSED and g.session_id is not None:
            owners.add(g.session_id)
        for sid in owners:
            if sid in state:
                lost[sid] = lost.get(sid, 0) + g.length
    views = [SessionThenView(sid, "closed" if s[0] else "open", s[1], s[2], s[3], s[4], s[5], s[6], lost.get(sid, 0))
             for sid, s in state.items()]
    views.sort(key=lambda v: (-v.last_at, v.session_id))
    return views, sum(1 for s in state.values() if not s[0])


def _branches(nodes: dict[int, tuple[int, int, float]], ghosts: dict[int, Ghost]) -> tuple[list[BranchView], int]:
    """``nodes`` (id -> its parent's id, its tokens, when) grouped by their top node (the first up
    whose parent is not among them): the largest ``MAX_BRANCHES_SHOWN``, the largest first, and how
    many there are."""
    top: dict[int, int] = {}
    for node_id in nodes:
        path, up = [], node_id
        while up in nodes and up not in top:
            path.append(up)
            up = nodes[up][0]
        found = top.get(up, path[-1] if path else up)
        for one in path:
            top[one] = found
    grown: dict[int, list[Any]] = {}
    for node_id, (_, tokens, at) in nodes.items():
        b = grown.get(top[node_id])
        if b is None:
            b = grown[top[node_id]] = [0, 0, at, at, {}, []]
        b[0] += 1
        b[1] += tokens
        if at < b[2]:
            b[2] = at
        elif at > b[3]:
            b[3] = at
        g = ghosts.get(node_id) if ghosts else None
        if g is not None:  # (what left: its causes and holders)
            b[4][g.cause] = b[4].get(g.cause, 0) + tokens
            if g.holders and len(b[5]) < MAX_BRANCH_HOLDERS:
                b[5].extend(h for h in g.holders if h not in b[5])
    largest = heapq.nsmallest(MAX_BRANCHES_SHOWN, grown.items(), key=lambda item: (-item[1][1], item[1][2]))
    shown = []
    for node_id, (n, tokens, first, last, causes, holders) in largest:
        parent = nodes[node_id][0]
        shown.append(BranchView(node_id, None if parent == ROOT else parent, n, tokens, first, last, causes,
                                tuple(holders[:MAX_BRANCH_HOLDERS])))
    return shown, len(grown)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))
