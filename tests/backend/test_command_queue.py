"""The engine's command queue as a model: Hypothesis drives ``Engine.call`` from several threads.

Commands return, raise, hold the owner thread (so that others time out behind them), time out
and are cancelled, and the engine is stopped, with or without a workload stepping. After every
step the model checks what the queue promises: a command runs at most once; one whose caller
timed out before it started never runs, not even later; each caller gets its own command's
result or exception; commands run in the order they were queued (so one thread's run in its
order); an exception in a command leaves the engine serving; and once ``stop()`` returns, every
call raises OwnerStopped at once, nothing queued runs, and no caller is left waiting.

No timed assertions: a "short" timeout is one that certainly expires while the owner thread is
held (the model holds it until it says so), a "long" one is never reached by a healthy command;
waits for an answer are bounded by generous deadlines that only a hang reaches.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixtop.gpu_backend.engine import Engine
from radixtop.gpu_backend.owner.queue import READ_BUDGET_S, OwnerQueue, OwnerStopped, OwnerTimeout
from radixtop.gpu_backend.workload import WorkloadConfig
from tests.support.engines import make_scheduler

CLIENTS = 3
LONG = 60.0  # never reached by a command that is not held: its caller gets the command's answer
SHORT = 0.05  # certainly expires while the owner thread is held
ANSWER_DEADLINE = 30.0  # only a hang waits this long for an answer
REFUSAL_DEADLINE = 10.0  # a call after stop() is refused at once; this bounds the wait if it is not
WORKLOAD = WorkloadConfig(sessions=4, system_prompts=2, system_prompt_len=16, turn_input_len=(2, 6),
                          turn_output_len=(2, 6), turns=(1, 3), max_running=2, seed=3)


class CommandFailed(Exception):
    """What a command raises on purpose (each instance is its own, so identity says whose)."""


RAISES = {
    "value_error": lambda cid: ValueError(f"command {cid}"),
    "own_error": lambda cid: CommandFailed(f"command {cid}"),
    # Both are what Future.result() itself raises on a timeout or a cancel: a command that raises
    # them must still reach its caller as its own exception, not be read as the queue's.
    "timeout_error": lambda cid: TimeoutError(f"command {cid}"),
    "cancelled_error": lambda cid: CancelledError(f"command {cid}"),
    "engine_timeout": lambda cid: OwnerTimeout(f"command {cid}"),
}


@dataclass(eq=False)
class Command:
    """One queued function and everything the model knows about it."""

    cid: int
    client: int
    kind: str  # "value", "none", one of RAISES, or "hold"
    timeout: float
    run_order: list[int]  # the model's log of cids in the order the owner thread ran them
    gate: threading.Event | None = None  # a "hold" command waits on it
    value: Any = field(default_factory=object)  # a unique object: identity says whose it is
    error: BaseException | None = None
    runs: int = 0
    ran_on: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)
    outcome: tuple[str, Any] | None = None  # ("returned", value) or ("raised", exception)
    held_throughout: bool = False  # submitted and answered while the owner thread was held
    after_stop: bool = False  # handed over after stop() had returned

    def __post_init__(self) -> None:
        if self.kind in RAISES:
            self.error = RAISES[self.kind](self.cid)
        elif self.kind == "none":
            self.value = None

    def __call__(self, scheduler: Any) -> Any:
        self.runs += 1
        self.ran_on = threading.current_thread().name
        self.run_order.append(self.cid)
        self.started.set()
        if self.gate is not None and not self.gate.wait(ANSWER_DEADLINE * 4):
            raise AssertionError("the model never released a held command")
        if self.error is not None:
            raise self.error
        return self.value


class Client:
    """A thread that calls the engine, one command after another, as an API worker does."""

    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine
        self.jobs: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self.pending = 0  # handed over and not answered yet (the model's thread reads it)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"client-{index}", daemon=True)
        self.thread.start()

    @property
    def idle(self) -> bool:
        with self.lock:
            return self.pending == 0

    def submit(self, command: Command) -> None:
        with self.lock:
            self.pending += 1
        self.jobs.put(command)

    def _run(self) -> None:
        while (command := self.jobs.get()) is not None:
            try:
                command.outcome = ("returned", self.engine.call(command, command.timeout))
            except BaseException as exc:
                command.outcome = ("raised", exc)
            with self.lock:
                self.pending -= 1
            command.answered.set()

    def close(self) -> None:
        self.jobs.put(None)


def wait_for(predicate, what: str, deadline: float = ANSWER_DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"hung: {what} within {deadline:g} s")
        time.sleep(0.002)


class CommandQueueMachine(RuleBasedStateMachine):
    """The model: the commands handed to clients, the one holding the owner thread, and stop."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.clients: list[Client] = []
        self.commands: list[Command] = []
        self.run_order: list[int] = []
        self.queued_while_held: list[Command] = []  # in the order they entered the queue
        self.ids = itertools.count(1)
        self.held: Command | None = None  # the command holding the owner thread now
        self.gate: threading.Event | None = None
        self.holding = False  # a hold rule ran and was not released (what preconditions read:
        # whether a hold with a short timeout started in time is the machine's, not the model's)
        self.stopped = False
        self.runs_at_stop = 0
        self.steps = 0  # counted by the invariant, so that preconditions read only the model
        self.held_since = 0

    @initialize(workload=st.sampled_from(["none", "paused", "running"]))
    def start(self, workload: str) -> None:
        config = None if workload == "none" else WORKLOAD
        self.engine = Engine(make_scheduler(capacity=512), config, step_interval=0.002)
        if workload == "paused":
            self.engine.pause_workload()
        self.engine.start()
        self.clients = [Client(i, self.engine) for i in range(CLIENTS)]
        COUNTS["examples"] += 1
        COUNTS[f"workload_{workload}"] += 1

    # ----- handing commands over -----

    def _hand_over(self, client: int, kind: str, timeout: float, gate: threading.Event | None = None) -> Command:
        command = Command(next(self.ids), client, kind, timeout, self.run_order, gate=gate)
        command.after_stop = self.stopped
        self.commands.append(command)
        if self.held is not None and not self.stopped:
            # The owner thread is held: the command stays queued. Wait until it is in the queue,
            # so that the order the model records is the order the queue holds.
            before = self.engine.owner.pending()
            self.clients[client].submit(command)
            wait_for(lambda: self.engine.owner.pending() > before or command.answered.is_set(),
                     f"command {command.cid} to be queued")
            if not command.answered.is_set():
                self.queued_while_held.append(command)
        else:
            self.clients[client].submit(command)
        return command

    def _idle_client(self, preferred: int) -> int | None:
        for k in range(CLIENTS):
            index = (preferred + k) % CLIENTS
            if self.clients[index].idle:
                return index
        return None

    @rule(client=st.integers(0, CLIENTS - 1), kind=st.sampled_from(["value", "none", *RAISES]))
    def call_long(self, client: int, kind: str) -> None:
        """A call whose caller waits long enough: it gets its command's answer (or OwnerStopped)."""
        if self.held is not None and (client := self._idle_client(client)) is None:
            return  # while the owner thread is held, only an idle client queues at once
        self._hand_over(client, kind, LONG)
        COUNTS["calls_long"] += 1

    @rule(client=st.integers(0, CLIENTS - 1), kind=st.sampled_from(["value", *RAISES]))
    def call_short(self, client: int, kind: str) -> None:
        """A call with a short timeout: behind a held command it times out and is cancelled."""
        if self.held is not None:
            if (client := self._idle_client(client)) is None:
                return
            command = self._hand_over(client, kind, SHORT)
            wait_for(command.answered.is_set, f"the short call {command.cid} to time out")
            command.held_throughout = self.held is not None and not self.held.gate.is_set()
            COUNTS["calls_short_while_held"] += 1
        else:
            self._hand_over(client, kind, SHORT)
            COUNTS["calls_short"] += 1

    @rule(client=st.integers(0, CLIENTS - 1), timeout=st.sampled_from([0.0005, 0.002, 0.01]))
    def call_racing_its_timeout(self, client: int, timeout: float) -> None:
        """A timeout about as long as the command takes: either answer is right, never both."""
        if self.held is not None:
            if (client := self._idle_client(client)) is None:
                return
            command = self._hand_over(client, "value", timeout)
            wait_for(command.answered.is_set, f"the racing call {command.cid} to time out")
        else:
            self._hand_over(client, "value", timeout)
        COUNTS["calls_racing"] += 1

    @precondition(lambda self: not self.stopped)
    @rule(per_client=st.integers(1, 4), short=st.booleans())
    def burst(self, per_client: int, short: bool) -> None:
        """Every client calls at once, several times: the queue sees them interleaved."""
        if self.held is not None:
            return
        for _ in range(per_client):
            for client in range(CLIENTS):
                self._hand_over(client, "value" if client != 1 else "own_error", SHORT if short else LONG)
        COUNTS["bursts"] += 1

    @precondition(lambda self: not self.holding and not self.stopped)
    @rule(client=st.integers(0, CLIENTS - 1), timeout=st.sampled_from([LONG, SHORT]))
    def hold_the_owner_thread(self, client: int, timeout: float) -> None:
        """A command that blocks the owner thread until released. With a short timeout its caller
        still gets its answer: the command had started, so it is waited for, not cancelled."""
        self.settle()
        gate = threading.Event()
        command = self._hand_over(client, "hold", timeout, gate=gate)
        self.holding = True
        self.held_since = self.steps
        self.gate = gate
        wait_for(lambda: command.started.is_set() or command.answered.is_set(),
                 f"the holding command {command.cid} to start")
        if command.started.is_set():
            self.held = command
            self.queued_while_held = []
            COUNTS["holds"] += 1

    @precondition(lambda self: self.holding and self.steps >= self.held_since + 4)
    @rule()
    def release(self) -> None:
        self.gate.set()
        self.held = None
        self.holding = False
        COUNTS["releases"] += 1

    @precondition(lambda self: not self.holding)
    @rule()
    def settle(self) -> None:
        """Wait for every answer, then check what only a quiet queue shows."""
        for command in self.commands:
            wait_for(command.answered.is_set, f"an answer to command {command.cid} ({command.kind})")
        self.check_answers()
        self.check_queue_order()
        if not self.stopped:
            probe = object()
            assert self.engine.call(lambda s: probe, LONG) is probe  # exceptions did not kill it
            assert self.engine.alive

    @precondition(lambda self: not self.stopped and self.holding and self.steps >= self.held_since + 3)
    @rule()
    def stop_while_held(self) -> None:
        """Stop while a command holds the owner thread: stop() cannot wait for it, yet refuses
        every new call and fails every queued one at once."""
        self.stop()

    @precondition(lambda self: not self.stopped and self.steps >= 8)
    @rule()
    def stop(self) -> None:
        """Stop the engine, held or not; a held command finishes, nothing queued starts."""
        held = self.held
        waiting = [c for c in self.queued_while_held if held is not None and not c.answered.is_set()]
        self.engine.stop(timeout=0.2 if held is not None else 10.0)
        self.stopped = True
        self.runs_at_stop = len(self.run_order)
        COUNTS["stops_while_held" if held is not None else "stops"] += 1
        # At once, even while the owner thread is still inside the held command:
        for client in range(CLIENTS):
            if self.clients[client].idle:
                late = self._hand_over(client, "value", LONG)
                wait_for(late.answered.is_set, "a call after stop() to be refused", REFUSAL_DEADLINE)
                assert late.outcome[0] == "raised" and isinstance(late.outcome[1], OwnerStopped), late.outcome
        with pytest.raises(OwnerStopped):
            self.engine.call(lambda s: None, REFUSAL_DEADLINE)
        for command in waiting:  # stop() failed what was queued behind the held command
            wait_for(command.answered.is_set, f"queued command {command.cid} to hear of the stop")
            assert isinstance(command.outcome[1], OwnerStopped), command.outcome
        if self.holding:
            self.release()

    # ----- the model's checks -----

    @invariant()
    def ran_at_most_once_on_the_owner_thread(self) -> None:
        self.steps += 1
        for command in self.commands:
            assert command.runs <= 1, f"command {command.cid} ran {command.runs} times"
            assert command.ran_on in (None, "radixtop-engine")
        if self.stopped:
            assert len(self.run_order) == self.runs_at_stop, "a command started after stop() returned"

    def check_answers(self, count: bool = False) -> None:
        for c in self.commands:
            if not c.answered.is_set():
                continue
            how, what = c.outcome
            if how == "returned":
                assert c.runs == 1 and what is c.value, (c.cid, c.kind, what)
                answer = "returned"
            elif c.error is not None and what is c.error:
                assert c.runs == 1
                answer = "own_exception"
            elif isinstance(what, OwnerTimeout):
                assert c.runs == 0, f"command {c.cid} timed out before starting, then ran"
                assert c.timeout != LONG, f"command {c.cid} timed out with a long timeout"
                answer = "timed_out"
            elif isinstance(what, OwnerStopped):
                assert c.runs == 0, f"command {c.cid} was refused for the stop, yet ran"
                answer = "stopped"
            else:
                raise AssertionError(f"command {c.cid} ({c.kind}) got someone else's answer: {what!r}")
            if c.held_throughout:  # queued behind a held command for its whole timeout
                assert isinstance(what, OwnerTimeout), (c.cid, what)
            if c.after_stop:
                assert isinstance(what, OwnerStopped), (c.cid, what)
            if c.kind == "hold" and c.runs:
                assert how == "returned", (c.cid, what)  # started: waited for, whatever its timeout
            if count:
                COUNTS[f"answers_{answer}"] += 1

    def check_queue_order(self) -> None:
        position = {cid: k for k, cid in enumerate(self.run_order)}
        for client in range(CLIENTS):
            ran = [position[c.cid] for c in self.commands if c.client == client and c.runs]
            assert ran == sorted(ran), f"client {client}'s commands ran out of order"
        queued = [position[c.cid] for c in self.queued_while_held if c.runs]
        assert queued == sorted(queued), "commands ran out of their queue order"

    def teardown(self) -> None:
        if self.engine is None:
            return
        if self.holding:
            self.release()
        self.engine.stop(timeout=ANSWER_DEADLINE)
        for command in self.commands:
            wait_for(command.answered.is_set, f"an answer to command {command.cid} after the last stop")
        self.check_answers(count=True)
        self.check_queue_order()
        assert not self.engine.alive
        for command in self.commands:  # a cancelled command never runs later, even at the end
            if command.outcome[0] == "raised" and isinstance(command.outcome[1], (OwnerTimeout, OwnerStopped)) \
                    and command.outcome[1] is not command.error:
                assert command.runs == 0
        for client in self.clients:
            client.close()
        for client in self.clients:
            client.thread.join(ANSWER_DEADLINE)
            assert not client.thread.is_alive(), "a caller is still waiting after the engine stopped"
        COUNTS["commands"] += len(self.commands)


COUNTS: dict[str, int] = {}
for _name in ("examples", "commands", "calls_long", "calls_short", "calls_short_while_held", "calls_racing",
              "bursts", "holds", "releases", "stops", "stops_while_held", "answers_returned",
              "answers_own_exception", "answers_timed_out", "answers_stopped", "workload_none",
              "workload_paused", "workload_running"):
    COUNTS[_name] = 0

TestCommandQueue = CommandQueueMachine.TestCase
TestCommandQueue.settings = settings(max_examples=80, stateful_step_count=30, deadline=None,
                                     derandomize=True, database=None,
                                     suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    """One JSON line of what the model exercised (also to $RADIXTOP_SECURITY_REPORT, appended)."""
    yield
    line = json.dumps({"module": "test_command_queue", **COUNTS}, separators=(",", ":"))
    print("\n" + line)
    if path := os.environ.get("RADIXTOP_SECURITY_REPORT"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


# ----- reads bounded, actions first (a flood of tokenless reads must not starve the engine) -----


def _queue_from_threads(owner: OwnerQueue, calls: list[tuple[Any, bool]]) -> list[threading.Thread]:
    """Each ``(fn, urgent)`` queued from a thread of its own, in order; returns once all wait."""
    threads = []
    for fn, urgent in calls:
        t = threading.Thread(target=owner.call, args=(fn, 10.0), kwargs={"urgent": urgent}, daemon=True)
        t.start()
        threads.append(t)
        while owner.pending() < len(threads):
            time.sleep(0.001)
    return threads


def test_actions_and_health_run_ahead_of_queued_reads():
    owner = OwnerQueue("test owner")
    order: list[str] = []
    threads = _queue_from_threads(owner, [(lambda k=k: order.append(f"read{k}"), False) for k in range(3)]
                                  + [(lambda: order.append("evict"), True)])
    owner.between_steps(idle=True)
    for t in threads:
        t.join(5)
    assert order == ["evict", "read0", "read1", "read2"]


def test_a_busy_owner_gives_reads_a_bounded_slice_per_step_and_a_share_overall():
    owner = OwnerQueue("test owner")
    ran: list[int] = []

    def read(k: int) -> None:
        time.sleep(0.002)
        ran.append(k)

    threads = _queue_from_threads(owner, [(lambda k=k: read(k), False) for k in range(20)])
    owner.between_steps()  # a busy owner's step: reads until READ_BUDGET_S is spent
    first = len(ran)
    assert 1 <= first <= READ_BUDGET_S // 0.002 + 1
    owner.between_steps()  # at once again: the reads had their share of the owner for now
    assert len(ran) == first
    urgent = _queue_from_threads(owner, [(lambda: ran.append(-1), True)])
    owner.between_steps()  # an action is never held back by the reads' share
    assert ran[-1] == -1
    owner.between_steps(idle=True)  # an idle owner has time for them all
    assert sorted(k for k in ran if k >= 0) == list(range(20))
    for t in threads + urgent:
        t.join(5)


class _NoEmptyGets(queue.SimpleQueue):
    """A call queue that fails a get on an empty queue: raising queue.Empty costs ~10 us of the
    owner, on every step, when nothing waits (most of them)."""

    def get_nowait(self):
        if self.empty():
            raise AssertionError("get_nowait on an empty queue")
        return super().get_nowait()


def test_a_step_with_nothing_to_do_touches_no_queue_and_still_marks_the_owner():
    owner = OwnerQueue("test owner")
    owner._queue, owner._urgent = _NoEmptyGets(), _NoEmptyGets()
    assert owner.between_steps() == 0 and owner.between_steps(idle=True) == 0
    assert owner.last_drain is not None and owner._owner == threading.get_ident()
    threads = _queue_from_threads(owner, [(lambda: 1, False), (lambda: 2, True)])
    assert owner.between_steps(idle=True) == 2
    for t in threads:
        t.join(5)


def test_a_busy_owners_step_holds_reads_and_passes_to_one_budget_with_the_gc_off():
    """Queued reads and the passes' slices share one hold per step (HOLD_S): a pass gets what
    the reads left, at least one of its steps (so it is never starved), and the cyclic GC does
    not run inside the hold."""
    import gc

    from radixtop.gpu_backend.owner.queue import HOLD_S

    owner = OwnerQueue("test owner")
    owner.slices.duty = 1.0  # no share between steps: only the hold's budget is under test
    steps_run: list[bool] = []

    def a_pass():
        for _ in range(1000):
            steps_run.append(gc.isenabled())
            time.sleep(0.0005)
            yield

    owner.slices.add(a_pass())
    threads = _queue_from_threads(owner, [(lambda: time.sleep(HOLD_S * 2), False)])
    owner.between_steps()  # a read that takes the whole budget: the pass still runs one step
    assert len(steps_run) == 1
    started = time.perf_counter()
    owner.between_steps()
    held = time.perf_counter() - started
    assert 2 <= len(steps_run) <= HOLD_S / 0.0005 + 2  # the pass had the hold, and stopped at it
    assert held < HOLD_S * 20  # not a timed goal: only that it stopped (a loaded machine is slow)
    assert not any(steps_run) and gc.isenabled()
    for t in threads:
        t.join(5)


def test_no_collection_starts_inside_a_busy_step():
    """The cyclic GC is off for the whole of a step that has work, from its first allocation:
    with a collection due at every allocation, none starts inside the step (a context manager
    made at its start set one off: 3-5 ms of a 100k-node tree's scheduler)."""
    import gc

    owner = OwnerQueue("test owner")
    owner.slices.add(iter(range(3)))
    inside: list[bool] = []
    in_step = [False]

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            inside.append(in_step[0])

    step = owner.step

    def traced() -> int:
        in_step[0] = True
        try:
            return step()
        finally:
            in_step[0] = False

    threshold = gc.get_threshold()
    gc.callbacks.append(record)
    gc.set_threshold(1)
    try:
        traced()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(record)
    assert not any(inside)


def test_a_read_starts_only_where_one_as_long_as_the_longest_of_late_fits_the_budget(monkeypatch):
    """Reads run until their budget is spent, but the next starts only where a read as long as
    the longest of late would end within it (the first always runs): with 1.5 ms reads and a
    2 ms budget, one read per step, not two (a hold of 3 ms)."""
    import radixtop.gpu_backend.owner.queue as owner_module

    class Clock:
        now = 50.0

        def perf_counter(self) -> float:
            return self.now

        def monotonic(self) -> float:
            return time.monotonic()

    clock = Clock()
    owner = OwnerQueue("test owner")
    ran: list[int] = []

    def read(k: int) -> None:
        clock.now += 0.0015
        ran.append(k)

    threads = _queue_from_threads(owner, [(lambda k=k: read(k), False) for k in range(6)])
    monkeypatch.setattr(owner_module, "time", clock)
    assert owner.drain(read_budget=0.002) == 1
    assert owner.drain(read_budget=0.002) == 1
    assert owner.drain(read_budget=0.004) == 2  # 1.5 + 1.5 ms fit in 4 ms; a third would not
    monkeypatch.undo()
    owner.drain()
    for t in threads:
        t.join(5)
    assert ran == list(range(6))


def test_the_names_before_0_2_still_work_for_one_release():
    """What docs/sglang.md showed embedders before 0.2 (radixtop.gpu_backend.owner_queue's
    OwnerQueue, its step(), SGLangAdapter, an adapter's close()) still works, as aliases."""
    from radixtop.adapters.base import CacheAdapter
    from radixtop.adapters.events.zmq import KVEventsAdapter
    from radixtop.adapters.sglang.inproc import SGLangAdapter, SGLangInProcessAdapter
    from radixtop.adapters.sglang.kv_events import KvEventsAdapter
    from radixtop.gpu_backend.owner import queue
    from radixtop.gpu_backend.owner_queue import OwnerQueue as Old
    from tests.dashboard.test_snapshots import stats

    assert Old is queue.OwnerQueue and Old.step is Old.between_steps and Old.call_steps is Old.call_pass
    assert SGLangAdapter is SGLangInProcessAdapter and KvEventsAdapter is KVEventsAdapter
    st = stats(1)
    assert (st.free_tokens, st.free_bytes, st.running_tokens) == (
        st.available_tokens, st.available_bytes, st.session_held_tokens + st.uncached_tokens)
    released = []

    class Target(CacheAdapter):  # a face calls release(); the old name still calls it
        def release(self):
            released.append("release")

    class OldTarget(CacheAdapter):  # written before 0.2: its close() is what release() runs
        def close(self):
            released.append("close")

    for cls in (Target, OldTarget):
        cls.__abstractmethods__ = frozenset()
    Target().close()
    OldTarget().release()
    assert released == ["release", "close"]
