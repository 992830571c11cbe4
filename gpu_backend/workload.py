"""A synthetic multi-session chat workload: shared system prompts, growing conversations."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkloadConfig:
    """Shape of the demo traffic; every random choice comes from ``seed``."""

    sessions: int = 64
    """Sessions open at once; a closed session is replaced by a new one."""
    system_prompts: int = 4
    system_prompt_len: int = 256
    turn_input_len: tuple[int, int] = (16, 96)
    turn_output_len: tuple[int, int] = (16, 128)
    turns: tuple[int, int] = (2, 8)
    """Turns per session before it is closed (or left open, see never_closed_share)."""
    never_closed_share: float = 0.2
    """Share of sessions that are abandoned without a close (their KV leaves only by eviction)."""
    max_running: int = 8
    """Requests in flight at once."""
    decode_steps: tuple[int, int] = (1, 4)
    """Engine steps a request stays running before it finishes."""
    arrival_rate: float = 0.0
    """Requests started per second; 0 starts them as fast as the engine steps."""
    vocab_size: int = 32000
    seed: int = 0
    text: bool = False
    """Real words (``demo_text``): the four demo system prompts, chats and tool loops, in the ids
    of ``DEMO_TOKENIZER``; the lengths above then come from the text. False: random ids."""

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.max_running < 1 or self.system_prompts < 1:
            raise ValueError("sessions, max_running and system_prompts must be >= 1")
        if not 0.0 <= self.never_closed_share <= 1.0:
            raise ValueError("never_closed_share must be between 0 and 1")
        for name in ("turn_input_len", "turn_output_len", "turns", "decode_steps"):
            lo, hi = getattr(self, name)
            if lo < 1 or hi < lo:
                raise ValueError(f"{name} must be (min, max) with 1 <= min <= max")

    def max_request_tokens(self) -> int:
        """The longest a request can get: system prompt plus every turn at its longest."""
        per_turn = self.turn_input_len[1] + self.turn_output_len[1]
        return self.system_prompt_len + self.turns[1] * per_turn


@dataclass
class _Session:
    sid: str
    history: list[int]
    turns_left: int
    closes: bool
    busy: bool = False
    kind: int = 0
    """Which system prompt it started from (in text mode, what it talks about)."""


@dataclass
class _Turn:
    """A request in flight: its session, when it finishes, its output, and the length of the
    session's history before its turn (what a refused begin goes back to)."""

    session: _Session
    due: int
    output: list[int]
    history_len: int


@dataclass(frozen=True)
class Action:
    """One thing the engine should do now."""

    kind: str  # "begin", "finish", "close"
    rid: str = ""
    session_id: str | None = None
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)


class ChatWorkload:
    """Yields begin/finish/close actions, one engine step at a time."""

    def __init__(self, config: WorkloadConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        rng, c = self.rng, config
        self.conversations = None
        if c.text:
            from radixtop.gpu_backend.demo_text import DemoConversations

            self.conversations = DemoConversations(random.Random(c.seed + 1))
            prompts = self.conversations.system_prompts
            self.system_prompts = [prompts[i % len(prompts)] for i in range(c.system_prompts)]
        else:
            self.system_prompts = [
                [rng.randrange(c.vocab_size) for _ in range(c.system_prompt_len)] for _ in range(c.system_prompts)
            ]
        self.sessions: dict[str, _Session] = {}
        self.running: dict[str, _Turn] = {}
        self._pending: list[Action] = []
        """Closes of sessions that ended outside a step (a turn that can never fit), for the next."""
        self._finished_at: deque = deque()
        self._next_session = 0
        self._next_request = 0
        self.step_no = 0
        for _ in range(c.sessions):
            self._open_session()

    def _open_session(self) -> _Session:
        c, rng = self.config, self.rng
        self._next_session += 1
        sid = f"s{self._next_session}"
        kind = rng.randrange(len(self.system_prompts))
        session = _Session(
            sid=sid,
            history=list(self.system_prompts[kind]),
            turns_left=rng.randint(*c.turns),
            closes=rng.random() >= c.never_closed_share,
            kind=kind,
        )
        self.sessions[sid] = session
        return session

    def step(self, max_new: int | None = None) -> list[Action]:
        """Actions for one engine step: finish due requests, close done sessions, start new ones.

        ``max_new`` caps how many requests start in this step (the engine's arrival-rate budget).
        """
        c, rng = self.config, self.rng
        self.step_no += 1
        actions, self._pending = self._pending, []
        for rid, turn in list(self.running.items()):
            if turn.due <= self.step_no:
                del self.running[rid]
                session = turn.session
                actions.append(Action("finish", rid, session.sid, output_ids=turn.output))
                session.history.extend(turn.output)
                session.busy = False
                session.turns_left -= 1
                if session.turns_left <= 0:
                    self._end(session, actions)
        budget = c.max_running - len(self.running)
        if max_new is not None:
            budget = min(budget, max_new)
        idle = [s for s in self.sessions.values() if not s.busy]
        rng.shuffle(idle)
        for session in idle[: max(0, budget)]:
            self._next_request += 1
            rid = f"r{self._next_request}"
            history_len = len(session.history)
            if self.conversations is not None:
                session.history.extend(self.conversations.user_turn(session.kind))
                output = self.conversations.reply(session.kind)
            else:
                session.history.extend(rng.randrange(c.vocab_size) for _ in range(rng.randint(*c.turn_input_len)))
                output = [rng.randrange(c.vocab_size) for _ in range(rng.randint(*c.turn_output_len))]
            session.busy = True
            self.running[rid] = _Turn(session, self.step_no + rng.randint(*c.decode_steps), output, history_len)
            actions.append(Action("begin", rid, session.sid, input_ids=list(session.history)))
        return actions

    def _end(self, session: _Session, actions: list[Action]) -> None:
        """The session is done: closed (unless it is one never closed) and replaced."""
        del self.sessions[session.sid]
        if session.closes:
            actions.append(Action("close", session_id=session.sid))
        self._open_session()

    def abort(self, rid: str, give_up: bool = False) -> None:
        """The engine could not begin ``rid`` (no slots). Its turn is undone, so the session's
        history is as it was before: it tries a new turn later, or with ``give_up`` (its request
        can never fit) it ends, as if its turns had run out. Were the turn kept, each retry would
        grow the history, and on a small pool no session would ever fit again."""
        turn = self.running.pop(rid, None)
        if turn is None:
            return
        session = turn.session
        del session.history[turn.history_len :]
        session.busy = False
        if give_up:
            self._end(session, self._pending)
