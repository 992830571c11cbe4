"""Random but valid radixtop traces (JSON lines) for differential and property tests.

``generate_trace(seed, n_ops)`` mixes everything the trace format can say:

* a few shared system prompts (two of them share a preamble, so they split inside a node);
* sessions with multi-turn conversations that grow (turn input = previous input + output + new
  user tokens), run either as one ``request`` or as ``begin`` ... ``finish`` with other ops between;
* requests without a session: on a system prompt, on a cut of some conversation (the cut falls
  anywhere, usually inside a node, so the tree splits), or an exact repeat of an earlier input
  (full hit) with a fresh output;
* branches of a conversation under its own session id (a session holding several leaves);
* several requests in flight at once (at most ``max_in_flight``), including a turn still in flight
  when its own session is closed, so it finishes after the close;
* closes of open, already closed and never seen sessions; registers that reopen a closed session
  (whose conversation may go on) or name a new id; turns on a closed, not reopened, session;
* explicit evicts; the odd empty input or empty output.

Requests left in flight at the end stay in flight (their paths stay locked in the final tree).

Capacity: ``min_safe_capacity(lines)`` is the smallest pool that can never run out of slots for a
trace: at every allocation, the slots that cannot be evicted are the locked prefixes plus the own
slots of the running requests, at most the sum of their inputs, plus the allocating request's
whole input + output; everything else in the tree is unlocked and so evictable. ``capacity_for``
gives a "small" pool (that minimum: lots of eviction) and a "large" one (rare eviction).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

VOCAB = 400  # token ids 1..VOCAB-1 (small, so unrelated prompts collide on first tokens and split)


def _line(op: str, **fields) -> str:
    return json.dumps({"op": op, **fields}, separators=(",", ":"))


@dataclass
class _Session:
    sid: str
    history: list[int]  # the last finished turn's input + output ([] before the first turn)
    turns: list[list[int]] = field(default_factory=list)  # finished turns' input + output
    busy: bool = False  # a turn of it is in flight
    closed: bool = False


@dataclass
class _Running:
    rid: str
    input: list[int]
    session: _Session | None
    is_turn: bool  # finishing it advances the session's conversation


def generate_trace(
    seed: int,
    n_ops: int = 150,
    *,
    max_in_flight: int = 4,
    n_system_prompts: int = 3,
    max_history: int = 90,
    vocab: int = VOCAB,
    abort_weight: int = 0,
) -> list[str]:
    """``n_ops`` JSON lines; the same seed always gives the same trace.

    ``vocab``: token ids are drawn from 1..vocab-1; a small vocabulary makes unrelated requests
    share leading tokens, so nodes split far more often.
    """
    rng = random.Random(seed)

    def toks(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))]

    preamble = toks(4, 8)
    prompts = [preamble + toks(3, 10), preamble + toks(3, 10)]
    prompts += [toks(6, 18) for _ in range(max(0, n_system_prompts - 2))]

    sessions: list[_Session] = []
    running: list[_Running] = []
    inputs_seen: list[list[int]] = []
    lines: list[str] = []
    counters = {"session": 0, "req": 0, "ghost": 0}

    def new_id(kind: str) -> str:
        counters[kind] += 1
        return {"session": "s", "req": "r", "ghost": "ghost-"}[kind] + str(counters[kind])

    def output() -> list[int]:
        return [] if rng.random() < 0.04 else toks(1, 8)

    def start(input_ids: list[int], session: _Session | None, is_turn: bool) -> None:
        """Emit a request, or a begin when a slot for one more running request is free."""
        sid = session.sid if session else None
        inputs_seen.append(input_ids)
        if len(running) < max_in_flight and rng.random() < 0.55:
            rid = new_id("req")
            running.append(_Running(rid, input_ids, session, is_turn))
            if session is not None and is_turn:
                session.busy = True
            lines.append(_line("begin", id=rid, input=input_ids, session=sid))
        else:
            out = output()
            lines.append(_line("request", input=input_ids, output=out, session=sid))
            if session is not None and is_turn:
                _advance(session, input_ids + out)

    def _advance(session: _Session, full: list[int]) -> None:
        session.history = full
        session.turns.append(full)

    def finish() -> None:
        r = running.pop(rng.randrange(len(running)))
        out = output()
        if r.session is not None and r.is_turn:
            r.session.busy = False
            _advance(r.session, r.input + out)
        lines.append(_line("finish", id=r.rid, output=out))

    def abort() -> None:
        """A running request is retracted: nothing inserted, its session's turn not taken."""
        r = running.pop(rng.randrange(len(running)))
        if r.session is not None and r.is_turn:
            r.session.busy = False
        lines.append(_line("abort", id=r.rid))

    def idle(pred) -> list[_Session]:
        return [s for s in sessions if not s.busy and len(s.history) < max_history and pred(s)]

    def op_turn() -> None:
        """The next turn of a conversation, or the first turn of a new session."""
        candidates = idle(lambda s: not s.closed or rng.random() < 0.25)
        if candidates and rng.random() < 0.8:
            s = rng.choice(candidates)
            input_ids = s.history + toks(1, 6)
        else:
            s = _Session(new_id("session"), [])
            sessions.append(s)
            prompt = rng.choice(prompts)
            if rng.random() < 0.2:  # a truncated prompt: ends inside the prompt's node
                prompt = prompt[: rng.randint(1, len(prompt))]
            input_ids = prompt + toks(1, 6)
        start(input_ids, s, is_turn=True)

    def op_plain() -> None:
        """A request without a session."""
        r = rng.random()
        with_turns = [s for s in sessions if s.turns]
        if r < 0.35 and inputs_seen:
            input_ids = list(rng.choice(inputs_seen))  # full hit (if still cached)
        elif r < 0.7 and with_turns:
            turn = rng.choice(rng.choice(with_turns).turns)
            input_ids = turn[: rng.randint(0, len(turn))] + toks(0, 5)  # diverge anywhere
        elif r < 0.73:
            input_ids = []
        else:
            input_ids = rng.choice(prompts) + toks(1, 8)
        start(input_ids, None, is_turn=False)

    def op_branch() -> None:
        """A side branch of a conversation under its own session id (several leaves held)."""
        with_turns = [s for s in sessions if s.turns and len(s.history) < max_history]
        if not with_turns:
            return op_turn()
        s = rng.choice(with_turns)
        turn = rng.choice(s.turns)
        start(turn[: rng.randint(1, len(turn))] + toks(1, 5), s, is_turn=False)

    def op_close() -> None:
        r = rng.random()
        open_ = [s for s in sessions if not s.closed]
        closed = [s for s in sessions if s.closed]
        busy = [s for s in open_ if s.busy]
        if busy and r < 0.25:
            s = rng.choice(busy)  # its turn is in flight: it will finish after the close
        elif open_ and r < 0.75:
            s = rng.choice(open_)
        elif closed and r < 0.9:
            s = rng.choice(closed)  # already closed
        else:
            lines.append(_line("close", session=new_id("ghost")))  # never seen
            return
        s.closed = True
        lines.append(_line("close", session=s.sid))

    def op_register() -> None:
        closed = [s for s in sessions if s.closed]
        if closed and rng.random() < 0.8:
            s = rng.choice(closed)
            s.closed = False
            lines.append(_line("register", session=s.sid))
        else:
            s = _Session(new_id("session"), [])  # a fresh id, registered before use
            sessions.append(s)
            lines.append(_line("register", session=s.sid))

    def op_evict() -> None:
        lines.append(_line("evict", tokens=rng.choice([0, 1, rng.randint(1, 12), rng.randint(10, 60)])))

    weighted = [
        (op_turn, 30), (op_plain, 12), (op_branch, 6), (finish, 24),
        (op_close, 10), (op_register, 5), (op_evict, 5), (abort, abort_weight),
    ]
    funcs = [f for f, _ in weighted]
    weights = [w for _, w in weighted]
    while len(lines) < n_ops:
        f = rng.choices(funcs, weights)[0]
        if f in (finish, abort) and not running:
            continue
        if len(running) >= max_in_flight and rng.random() < 0.5:
            f = finish
        f()
    return lines[:n_ops]


def _ops(lines: list[str]) -> list[dict]:
    return [json.loads(t) for t in lines if t.strip() and not t.lstrip().startswith("#")]


def min_safe_capacity(lines: list[str]) -> int:
    """The smallest pool (tokens) that can never run out of slots on ``lines``.

    At a begin the unevictable slots are at most the inputs of every running request (locked
    prefix + own slots), this one's included; at a finish, the others' inputs plus this one's
    input + output. The maximum over the trace is enough whatever the eviction order, since every
    unlocked node can be evicted (leaves first) before an allocation fails.
    """
    running: dict[str, int] = {}
    need = 1
    for op in _ops(lines):
        base = sum(running.values())
        kind = op["op"]
        if kind == "begin":
            need = max(need, base + len(op["input"]))
            running[op["id"]] = len(op["input"])
        elif kind == "finish":
            need = max(need, base + len(op["output"]))  # base already has this one's input
            running.pop(op["id"])
        elif kind == "abort":
            running.pop(op["id"], None)
        elif kind == "request":
            need = max(need, base + len(op["input"]) + len(op["output"]))
    return need


def distinct_tokens(lines: list[str]) -> int:
    """Tokens the tree would hold if nothing were ever evicted or closed: the distinct prefixes
    of every sequence the trace inserts (a begin's input, a finished request's input + output)."""
    root: dict = {}
    count = 0
    running: dict[str, list[int]] = {}
    for op in _ops(lines):
        kind = op["op"]
        if kind == "begin":
            running[op["id"]] = op["input"]
            seq = op["input"]
        elif kind == "finish":
            seq = running.pop(op["id"]) + op["output"]
        elif kind == "request":
            seq = op["input"] + op["output"]
        else:
            continue
        node = root
        for token in seq:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                count += 1
            node = child
    return count


def capacity_for(lines: list[str], size: str) -> int:
    """``"small"``: :func:`min_safe_capacity` (allocations evict often; every trace evicts);
    ``"large"``: 80% of :func:`distinct_tokens`, never below the safe minimum (about 1% of
    allocations evict, in about half the traces)."""
    safe = min_safe_capacity(lines)
    if size == "small":
        return safe
    if size == "large":
        return max(safe, distinct_tokens(lines) * 4 // 5)
    raise ValueError(f"unknown capacity size {size!r}; expected 'small' or 'large'")
